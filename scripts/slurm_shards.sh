#!/bin/bash
#SBATCH --job-name=shards
#SBATCH --array=0-15
#SBATCH --cpus-per-task=32
#SBATCH --time=12:00:00
#SBATCH --output=%x-%A_%a.log
ARGS="--input /shared/corpus/ --output /shared/shards --vocab_size 30522 --max_seq_len 128"
srun bertforge prep build $ARGS --workers $SLURM_CPUS_PER_TASK \
    --num_partitions $SLURM_ARRAY_TASK_COUNT --partition $SLURM_ARRAY_TASK_ID
