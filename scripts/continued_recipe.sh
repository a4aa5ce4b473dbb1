#!/usr/bin/env bash
# The continued-pretraining recipe of docs/continued.md, line for line (tests/docs/test_readme_and_sample_outputs.py keeps the
# two equal): `make demo` first (its runs/demo/hf_model is the base), then `bash
# scripts/continued_recipe.sh` from the repository root (about 4 minutes on 2 CPU cores).
# `make docs` runs it to refresh the output pasted in docs/continued.md.
set -euo pipefail
rm -rf runs/domain  # the recipe starts afresh in its own folder (a rerun would resume or refuse)
mkdir -p runs/domain
# --- the recipe, as docs/continued.md prints it ---
export OMP_NUM_THREADS=1
BASE=runs/demo/hf_model                       # or any HF BERT folder with its tokenizer
# 1. the domain text (no download: docstrings read from the standard library's sources)
python -m data_prep.domain_text --packages email http urllib --output runs/domain/email_http.txt
# 2. domain terms, one per line: each becomes one token and one masking unit
printf '%s\n' charset multipart payload MIME Content-Type Content-Transfer-Encoding \
    quoted-printable base64 "RFC 2822" boundary cookie urlopen HTTPConnection > runs/domain/terms.txt
# 3. extend the base tokenizer: the terms, then frequent domain words it splits into many pieces
bertforge prep extend-tokenizer --tokenizer $BASE --input runs/domain/email_http.txt \
    --terms runs/domain/terms.txt --max_new 200 --output runs/domain/tokenizer
# 4. shards with the extended tokenizer; the terms are kept whole for whole-word masking
bertforge prep build --input runs/domain/email_http.txt --tokenizer runs/domain/tokenizer \
    --protected_terms runs/domain/terms.txt --output runs/domain/shards \
    --max_seq_len 128 --validation_fraction 0.1
# 5. continue pretraining: whole-word masking at a domain mask rate of 20%
bertforge train --data runs/domain/shards --init_from $BASE --output_dir runs/domain/run \
    --whole_word --mask_prob 0.2 --max_steps 300 --lr 1e-3 --warmup_steps 30 \
    --global_batch_size 32 --micro_batch_size 32 --eval_interval 100 --progress false
# 6. export (the extended tokenizer goes with the model), then fill-mask before and after
bertforge export runs/domain/run --output runs/domain/hf_model
cat > runs/domain/sentences.txt <<'TXT'
The [MASK] parameter names the character set of the message body.
A [MASK] message holds several parts separated by a boundary string.
Return the [MASK] of the message: a string, or a list of Message objects.
The server sends a [MASK] that the client returns with each later request.
Open the [MASK], which can be a string or a Request object.
TXT
for model in $BASE runs/domain/hf_model; do       # the demo's general sentences, then the domain's
    echo "$model"; bertforge demo --fill_mask $model
    echo "$model"; bertforge demo --fill_mask $model --sentences runs/domain/sentences.txt
done
