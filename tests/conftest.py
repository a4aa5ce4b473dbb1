"""Shared fixtures: real text that ships with the project or with CPython (never ../shared)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DATA = Path(__file__).resolve().parent / "data"

# Keep every process (and DeepSpeed's ranks) from oversubscribing the 2 cores of CI.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: I001  (after OMP_NUM_THREADS: numpy and torch read it at start)
import torch
from data_prep.sample_corpus import pydoc_documents, write_english_corpus  # noqa: F401 (re-exported)
from kernels.api import enable_interpreter_without_cuda
from pretrain.config import command_line

# The device the kernel tests run on: CUDA tensors and the compiled Triton kernel where torch sees
# a GPU; CPU tensors under Triton's interpreter elsewhere. The interpreter must be chosen before
# triton is first imported (DeepSpeed imports it too), and only when no CUDA device is usable.
TRITON_INTERPRETING = enable_interpreter_without_cuda()
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


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


def content_stream(reader) -> np.ndarray:
    """All tokens of a split of a `data_prep.ShardReader`, in order, every [CLS]/[SEP] removed."""
    special = {reader.special_tokens["cls"], reader.special_tokens["sep"]}
    if not len(reader):
        return np.zeros(0, dtype=np.int64)
    ids = np.concatenate([reader[i].input_ids for i in range(len(reader))]).astype(np.int64)
    return ids[~np.isin(ids, list(special))]


def run_cli(
    *args: str, check: bool = True, env: dict | None = None, timeout: int = 600, cwd: Path = REPO
) -> subprocess.CompletedProcess:
    """Run `python -m ...` the way a user would; returns the completed process (text output)."""
    full_env = {**os.environ, **(env or {})}
    proc = subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"{' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
        )
    return proc


def train_cli(run: Path, *args: str, check: bool = True, env: dict | None = None):
    """`python pretrain/main.py` as one process on the CPU config, quiet and small: the flags
    every one-process trainer test shares. ``args`` add the data, model, batch and the feature."""
    cmd = command_line.trainer(
        ds_config=REPO / "ds_configs" / "cpu.json",
        output_dir=run,
        eval_batches=2,
        num_workers=0,
        progress=False,
    )
    return run_cli(*cmd[1:], *args, check=check, env=env)


def build_shards(corpus: Path, out: Path, **options) -> Path:
    """`python -m data_prep build` of `corpus` into `out`, as the shard fixtures build theirs:
    a 2000-entry WordPiece vocabulary, sequences of 128, 5% validation, 2 workers; `options`
    (flag names as keywords) add to or override them."""
    options = {
        "vocab_size": 2000,
        "max_seq_len": 128,
        "validation_fraction": 0.05,
        "workers": 2,
        **options,
    }
    if options.get("tokenizer"):
        options.pop("vocab_size")
    run_cli(*command_line.data_prep_build(corpus, out, **options)[1:])
    return out


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

    from pretrain.components.distributed import free_port

    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")):
        monkeypatch.setenv(key, value)  # deepspeed.initialize reads them
    if not dist.is_initialized():
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1
        )
    deepspeed.init_distributed(dist_backend="gloo")
