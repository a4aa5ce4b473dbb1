"""What `pretrain.doctor` learns about one node: run there as `python -c <this file> '<json>'`.

Standard library only (plus torch, imported last and guarded), so it runs on a node even when the
project or a package is missing there: that is exactly what the doctor wants to report. Prints one
line `DOCTOR_PROBE {json}`. Arguments (JSON): data (the shard folder, or a list of them),
output_dir (run folder). It also reports, for each package of the project's constraints.txt (in
its working directory), the installed version beside the tested one.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import socket
import sys
from importlib import metadata
from pathlib import Path

PACKAGES = ("torch", "deepspeed", "triton", "transformers", "bertforge")
CONSTRAINTS = "constraints.txt"  # the tested versions, at the repository root
CODE_DIRS = ("pretrain", "kernels", "data_prep")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def code_hash(root: Path) -> str | None:
    """Short sha256 of the project's Python sources under `root` (same code on every node?)."""
    files = sorted(p for d in CODE_DIRS for p in (root / d).rglob("*.py"))
    if not files:
        return None
    h = hashlib.sha256()
    for p in files:
        h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes())
    return h.hexdigest()[:12]


def data_state(data: str | Path) -> dict:
    """Manifest sha256 and the shard files that are missing or of the wrong size (for a URL, as
    this node reads the store with its own credentials)."""
    if "://" in str(data):
        return remote_state(str(data))
    data = Path(data)
    manifest = data / "manifest.json"
    if not manifest.is_file():
        return {"manifest_sha256": None, "exists": data.is_dir()}
    out = {"manifest_sha256": _sha256(manifest), "exists": True, "missing": [], "bad_size": []}
    try:
        m = json.loads(manifest.read_text())
        for split, info in m["splits"].items():
            for shard in info["shards"]:
                for name, meta in shard["files"].items():
                    f = data / split / name
                    if not f.is_file():
                        out["missing"].append(f"{split}/{name}")
                    elif f.stat().st_size != meta["bytes"]:
                        out["bad_size"].append(f"{split}/{name}")
    except (KeyError, TypeError, ValueError) as e:
        out["manifest_error"] = f"{type(e).__name__}: {e}"
    return out


def remote_state(url: str) -> dict:
    """:func:`data_state` of a folder in object storage; ``remote_error`` when it cannot be read
    (no client, no credentials, no such bucket: the reason as the client gives it)."""
    try:  # the project's client (fsspec): importable wherever the project is
        from bertforge.data_prep.object_store import Retry, Store

        store = Store(url, Retry(tries=2, backoff_s=0.5))
        raw = store.read_bytes("manifest.json")
        m = json.loads(raw)
        out = {"manifest_sha256": hashlib.sha256(raw).hexdigest(), "exists": True}
        out.update(missing=[], bad_size=[])
        for split, info in m["splits"].items():
            sizes = store.listing(split) if info["shards"] else {}
            for shard in info["shards"]:
                for name, meta in shard["files"].items():
                    got = sizes.get(name)
                    if got != meta["bytes"]:
                        out["missing" if got is None else "bad_size"].append(f"{split}/{name}")
        return out
    except Exception as e:  # noqa: BLE001 (reported as the node's data row)
        return {"manifest_sha256": None, "exists": False, "remote_error": str(e)[:500]}


def disk_free(path: Path) -> int:
    """Free bytes on the filesystem that will hold `path` (its nearest existing parent)."""
    path = path.absolute()
    while not path.exists():
        path = path.parent
    return shutil.disk_usage(path).free


def installed_version(package: str) -> str | None:
    """The installed version of a distribution (``scikit-learn``, ``torch``), None if absent."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def tested_versions(path: Path) -> dict[str, str] | None:
    """``{name: version}`` of each ``name==version`` line of a constraints file (comments and
    blank lines skipped; an environment marker after ``;`` dropped); None without the file."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return None
    pins = {}
    for line in text.splitlines():
        spec = line.split("#", 1)[0].split(";", 1)[0].strip()
        if "==" in spec:
            name, version = (part.strip() for part in spec.split("==", 1))
            pins[name] = version
    return pins


def tested_and_installed(root: Path) -> dict[str, dict] | None:
    """For each package of ``root/constraints.txt``: ``{"tested": V, "installed": V or None}``."""
    pins = tested_versions(root / CONSTRAINTS)
    if pins is None:
        return None
    return {name: {"tested": v, "installed": installed_version(name)} for name, v in pins.items()}


def probe(data: str | list[str], output_dir: str) -> dict:
    """Everything the doctor compares across nodes, as plain JSON-able values."""
    out: dict = {
        "hostname": socket.gethostname(),
        "python": platform.python_version(),
        "executable": sys.executable,
        "cwd": os.getcwd(),
        "cpus": os.cpu_count(),
        "ram_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"),
    }
    for pkg in PACKAGES:
        out[pkg] = installed_version(pkg)
    out["code"] = code_hash(Path.cwd())
    out["tested"] = tested_and_installed(Path.cwd())
    folders = [data] if isinstance(data, str) else list(data)  # a mixture has several
    out["data_sources"] = {d: data_state(d) for d in folders}
    out["data"] = out["data_sources"][folders[0]]
    out["disk_free"] = disk_free(Path(output_dir))
    out["gpus"], out["gpu_bytes"], out["gpu_name"] = 0, None, None
    try:
        # Lazy and guarded: this file runs on each node as a standard-library script (module doc);
        # torch last, when it is there.
        import torch

        n = torch.cuda.device_count()
        if n:
            props = [torch.cuda.get_device_properties(i) for i in range(n)]
            out["gpus"] = n
            out["gpu_bytes"] = min(p.total_memory for p in props)
            out["gpu_name"] = props[0].name
    except Exception as e:  # noqa: BLE001  a broken torch install is a finding, not a crash
        out["torch_error"] = f"{type(e).__name__}: {e}"
    return out


if __name__ == "__main__":
    args = json.loads(sys.argv[1])
    print("DOCTOR_PROBE " + json.dumps(probe(args["data"], args["output_dir"])), flush=True)
