"""What the trainer is made of: checkpoints, metrics, guard, budget, optimizer, jobs."""
