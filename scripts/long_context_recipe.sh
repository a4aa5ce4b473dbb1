#!/usr/bin/env bash
# The long-context recipe of docs/model.md ("Long context"), line for line
# (tests/docs/test_readme_and_sample_outputs.py keeps the two equal): `make demo` first (its
# corpus and tokenizer), then `bash scripts/long_context_recipe.sh` from the repository root.
set -euo pipefail
rm -rf runs/long  # the recipe starts afresh in its own folder (a rerun would resume or refuse)
mkdir -p runs/long
# --- the recipe, as docs/model.md prints it ---
export OMP_NUM_THREADS=1
CORPUS=${CORPUS:-runs/demo/corpus/pydoc_topics.txt}    # your text: long documents
TOKENIZER=${TOKENIZER:-runs/demo/shards/tokenizer}     # any tokenizer folder
# 1. the same text in sequences of 1,024 and of 8,192 tokens, one tokenizer
for len in 1024 8192; do
    bertforge prep build --input $CORPUS --tokenizer $TOKENIZER --output runs/long/s$len \
        --max_seq_len $len --validation_fraction 0.1
done
# 2. pretrain a ModernBERT at 1,024 tokens with a global rope theta of 10k (ModernBERT's first phase)
bertforge train --data runs/long/s1024 --arch modernbert --global_rope_theta 10000 \
    --output_dir runs/long/short --max_steps 200 --lr 2e-3 --global_batch_size 8 \
    --micro_batch_size 8 --eval_interval 100 --progress false
# 3. context extension: continue it on the 8,192-token sequences with a global theta of 160k;
#    the first validation (lr 0, one step) scores the 1,024-token model on them before any update
bertforge train --data runs/long/s8192 --arch modernbert --init_from runs/long/short \
    --global_rope_theta 160000 --output_dir runs/long/before --max_steps 1 --lr 0 \
    --global_batch_size 2 --micro_batch_size 1 --eval_interval 1 --progress false
bertforge train --data runs/long/s8192 --arch modernbert --init_from runs/long/short \
    --global_rope_theta 160000 --output_dir runs/long/long --max_steps 40 --lr 1e-3 \
    --global_batch_size 2 --micro_batch_size 1 --eval_interval 20 --progress false
# 4. export: a ModernBertForMaskedLM folder (max_position_embeddings 8192, global theta 160k)
bertforge export runs/long/long --output runs/long/hf_model
bertforge attention runs/long/hf_model --out runs/long/attention --heads 0 \
    --text "A token of a local layer sees 128 tokens around it; a global layer sees all of them."
