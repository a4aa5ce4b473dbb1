#!/usr/bin/env bash
# Prepare, on a machine WITH network, the wheel folder a bare GPU node WITHOUT network needs to run
# bertforge and `make gpu-check`. Such a node (a CUDA container image) typically already has
# Python 3.12 with torch (CUDA), triton, transformers, tokenizers, safetensors, numpy, accelerate
# and pytest; this folder brings the rest. Install on the node with:
#
#   python3 -m pip install --no-index --find-links gpu_wheels -r gpu_wheels/requirements.txt
#
# usage: scripts/prepare_gpu_wheels.sh [--dry-run] [OUT_DIR]      (default OUT_DIR: gpu_wheels)
#   --dry-run          print the pip commands instead of running them
# environment:
#   PYTHON             the python whose pip downloads (default: python3); any version works,
#                      the wheels are chosen for the node's PYTHON_VERSION and PLATFORMS
#   PYTHON_VERSION     the node's Python (default: 3.12)
#   PLATFORMS          the node's wheel platforms (default: manylinux x86_64; for ARM nodes such
#                      as GH200: "manylinux_2_28_aarch64 manylinux_2_17_aarch64 manylinux2014_aarch64")
set -euo pipefail

DRY=0
if [[ "${1:-}" == "--dry-run" ]]; then DRY=1; shift; fi
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then sed -n '2,18p' "$0"; exit 0; fi
OUT="${1:-gpu_wheels}"
PYTHON="${PYTHON:-python3}"
PYTHON_VERSION="${PYTHON_VERSION:-3.12}"
PLATFORMS="${PLATFORMS:-manylinux_2_28_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64}"
ABI="cp${PYTHON_VERSION/./}"

# The versions the test suite passes with (torch 2.13, transformers 5.24). With their
# dependencies, except torch/triton, which the node has and which must not be replaced.
WITH_DEPS=(
  "datasets==5.2.0" "rjieba==0.2.2" "hjson==3.1.0" "zstandard==0.25.0" "pyarrow==26.0.1"
  "tensorboard==2.21.0" "matplotlib==3.11.2" "psutil==7.2.2" "tqdm>=4.66" "ninja==1.13.2"
  # deepspeed's own requirements (it is installed without its dependency on torch)
  "msgpack==1.2.4" "py-cpuinfo==9.0.0" "pydantic==2.13.4" "einops==0.8.2" "nvidia-ml-py"
  "packaging" "pytest-timeout==2.4.0"
)
# These require torch and triton: downloaded without dependencies.
NO_DEPS=("liger-kernel==0.8.5")
# DeepSpeed ships as an sdist: build a pure-Python wheel (no ops precompiled: DS_BUILD_OPS=0;
# the few ops a run needs compile just in time on the node, with its CUDA toolkit and ninja).
DEEPSPEED="deepspeed==0.19.8"

platform_flags=()
for p in $PLATFORMS; do platform_flags+=(--platform "$p"); done
target=(--only-binary=:all: --python-version "$PYTHON_VERSION" --implementation cp
        --abi "$ABI" --abi abi3 --abi none "${platform_flags[@]}")

run() {
  echo "+ $*"
  if [[ $DRY == 0 ]]; then "$@"; fi
}

run mkdir -p "$OUT"
run "$PYTHON" -m pip download --dest "$OUT" "${target[@]}" "${WITH_DEPS[@]}"
run "$PYTHON" -m pip download --dest "$OUT" --no-deps "${target[@]}" "${NO_DEPS[@]}"
run env DS_BUILD_OPS=0 "$PYTHON" -m pip wheel --no-deps --no-cache-dir --wheel-dir "$OUT" \
  "$DEEPSPEED"

# The install list: every top-level package above, by name (versions come from the folder).
reqs=("${WITH_DEPS[@]}" "${NO_DEPS[@]}" "$DEEPSPEED")
if [[ $DRY == 0 ]]; then
  printf '%s\n' "${reqs[@]}" > "$OUT/requirements.txt"
  echo "wrote $(ls "$OUT" | grep -c '\.whl$') wheels and $OUT/requirements.txt"
  echo "on the node: python3 -m pip install --no-index --find-links $OUT -r $OUT/requirements.txt"
else
  echo "+ write $OUT/requirements.txt: ${reqs[*]}"
fi
