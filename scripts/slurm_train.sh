#!/bin/bash
#SBATCH --job-name=bert-base
#SBATCH --nodes=4
#SBATCH --ntasks-per-node=8
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=8
#SBATCH --time=24:00:00
#SBATCH --signal=USR1@120
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=%x-%j.log

export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export MASTER_PORT=$((20000 + SLURM_JOB_ID % 20000))
export OMP_NUM_THREADS=$SLURM_CPUS_PER_TASK
ARGS="--ds_config ds_configs/zero2.json --data /shared/shards --model base --output_dir /shared/runs/base"
echo "attempt $((${SLURM_RESTART_COUNT:-0} + 1)) of job $SLURM_JOB_ID on $SLURM_JOB_NODELIST, $(date)"

# 1. the doctor once per node (no ssh: each node checks itself for its 8 ranks); exit 1 on a FAIL
srun --nodes=$SLURM_JOB_NUM_NODES --ntasks=$SLURM_JOB_NUM_NODES --ntasks-per-node=1 \
  --kill-on-bad-exit=1 bertforge doctor $ARGS --slots $SLURM_NTASKS_PER_NODE || exit 1
# 2. the job's own batch at 32 ranks, nothing trained; prints
#    {'global_batch_size': 1024, 'micro_batch_size': 32, 'grad_accum': 1}
WORLD_SIZE=$SLURM_NTASKS bertforge train $ARGS --dry-run --json \
  | python -c "import json, sys; print(json.load(sys.stdin)['config']['batch'])" || exit 1
# 3. train: one task per GPU
srun --kill-on-bad-exit=1 bash -c 'RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS LOCAL_RANK=$SLURM_LOCALID \
  exec python pretrain/main.py '"$ARGS"' --resume auto --preemption_signals TERM,INT,USR1'
