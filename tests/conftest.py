"""Shared fixtures: real text that ships with the project or with CPython (never ../shared)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Keep every process (and DeepSpeed's ranks) from oversubscribing the 2 cores of CI.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch
from helpers.commands import DATA
from helpers.shards import build_shards

from bertforge.data_prep.sample_corpus import pydoc_documents, write_english_corpus  # noqa: F401 (re-exported)
from bertforge.kernels.api import enable_interpreter_without_cuda
from bertforge.pretrain.distributed.op_builds import use_environment_folder

# DeepSpeed's ops (the CPU all-reduce) come from this environment's build folder, the one
# `make install` built, also for tests that start DeepSpeed without the trainer (in this process,
# or `python -c` children): torch's default folder would be a second, unbuilt one, and its first
# build (about a minute on 2 cores) would hold its lock while other tests wait on it.
use_environment_folder()

# The device the kernel tests run on: CUDA tensors and the compiled Triton kernel where torch sees
# a GPU; CPU tensors under Triton's interpreter elsewhere. The interpreter must be chosen before
# triton is first imported (DeepSpeed imports it too), and only when no CUDA device is usable.
TRITON_INTERPRETING = enable_interpreter_without_cuda()
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture(autouse=True)
def launcher_variables_stay_put():
    """A one-process run in a test's own process sets MASTER_PORT (and the rest) in os.environ
    while its store stays up for the session: every later launch from this worker inherited
    that port and failed with EADDRINUSE. Each test leaves the variables as it found them."""
    from bertforge.pretrain.distributed.startup import LAUNCHER_VARS

    before = {key: os.environ.get(key) for key in LAUNCHER_VARS}
    yield
    for key, value in before.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="session")
def device() -> torch.device:
    """Where kernel tests put their tensors: "cuda" on a GPU node, "cpu" (interpreter) elsewhere."""
    return DEVICE


@pytest.fixture(scope="session")
def english_corpus(tmp_path_factory) -> Path:
    return write_english_corpus(tmp_path_factory.mktemp("corpus_en") / "pydoc_topics.txt")


@pytest.fixture(scope="session")
def chinese_corpus() -> Path:
    """~30 KB of 《红楼梦》 (public domain), one paragraph a line."""
    return DATA / "zh_hongloumeng_sample.txt"


@pytest.fixture(scope="session")
def english_shards(tmp_path_factory, english_corpus) -> Path:
    """Packed shards of the pydoc corpus with a small trained WordPiece vocabulary."""
    return build_shards(english_corpus, tmp_path_factory.mktemp("shards_en") / "shards")


@pytest.fixture(scope="session")
def english_nsp_shards(tmp_path_factory, english_corpus) -> Path:
    out = tmp_path_factory.mktemp("shards_en_nsp") / "shards"
    return build_shards(english_corpus, out, format="nsp")


@pytest.fixture(scope="session")
def chinese_shards(tmp_path_factory, chinese_corpus) -> Path:
    out = tmp_path_factory.mktemp("shards_zh") / "shards"
    return build_shards(chinese_corpus, out, one_doc_per_line=True, vocab_size=3000)


@pytest.fixture
def one_rank_group(monkeypatch):
    """A one-process gloo group (DeepSpeed in-process on one rank).

    Started once and kept for the rest of the session: DeepSpeed caches the group it adopts, so
    a destroyed and re-created group breaks the next ``deepspeed.initialize`` in this process.
    """
    import deepspeed
    import torch.distributed as dist

    from bertforge.pretrain.distributed.startup import free_port

    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")):
        monkeypatch.setenv(key, value)  # deepspeed.initialize reads them
    if not dist.is_initialized():
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
        )
    deepspeed.init_distributed(dist_backend="gloo")


@pytest.fixture(scope="session")
def english_second_source(tmp_path_factory, english_shards) -> Path:
    """A second build (the last 30 pydoc pages) sharing english_shards' tokenizer: a second
    source of a mixture, or a phase's new data."""
    folder = tmp_path_factory.mktemp("second_source")
    text = folder / "pages.txt"
    text.write_text(
        "".join(
            "\n".join(line for line in d.splitlines() if line.strip()) + "\n\n"
            for d in pydoc_documents()[-30:]
        ),
        encoding="utf-8",
    )
    return build_shards(
        text,
        folder / "shards",
        tokenizer=str(english_shards / "tokenizer"),
        validation_fraction=0.1,
        workers=1,
    )


