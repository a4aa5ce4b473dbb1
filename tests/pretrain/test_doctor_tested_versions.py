"""The tested versions (constraints.txt) are declared once and the doctor prints each installed
version against them: an ok row where all match (a local label such as ``+cpu`` aside), a WARN,
never a FAIL, naming each one that differs; and pyproject's ranges admit the tested versions."""

from __future__ import annotations

import json
import re

import pytest
from helpers.commands import REPO
from packaging.requirements import Requirement

from bertforge.pretrain.doctor import cli, probe
from bertforge.pretrain.doctor.checks import FAIL, OK, WARN, constraint_rows

CONSTRAINTS = REPO / "constraints.txt"


def installed_as(monkeypatch, pins: dict[str, str], **changes: str | None) -> None:
    """The installed-version lookup answers the tested versions (torch as the CPU wheel), with
    `changes` (underscores for dashes) instead."""
    found = {name: v + ("+cpu" if name == "torch" else "") for name, v in pins.items()}
    found.update({k.replace("_", "-"): v for k, v in changes.items()})
    monkeypatch.setattr(probe, "installed_version", lambda name: found.get(name))


def test_constraints_pin_every_direct_dependency_inside_pyproject_ranges():
    tomllib = pytest.importorskip("tomllib")
    pins = probe.tested_versions(CONSTRAINTS)
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    required = [Requirement(r) for r in project["dependencies"]]
    required += [Requirement(r) for r in project["optional-dependencies"]["dev"]]
    for req in required:
        assert req.name in pins, f"{req.name} (pyproject.toml) has no tested version in constraints"
        assert req.specifier.contains(pins[req.name]), f"{req} does not admit {pins[req.name]}"
    assert pins["deepspeed"] == "0.19.8"  # the guard's private _update_scale was checked there
    # make install's CPU torch wheel is the pinned one: the Makefile reads it from the file.
    makefile = (REPO / "Makefile").read_text()
    assert "TORCH_VERSION ?= $(shell sed -n 's/^torch==//p' constraints.txt)" in makefile
    assert "-c $(CONSTRAINTS)" in makefile and "CONSTRAINTS ?= constraints.txt" in makefile


def test_the_doctor_row_when_every_version_is_the_tested_one(monkeypatch):
    pins = probe.tested_versions(CONSTRAINTS)
    installed_as(monkeypatch, pins)
    (row,) = constraint_rows({"(local)": {"tested": probe.tested_and_installed(REPO)}})
    assert (row.check, row.status) == ("tested versions", OK)
    assert "torch 2.13.0+cpu" in row.detail and f"deepspeed {pins['deepspeed']}" in row.detail


def test_the_doctor_warns_of_each_untested_version(monkeypatch, tmp_path, capsys):
    pins = probe.tested_versions(CONSTRAINTS)
    installed_as(monkeypatch, pins, deepspeed="0.20.1", triton=None, scikit_learn="1.8.0")
    (row,) = constraint_rows({"(local)": {"tested": probe.tested_and_installed(REPO)}})
    assert row.status == WARN
    untested, as_tested = row.detail.split("; as tested: ")
    assert "deepspeed 0.20.1 (tested 0.19.8)" in untested
    assert f"triton not installed (tested {pins['triton']})" in untested
    assert f"scikit-learn 1.8.0 (tested {pins['scikit-learn']})" in untested
    assert "torch" not in untested and "torch 2.13.0+cpu" in as_tested
    assert "pip install -c constraints.txt" in row.fix

    # The command prints it, as a warning: it fails nothing by itself.
    monkeypatch.chdir(REPO)
    monkeypatch.setattr(
        cli,
        "run_probe",
        lambda host, command, ssh_args, timeout_s: (
            probe.probe([str(tmp_path / "shards")], str(tmp_path)),
            "",
        ),
    )
    config, shards = REPO / "ds_configs" / "cpu.json", tmp_path / "shards"
    cli.main(["--ds_config", str(config), "--data", str(shards), "--slots", "1", "--json"])
    rows = json.loads(capsys.readouterr().out)
    (printed,) = [r for r in rows if r["check"] == "tested versions"]
    assert printed["status"] == WARN and "deepspeed 0.20.1 (tested 0.19.8)" in printed["detail"]
    # (the data row fails here: no shards; the versions row too: triton "missing" on the node)
    assert {r["check"] for r in rows if r["status"] == FAIL} == {"data", "versions"}

    # Without constraints.txt in the working directory: a WARN saying where it looked.
    nowhere = probe.tested_and_installed(tmp_path)
    (row,) = constraint_rows({"h": {"tested": nowhere, "cwd": "/x"}})
    assert row.status == WARN and "no constraints.txt in /x" in row.detail


def test_the_gpu_wheel_script_pins_the_tested_versions():
    """scripts/prepare_gpu_wheels.sh pins its own list for offline GPU nodes: the same versions."""
    pins = probe.tested_versions(CONSTRAINTS)
    script = (REPO / "scripts" / "prepare_gpu_wheels.sh").read_text()
    pinned = dict(re.findall(r'"([A-Za-z0-9_.-]+)==([^"]+)"', script))
    shared = sorted(set(pinned) & set(pins))
    assert "deepspeed" in shared and "datasets" in shared
    assert {n: pinned[n] for n in shared} == {n: pins[n] for n in shared}
