"""One import name: the distribution installs `bertforge` and nothing else, and the project runs in
an environment that also holds Hugging Face's `kernels` package (which transformers imports when it
is installed, and which our old top-level `kernels` package used to shadow)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest
import transformers.utils.import_utils as hf_imports
from helpers.commands import REPO

from bertforge.pretrain.config import command_line

#: The folders that install under `bertforge` (pyproject.toml's package-dir).
FOLDERS = {"bertforge": "bertforge", "kernels": "bertforge.kernels"}
FOLDERS |= {name: f"bertforge.{name}" for name in ("data_prep", "pretrain")}


def _pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def test_package_list_is_the_tree():
    """Every folder of Python code under the four product folders is listed, and nothing else: a new
    subpackage missing from the list would be left out of the wheel."""
    tree = set()
    for folder, name in FOLDERS.items():
        for path in (REPO / folder).rglob("*.py"):
            rel = path.parent.relative_to(REPO / folder)
            if "__pycache__" not in rel.parts:
                tree.add(".".join((name, *rel.parts)))
    assert set(_pyproject()["tool"]["setuptools"]["packages"]) == tree


def test_no_package_named_kernels_at_the_repository_root():
    """`python -m ...` and pytest put the repository root on sys.path: a `kernels/__init__.py` there
    would win over Hugging Face's `kernels` inside transformers."""
    assert not (REPO / "kernels" / "__init__.py").exists()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
    subprocess.run([*cmd, "-w", str(out), str(REPO)], check=True, capture_output=True, timeout=300)
    (path,) = out.glob("bertforge-*.whl")
    return path


def test_wheel_adds_one_top_level_name(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        top_level = next(n for n in names if n.endswith("top_level.txt"))
        assert z.read(top_level).decode().split() == ["bertforge"]
    roots = {n.split("/", 1)[0] for n in names if not n.split("/", 1)[0].endswith(".dist-info")}
    assert roots == {"bertforge"}
    assert "bertforge/kernels/api.py" in names and "bertforge/pretrain/main.py" in names


@pytest.fixture(scope="module")
def env_with_hf_kernels(wheel, tmp_path_factory) -> Path:
    """A fresh environment (system packages visible: torch, deepspeed, transformers) holding our
    wheel, installed non-editable, and Hugging Face's `kernels` in transformers' range.

    No pip of its own (ensurepip costs seconds): the system's pip, visible like the other system
    packages, installs into the environment it runs in. Without PYTHONPATH, as every command of
    this environment runs: a checkout on it (its bertforge.egg-info, once built) would make pip
    take bertforge for installed already and skip the wheel."""
    root = tmp_path_factory.mktemp("env")
    venv.create(root, system_site_packages=True, with_pip=False)
    python = root / "bin" / "python"
    lo, hi = hf_imports.KERNELS_MIN_VERSION, hf_imports.KERNELS_MAX_VERSION
    pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    for args in ([f"kernels>={lo},<={hi}"], ["--no-deps", str(wheel)]):
        subprocess.run([*pip, *args], check=True, timeout=600, capture_output=True, env=_env())
    return python


def _env() -> dict[str, str]:
    """This environment's variables without PYTHONPATH. TORCH_EXTENSIONS_DIR (set by conftest)
    stays: the new environment sees the same torch and DeepSpeed, so their op build is found
    built (ninja: no work to do) instead of compiled again for this environment's own folder;
    tests/pretrain/distributed/test_op_builds.py covers the per-environment folders."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def _run(python: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [str(python), *args], cwd=cwd, env=_env(), capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, f"{args} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc


@pytest.mark.slow
def test_runs_beside_hugging_face_kernels(env_with_hf_kernels, english_shards, tmp_path):
    """The launch that failed with `cannot import name 'IGNORE_INDEX' from 'kernels'`: transformers
    loads Hugging Face's `kernels`, from the repository root too, and a run trains and exports
    (the export with the wheel's console script, from a folder outside the repository)."""
    python = env_with_hf_kernels
    probe = (
        "import kernels, transformers.modeling_utils, bertforge.kernels.api as ours\n"
        "assert hasattr(kernels, 'get_kernel'), kernels.__file__\n"
        "assert ours.IGNORE_INDEX == -100\n"
        "import bertforge, sys\n"
        "print(bertforge.__file__)\n"
    )
    outside = _run(python, "-c", probe, cwd=tmp_path).stdout
    assert "site-packages" in outside, "the installed wheel, not the checkout"
    _run(python, "-c", probe, cwd=REPO)  # the repository root first on sys.path
    run = tmp_path / "run"
    cmd = command_line.trainer(
        ds_config=REPO / "ds_configs" / "cpu.json",
        data=english_shards,
        output_dir=run,
        model="tiny",
        max_steps=2,
        eval_interval=2,
        eval_batches=1,
        micro_batch_size=4,
        num_workers=0,
        progress=False,
    )
    _run(python, *cmd[1:], cwd=REPO)
    bertforge = python.parent / "bertforge"  # [project.scripts], as pip installed it
    _run(bertforge, "export", str(run), "--output", str(tmp_path / "hf"), cwd=tmp_path)
    assert (tmp_path / "hf" / "config.json").is_file()
    assert re.search(r'"step": 2\b', (run / "metrics.jsonl").read_text())