@pytest.fixture(scope="session")
def english_many_shards(tmp_path_factory, english_corpus, english_shards) -> Path:
    """The pydoc corpus re-cut into documents of about 2,000 characters, in about 28 training
    shards of 8 documents each (so of about one size) with english_shards' tokenizer: a folder
    many times a small shard cache, for object storage and the window order."""
    folder = tmp_path_factory.mktemp("shards_en_many")
    lines = [ln for ln in english_corpus.read_text(encoding="utf-8").splitlines() if ln.strip()]
    docs, doc = [], []
    for line in lines:
        doc.append(line)
        if sum(map(len, doc)) >= 2000:
            docs.append(doc)
            doc = []
    text = folder / "uniform.txt"
    text.write_text("".join("\n".join(d) + "\n\n" for d in docs), encoding="utf-8")
    return build_shards(
        text, folder / "shards", tokenizer=str(english_shards / "tokenizer"), shard_docs=8
    )


# The slowest files, longest first (per-file totals of `--durations=0` in a full run, 3 workers on
# 2 cores, 2026-12-07; those over a minute): under --dist loadfile a file stays on one worker,
# and a long file handed out last leaves the others idle at the end (longest first keeps them
# busy; order within a file is kept).
SLOW_FILES_FIRST = (
    "tests/e2e/test_two_rank_training.py",
    "tests/e2e/test_rtd_training.py",
    "tests/e2e/test_chaos_kills.py",
    "tests/e2e/test_phase_plan_training.py",
    "tests/pretrain/evaluate/test_glue_parity.py",
    "tests/e2e/test_object_storage_training.py",
    "tests/pretrain/schedule/test_batch_ramp.py",
    "tests/benchmarks/test_gpu_check.py",
    "tests/pretrain/test_demo.py",
    "tests/e2e/test_modernbert_features.py",
    "tests/e2e/test_zero3_bf16_preemption.py",
    "tests/e2e/test_slurm.py",  # its jobs run beside other files' tests
    "tests/experiments/test_domain_gain.py",
    "tests/e2e/test_signal_any_moment.py",
    "tests/experiments/test_schedules.py",
    "tests/benchmarks/test_modernbert_bench.py",
    "tests/experiments/test_budget_levers.py",
    "tests/e2e/test_many_ranks.py",
    "tests/e2e/test_downstream_during_training.py",
    "tests/pretrain/test_doctor.py",
    "tests/experiments/test_downstream_gain.py",
    "tests/pretrain/stability/test_guard.py",
    "tests/experiments/test_mlm_vs_rtd.py",
    "tests/pretrain/model/test_share_layers.py",
    "tests/benchmarks/test_learning_per_hour.py",
    "tests/pretrain/export/test_outside_clients.py",
    "tests/e2e/test_mixture_training.py",
    "tests/pretrain/evaluate/test_evaluate.py",
    "tests/e2e/test_nsp_bf16_interrupt_resume.py",
    "tests/benchmarks/test_kernel_speed.py",
    "tests/e2e/test_group_sigterm_preemption.py",
    "tests/e2e/test_rank_watchdog.py",
    "tests/bertforge/test_namespace.py",
    "tests/e2e/test_validation_world_size.py",
    "tests/e2e/test_sop_training.py",
    "tests/e2e/test_resume_on_more_ranks.py",
    "tests/data_prep/test_remote_build.py",
    "tests/e2e/test_rollback_across_world_sizes.py",
    "tests/e2e/test_deepspeed_habits.py",
    "tests/e2e/test_multihost.py",
    "tests/e2e/test_launch_checks.py",
    "tests/e2e/test_modernbert_training.py",
    "tests/pretrain/checkpoints/test_checkpoint_faults.py",
    "tests/pretrain/model/test_init_from.py",
    "tests/data_prep/test_build_fuzz.py",
    "tests/pretrain/schedule/test_anneal.py",
)


def pytest_collection_modifyitems(config, items):
    rank = {path: i for i, path in enumerate(SLOW_FILES_FIRST)}
    order = sorted(
        enumerate(items), key=lambda p: (rank.get(p[1].nodeid.split("::")[0], len(rank)), p[0])
    )
    items[:] = [item for _, item in order]
