# Two commands on a fresh machine:  `make demo` (the main job) and `make test` (the test suite).
PYTHON ?= python3
PIP ?= $(PYTHON) -m pip
# The tested versions (constraints.txt): every install is constrained to them; `make install
# CONSTRAINTS=` installs without (the doctor then warns of each version that differs).
CONSTRAINTS ?= constraints.txt
CONSTRAINT_FLAG := $(if $(CONSTRAINTS),-c $(CONSTRAINTS),)
TORCH_VERSION ?= $(shell sed -n 's/^torch==//p' constraints.txt)
# On a machine without a GPU and without a local wheel cache, point pip at PyTorch's CPU index:
#   make demo TORCH_INDEX=https://download.pytorch.org/whl/cpu
TORCH_INDEX ?=
TORCH_INDEX_FLAG := $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX),)
DEMO_DIR ?= runs/demo
# More flags for the demo (tests/pretrain/test_demo.py runs it with --steps 20).
DEMO_ARGS ?=

.PHONY: install demo test test-fast test-latest bench lint format

# CPU torch first (unless a torch is already installed, e.g. a CUDA build on a GPU node), so the
# project's torch requirement is already satisfied and never pulls a CUDA build; constraints.txt
# says torch==X without a local label, which 2.13.0+cpu (and +cuXXX) satisfies. A GPU node whose
# torch is a later 2.x than the tested one: `make install CONSTRAINTS=` keeps it (the doctor then
# warns that it is untested).
# DeepSpeed's JIT ops (the CPU all-reduce; fused_adam on GPUs) are built once here, into this
# environment's own build folder, not by the first run (docs/launching.md, "op builds"). The ops of
# the config a machine runs: zero2.json's on a GPU node, cpu.json's (torch's AdamW) elsewhere.
OPS_CONFIG ?= $(shell $(PYTHON) -c "import torch; print('ds_configs/' + ('zero2' if torch.cuda.is_available() else 'cpu') + '.json')" 2>/dev/null || echo ds_configs/cpu.json)
install:
	@$(PYTHON) -c "import torch" 2>/dev/null || $(PIP) install $(CONSTRAINT_FLAG) "torch==$(TORCH_VERSION)+cpu" $(TORCH_INDEX_FLAG)
	$(PIP) install -q $(CONSTRAINT_FLAG) -e ".[dev]"
	$(PYTHON) -m pretrain.doctor --build_ops --ds_config $(OPS_CONFIG)

# INSTALL= skips the install step (.ci/run: `make lint` has just installed).
INSTALL ?= install
demo: $(INSTALL)
	$(PYTHON) -m pretrain.demo --output_dir $(DEMO_DIR) $(DEMO_ARGS)

# Three workers, a test file per worker at a time (module fixtures built once; the suite's measured
# time is in the README's "Tests and lint"). Three on 2 cores: most tests wait on processes they
# started; with three the cores stayed 97-100% busy (sampled each minute) and the full suite took
# 1,545 s against 1,709 s with two (2026-12-04). TEST_WORKERS=0 runs everything in this process.
# The 25 slowest tests are listed at the end: CI's budget for .ci/run is spent there.
TEST_WORKERS ?= 3
test: $(INSTALL)
	$(PYTHON) -m pytest -q --durations=25 $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile) tests

# The day-to-day lane: no runs of the trainer, doctor or DeepSpeed as processes (the `slow` mark),
# no end-to-end or benchmark folders; under 4 minutes on 2 cores.
FAST_TESTS ?= -m "not slow" --ignore=tests/e2e --ignore=tests/benchmarks
test-fast: $(INSTALL)
	$(PYTHON) -m pytest -q --durations=10 -n $(TEST_WORKERS) --dist loadfile $(FAST_TESTS) tests

