"""DeepSpeed's ``latest`` file on our checkpoints, in-process on one rank (issue 17).

``latest`` is written after ``COMPLETE`` and names only a complete checkpoint: a save that dies
before its marker leaves it as it was, and ``engine.load_checkpoint(dir)`` without a tag (what
DeepSpeed users call) loads the checkpoint it names.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from helpers.commands import REPO
from helpers.engines import one_rank_engine, tiny_config

pytestmark = pytest.mark.slow


def _engine(shards: Path, run: Path):
    cfg = tiny_config(shards, run, "--keep_last", "3")
    return cfg, one_rank_engine(cfg)[0]


def test_latest_never_names_an_incomplete_checkpoint(
    english_shards, tmp_path, one_rank_group, monkeypatch
):
    from bertforge.pretrain.checkpoints import checkpoint as ck
    from bertforge.pretrain.checkpoints import resume
    from bertforge.pretrain.run_folder import run_checkpoints as rc

    cfg, engine = _engine(english_shards, tmp_path / "run")
    ckpts = ck.CheckpointManager(cfg.run.output_dir, cfg.checkpoint, 0, 1)
    latest = ckpts.root / resume.LATEST_FILE
    state = {"config": dataclasses.asdict(cfg.run), "consumed_samples": 0}
    ckpts.save(engine, 1, state)
    assert latest.read_text() == rc.tag_for(1)

    from bertforge.pretrain.checkpoints import checkpoint_files  # writes COMPLETE

    real_write = checkpoint_files.write_text_atomic

    def die_before_marker(path, text):
        if Path(path).name == rc.MARKER:
            raise RuntimeError("killed before COMPLETE")
        real_write(path, text)

    monkeypatch.setattr(checkpoint_files, "write_text_atomic", die_before_marker)
    with pytest.raises(RuntimeError, match="killed before COMPLETE"):
        ckpts.save(engine, 2, state)
    assert (ckpts.root / rc.tag_for(2) / rc.STATE_FILE).is_file()  # shards are there ...
    assert not rc.is_complete(ckpts.root / rc.tag_for(2))  # ... but no marker
    assert latest.read_text() == rc.tag_for(1)

    monkeypatch.setattr(checkpoint_files, "write_text_atomic", real_write)
    ckpts.save(engine, 3, state)
    assert latest.read_text() == rc.tag_for(3)
    assert not (ckpts.root / rc.tag_for(2)).exists()  # the partial save was pruned

    # What a DeepSpeed user calls: no tag, DeepSpeed reads `latest`.
    path, client = engine.load_checkpoint(str(ckpts.root))
    assert path is not None and Path(path).parent.name == rc.tag_for(3)
    assert client["trainer_state"]["step"] == 3


def _marks(text: str) -> dict[str, int]:
    """Counts of the marks in a rendered sequence (pretrain.data.show_masks' notation)."""
    tokens = text.replace("⟦", " ").replace("⟧", " ").split()
    return {
        kind: sum(t.startswith(f"[{code}:") for t in tokens)
        for kind, code in (("mask", "M"), ("random", "R"), ("kept", "K"))
    }


def test_show_masks_agrees_with_the_realised_statistics(english_shards):
    """--show_masks over exactly the dry run's batches: the marks add up to its statistics."""
    import json
    import os
    import re
    import subprocess
    import sys

    from bertforge.pretrain.dry_run import format_report

    proc = subprocess.run(
        [
            sys.executable,
            "pretrain/main.py",
            "--data",
            str(english_shards),
            "--dry-run",
            "--json",
            "--whole_word",
            "true",
            "--micro_batch_size",
            "4",
            "--show_masks",
            "32",
        ],  # 8 batches of 4: the statistics' batches
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        text=True,
        capture_output=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout[proc.stdout.index("{") :])
    shown, stats = report["show_masks"], report["masking"]
    assert len(shown) == 32 == stats["sequences"]
    marks = [_marks(s["text"]) for s in shown]
    total = {k: sum(m[k] for m in marks) for k in ("mask", "random", "kept")}
    assert total["mask"] == stats["mask_tokens"]
    assert total["mask"] + total["random"] + total["kept"] == stats["selected_tokens"]
    # A random draw of the original token reads as kept (about 1 in the vocabulary size).
    assert 0 <= stats["random_tokens"] - total["random"] <= 2
    assert sum(s["units"] for s in shown) == stats["whole_word_units"]
    # Whole-word masking: a grouped unit is selected whole, and multi-piece units do get grouped.
    groups = [g for s in shown for g in re.findall("⟦([^⟧]*)⟧", s["text"])]
    assert groups and all(t.startswith(("[M:", "[R:", "[K:")) for g in groups for t in g.split())
    text = format_report(report)
    assert "[M:x] [MASK]" in text and f"#{shown[0]['index']} " in text
