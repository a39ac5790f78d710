"""The set-up a newcomer runs: the pinned versions install on every Python the project
claims (3.11.0 and later, Debian 12's own 3.11.2 included), `make` refuses another Python
with a message that says what to install, and `workbook check` tells an instructor up front
whether this machine can grade."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from autograder import cli
from autograder.sealing import sandbox

REPO = Path(__file__).resolve().parents[2]


def _requirements() -> list[str]:
    """What `pip install -e ".[dev]"` asks for, the extras the dev extra names
    (``attention-workbook[hub]``) written out."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras, out = project["optional-dependencies"], list(project["dependencies"])
    for requirement in extras["dev"]:
        own = requirement.startswith(project["name"] + "[")
        out += extras[requirement.split("[")[1].split("]")[0]] if own else [requirement]
    return out


def test_the_claimed_python_floor_is_3_11_0():
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["requires-python"] == ">=3.11,<3.12"


def test_the_pins_resolve_for_the_oldest_claimed_python(tmp_path):
    """pip resolves pyproject's requirements under constraints.txt as Python 3.11.0 would, wheels
    only: a pin whose release needs a later 3.11 (soupsieve 4.1.1 needs 3.11.5) fails here."""
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("\n".join(_requirements()) + "\n")
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--ignore-installed",
         "--python-version", "3.11.0", "--only-binary=:all:", "--target", str(tmp_path / "target"),
         "-c", str(REPO / "constraints.txt"), "-r", str(requirements), "--report", str(report)],
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"the pins do not install on Python 3.11.0:\n{proc.stderr[-3000:]}"
    resolved = {item["metadata"]["name"].lower().replace("_", "-"): item["metadata"]["version"]
                for item in json.loads(report.read_text())["install"]}
    pins = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            pins[name.lower().replace("_", "-")] = version
    unpinned = sorted(set(resolved) - set(pins))
    assert not unpinned, f"installed without a pin in constraints.txt: {unpinned}"
    assert resolved["torch"].startswith(pins["torch"])
    assert resolved["soupsieve"] == pins["soupsieve"]


def _fake_python(folder: Path, version: str) -> Path:
    """An interpreter that is not 3.11: it prints its version and fails everything else."""
    path = folder / "python"
    path.write_text(f'#!/bin/sh\n[ "$1" = --version ] && {{ echo "Python {version}"; exit 0; }}\n'
                    f'exec /usr/bin/env python3 -c "import sys; sys.exit(1)"\n')
    path.chmod(0o755)
    return path


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
@pytest.mark.parametrize("target", ["lab", "test", "setup"])
def test_make_refuses_another_python_and_says_what_to_install(tmp_path, target):
    for name in ("Makefile", "pyproject.toml", "constraints.txt"):
        shutil.copy(REPO / name, tmp_path / name)
    python = _fake_python(tmp_path, "3.10.12")
    proc = subprocess.run(["make", "-s", target, f"PYTHON={python}"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode != 0
    assert "The workbook needs Python 3.11 (any 3.11.x)" in proc.stderr
    assert "is Python 3.10.12" in proc.stderr
    assert "sudo apt-get install python3.11 python3.11-venv" in proc.stderr
    assert "make lab PYTHON=/path/to/python3.11" in proc.stderr
    assert not (tmp_path / ".venv").exists()


def test_workbook_check_says_the_machine_is_ready(tmp_path, capsys):
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed (make sandbox)")
    (tmp_path / "nbgrader_config.py").write_text("c = get_config()\n")
    sandbox.check_available.cache_clear()
    assert cli.main(["--course", str(tmp_path), "check"]) == 0
    out = capsys.readouterr().out
    assert "sandbox: ready (bubblewrap at " in out
    assert f"gradebook: a SQLite file, {tmp_path.resolve()}/gradebook.db (made by the first" in out
    assert out.rstrip().endswith("ready to grade")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nbgrader_config.py"]  # checking made nothing


def test_workbook_check_names_the_fix_when_bubblewrap_is_missing(tmp_path, capsys, monkeypatch):
    (tmp_path / "nbgrader_config.py").write_text("c = get_config()\n")
    monkeypatch.setattr(sandbox, "_bwrap", lambda: None)
    sandbox.check_available.cache_clear()
    try:
        assert cli.main(["--course", str(tmp_path), "check"]) == 2
    finally:
        sandbox.check_available.cache_clear()
    out = capsys.readouterr().out
    assert "sandbox: NOT READY: bubblewrap (bwrap) is not installed" in out
    assert "sudo apt-get install bubblewrap" in out
    assert "not ready to grade: fix the lines above" in out


def test_workbook_check_names_an_unreachable_gradebook_server_without_its_password(tmp_path, capsys):
    (tmp_path / "nbgrader_config.py").write_text(
        "c = get_config()\nc.CourseDirectory.db_url = 'postgresql://grader:s3cret@127.0.0.1:1/course'\n")
    assert cli.main(["--course", str(tmp_path), "check"]) == 2
    out = capsys.readouterr().out
    assert "gradebook: NOT READY: cannot open the gradebook postgresql://grader:***@127.0.0.1:1/course" in out
    assert "s3cret" not in out
