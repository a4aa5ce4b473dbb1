"""The README and the manual in docs/ stay true: the README is short and links every page, every
pasted output names the command that makes it (scripts/refresh_docs.py, `make docs`), the
deterministic ones are what those commands print now, and the continued-pretraining recipe is the
script that runs it."""

from __future__ import annotations

import importlib.util
import re
import sys

import pytest
from helpers.commands import REPO

_spec = importlib.util.spec_from_file_location("refresh_docs", REPO / "scripts" / "refresh_docs.py")
refresh_docs = importlib.util.module_from_spec(_spec)
sys.modules["refresh_docs"] = refresh_docs  # dataclasses look their module up there
_spec.loader.exec_module(refresh_docs)

BLOCKS = [b for doc in refresh_docs.pages() for b in refresh_docs.blocks(doc)]
STABLE = [b for b in BLOCKS if not ({"varies", "slow", "unchecked"} & b.flags)]


def test_readme_is_short_and_links_every_page():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 250
    for page in sorted((REPO / "docs").glob("*.md")):
        assert f"(docs/{page.name}" in readme, f"README.md does not link docs/{page.name}"


def test_every_marker_has_its_block_and_parses():
    # The block right after a marker is the one the script refreshes; a typo in a marker's flags
    # raises in blocks(); a marker not followed by a fenced block would be skipped silently.
    for doc in refresh_docs.pages():
        text = doc.read_text(encoding="utf-8")
        markers = len(re.findall(r"^<!-- output", text, flags=re.MULTILINE))
        assert markers == len(refresh_docs.blocks(doc)), f"{doc.name}: a marker without its block"
    assert len(STABLE) >= 2 and any(b.varies for b in BLOCKS)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    """A scratch working folder: the commands' relative paths (runs/docs/...) are built there,
    once for all the blocks."""
    return tmp_path_factory.mktemp("docs"), set()


@pytest.mark.parametrize("block", STABLE, ids=lambda b: b.where())
def test_deterministic_outputs_are_what_the_commands_print(block, scratch):
    cwd, built = scratch
    now = refresh_docs.run(block, cwd=cwd, done=built)
    assert now == block.body, f"{block.where()} is stale: run `make docs` ({block.cmd})"


@pytest.mark.parametrize(
    "page_name, script_name",
    [("continued.md", "continued_recipe.sh"), ("model.md", "long_context_recipe.sh")],
)
def test_recipe_is_the_script(page_name, script_name):
    """A recipe printed in docs/ is its script under scripts/, line for line."""
    page = (REPO / "docs" / page_name).read_text(encoding="utf-8")
    recipe = re.search(r"```bash\n(export OMP_NUM_THREADS=1\n.*?)```", page, flags=re.DOTALL)
    script = (REPO / "scripts" / script_name).read_text(encoding="utf-8")
    body = script.split(f"# --- the recipe, as docs/{page_name} prints it ---\n", 1)[1]
    assert recipe is not None and recipe.group(1) == body


@pytest.mark.parametrize(
    "page_name, script_name, job_name",
    [("launching.md", "slurm_train.sh", "bert-base"), ("data.md", "slurm_shards.sh", "shards")],
)
def test_slurm_script_is_the_file(page_name, script_name, job_name):
    """A SLURM script printed in docs/ is its file under scripts/, the one
    tests/e2e/test_slurm.py submits to a real SLURM."""
    page = (REPO / "docs" / page_name).read_text(encoding="utf-8")
    block = re.search(
        rf"```bash\n(#!/bin/bash\n#SBATCH --job-name={job_name}\n.*?)```", page, flags=re.DOTALL
    )
    script = (REPO / "scripts" / script_name).read_text(encoding="utf-8")
    assert block is not None and block.group(1) == script


def test_continued_filter_keeps_the_reports_not_the_progress():
    lines = [
        "486 docstrings of email, http, urllib: 146 K characters -> runs/domain/email_http.txt",
        "[2026-12-01 21:11:01,024] [INFO] [launch.py:174:main] Setting CUDA_VISIBLE_DEVICES=0,1",
        *[f"    {4000 + i} 'tok{i}'  added terms  1 x 2 pieces" for i in range(8)],
        "train 70/300 step | loss 4.981 lr 0.001 | 1.8 step/s",
        "validation step 100: loss 5.2152 accuracy 0.1644 perplexity 184.04",
    ]
    kept = refresh_docs.FILTERS["continued"](lines)
    assert kept[0].startswith("486 docstrings") and kept[-1].startswith("validation step 100")
    assert kept.count("    ...") == 1 and len(kept) == 1 + 5 + 1 + 1


def test_page_commands_run_under_the_tests_interpreter(tmp_path):
    """`python` in a page's command is the interpreter running the tests (tests/docs/conftest.py),
    whatever `python` the shell's PATH held before."""
    for name in ("python", "python3"):
        out = refresh_docs._shell(f'{name} -c "import sys; print(sys.executable)"', tmp_path)
        assert out.stdout.strip() == sys.executable
