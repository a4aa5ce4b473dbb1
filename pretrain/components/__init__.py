"""What the training step loop is made of besides its concept homes: metrics, console, EMA, jobs."""
