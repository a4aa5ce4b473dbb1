"""The project's one writer of files and one publisher of folders.

Readers never see half a file or half a folder: everything is written under a temporary name in
the same folder and renamed into place, so a crash leaves either the old content or the new one.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: the folder above this package: the source checkout in an editable install (a wheel has none)
_CHECKOUT = Path(__file__).resolve().parent.parent


def checkout_file(path: str | os.PathLike) -> Path:
    """``path``; a relative one that is not there from the current folder but is in the source
    checkout (the default ``ds_configs/cpu.json``, ``recipes/*.yaml``): the checkout's copy, so
    the commands run from any folder."""
    given = Path(path)
    if given.is_absolute() or given.exists() or not (_CHECKOUT / "pyproject.toml").is_file():
        return given
    there = _CHECKOUT / given
    return there if there.exists() else given


def _tmp_name(path: Path) -> Path:
    return path.with_name(f"{path.name}.tmp-{os.getpid()}")


def write_bytes_atomic(path: Path, data: bytes | memoryview) -> dict[str, Any]:
    """Write under a temporary name, fsync, rename; return {bytes, sha256} of what was written."""
    tmp = _tmp_name(path)
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    """Write UTF-8 text atomically (temporary name, fsync, rename); creates the parent folder."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_bytes_atomic(path, text.encode("utf-8"))


def write_json_atomic(
    path: str | os.PathLike, obj: Any, *, indent: int = 1, sort_keys: bool = False
) -> None:
    """Write JSON atomically (see :func:`write_text_atomic`); non-JSON values become strings."""
    text = json.dumps(obj, indent=indent, sort_keys=sort_keys, ensure_ascii=False, default=str)
    write_text_atomic(path, text + "\n")


@contextlib.contextmanager
def publish_dir(dest: str | os.PathLike, *, replace: bool = False) -> Iterator[Path]:
    """Yield an empty temporary folder beside ``dest`` to fill; when the block ends without an
    exception it is renamed to ``dest`` (an existing ``dest`` is replaced only with ``replace``,
    else FileExistsError), and on an exception it is removed and ``dest`` is left as it was.

        with publish_dir(run / "tokenizer") as tmp:
            shutil.copytree(source, tmp, dirs_exist_ok=True)
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_name(dest)
    shutil.rmtree(tmp, ignore_errors=True)  # left by an interrupted run of this process id
    tmp.mkdir()
    try:
        yield tmp
        if dest.exists():
            if not replace:
                raise FileExistsError(f"{dest} exists: not replacing it")
            old = dest.with_name(f"{dest.name}.old-{os.getpid()}")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(dest, old)  # the old one goes only once the new one is complete
            os.replace(tmp, dest)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
