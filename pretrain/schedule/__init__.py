"""What changes over a run on config/schedule.py's lr: phases, time budget, annealing, LambdaLR."""