# The newest versions pyproject.toml admits, without constraints.txt, in a fresh environment: the
# quick tests and the multi-process runs that check the namespace and a 2-rank job. torch stays the
# CPU build of constraints.txt (the newest torch PyPI serves is a multi-GB CUDA build). The
# versions it resolved are written to $(LATEST_ENV)/versions.txt: pyproject.toml's upper bounds are
# what this passed.
LATEST_ENV ?= runs/latest-env
LATEST_SLOW_TESTS ?= tests/bertforge/test_namespace.py tests/e2e/test_resume_on_more_ranks.py
test-latest:
	rm -rf $(LATEST_ENV) && $(PYTHON) -m venv $(LATEST_ENV)
	$(LATEST_ENV)/bin/python -m pip install -q "torch==$(TORCH_VERSION)+cpu" $(TORCH_INDEX_FLAG)
	$(LATEST_ENV)/bin/python -m pip install -q --upgrade --upgrade-strategy eager -e ".[dev]"
	$(LATEST_ENV)/bin/python -m pip freeze --exclude-editable > $(LATEST_ENV)/versions.txt
	$(MAKE) --no-print-directory test-fast INSTALL= PYTHON=$(abspath $(LATEST_ENV))/bin/python
	$(LATEST_ENV)/bin/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile $(LATEST_SLOW_TESTS)

# The many-rank test at a cluster's world size: 16 local ranks (2 nodes x 8 GPUs) train ZeRO-3,
# save, and the checkpoint resumes on 2 (`make test` runs it at 4 ranks, for CI's time budget).
# 94 s on the 2-core machine, idle (2026-12-06); it needs about 10 GiB of memory.
MANY_RANKS ?= 16
.PHONY: test-many-ranks
test-many-ranks: $(INSTALL)
	BERTFORGE_TEST_RANKS=$(MANY_RANKS) $(PYTHON) -m pytest -q -p no:randomly tests/e2e/test_many_ranks.py

# A real SLURM for tests/e2e/test_slurm.py: Debian's slurm-wlm and munge, installed when missing
# where apt-get works as root (.ci/run runs this before `make test`); elsewhere it says why not and
# the SLURM tests skip with the reason. The tests start their own munged, slurmctld and slurmd.
SLURM_PACKAGES ?= slurm-wlm munge
.PHONY: slurm-packages test-slurm
slurm-packages:
	@if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null; then \
	  echo "slurm-packages: found $$(slurmctld -V)"; \
	elif [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then \
	  echo "slurm-packages: not installed (needs root and apt-get): the SLURM tests will skip"; \
	else \
	  export DEBIAN_FRONTEND=noninteractive; \
	  (apt-get update -qq && apt-get install -y -qq --no-install-recommends $(SLURM_PACKAGES) >/dev/null) \
	    && echo "slurm-packages: installed $$(slurmctld -V)" \
	    || echo "slurm-packages: apt-get failed: the SLURM tests will skip"; \
	fi

# The SLURM scripts of docs/launching.md and docs/data.md on that SLURM (208 CPU-seconds, 3-4
# minutes on the shared 2-core machine; `make test` runs the same file).
test-slurm: $(INSTALL) slurm-packages
	$(PYTHON) -m pytest -q -rs --durations=5 tests/e2e/test_slurm.py

# One formatter and linter (ruff, settings in pyproject.toml); CI fails on a finding.
lint: install
	$(PYTHON) -m ruff check .
	$(PYTHON) -m ruff format --check .
	PYTHON=$(PYTHON) bash scripts/lint_imports.sh

format: install
	$(PYTHON) -m ruff check --fix .
	$(PYTHON) -m ruff format .

# Validate a GPU node and measure every GPU claim in <= 8 minutes on one H100/H200
# (docs/gpu_check.md). No install step: GPU nodes are often offline, the wheels come prepared.
GPU_CHECK_OUT ?= runs/gpu_check
.PHONY: gpu-check
gpu-check:
	$(PYTHON) -m benchmarks.gpu_check --out $(GPU_CHECK_OUT) $(GPU_CHECK_FLAGS)

# Rerun the command behind every sample output pasted in README.md and docs/*.md and paste what it
# prints now (`<!-- output: COMMAND -->` markers; scripts/refresh_docs.py --check only reports).
# The blocks marked slow need `make demo` first; DOCS_FLAGS=--fast leaves them out.
.PHONY: docs
docs:
	$(PYTHON) scripts/refresh_docs.py $(DOCS_FLAGS)
