"""DeepSpeed's engine start-up without its Muon import (pretrain/components/engine_start.py): the
engine is built as before, and neither Muon nor inductor's compiler is imported on the way."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers.commands import REPO

from bertforge.pretrain.components.engine_start import MUON_MODULE, without_muon

# One rank in a fresh interpreter (nothing imported before): the trainer's own engine build.
_BUILD = """
import json, os, sys
import torch.distributed as dist
from bertforge.data_prep.reader import ShardReader
from bertforge.pretrain.build import build_encoder, build_engine
from bertforge.pretrain.components.distributed import free_port
from bertforge.pretrain.config.cli import parse_args
from bertforge.pretrain.config.ds_config import resolve_deepspeed_config
os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1")
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
muon, cfg = sys.argv[1], parse_args(sys.argv[2:])
setup = resolve_deepspeed_config(cfg, 1, "cpu")
model, _ = build_encoder(cfg, ShardReader(cfg.run.data_sources[0], "train"), setup)
engine, _ = build_engine(cfg, model, setup.config)
print(json.dumps({
    "optimizer": type(engine.optimizer).__name__,
    "muon": sys.modules.get(muon) is not None,
    "inductor": "torch._inductor.compile_fx" in sys.modules,
    "left_blocked": muon in sys.modules,
}))
"""


def test_inside_the_block_muon_does_not_import_and_after_it_does_again():
    before = MUON_MODULE in sys.modules
    with without_muon():
        if not before:
            with pytest.raises(ImportError):
                __import__(MUON_MODULE)
    assert (MUON_MODULE in sys.modules) == before  # nothing left behind


@pytest.mark.slow  # a fresh interpreter with DeepSpeed
def test_the_trainers_engine_builds_without_muon_or_inductor(english_shards, tmp_path):
    argv = [
        *("--ds_config", str(REPO / "ds_configs" / "cpu.json"), "--data", str(english_shards)),
        *("--model", "tiny", "--output_dir", str(tmp_path / "run"), "--micro_batch_size", "4"),
    ]
    proc = subprocess.run(
        [sys.executable, "-c", _BUILD, MUON_MODULE, *argv],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    built = json.loads(proc.stdout.strip().splitlines()[-1])
    # ZeRO-2's optimizer wraps torch's AdamW: DeepSpeed still judged it supported
    assert built == {
        "optimizer": "DeepSpeedZeroOptimizer",
        "muon": False,
        "inductor": False,
        "left_blocked": False,
    }
