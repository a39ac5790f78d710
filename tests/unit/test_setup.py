"""The set-up a newcomer runs: the pinned versions install on every Python the project
claims (3.11.0 to 3.14: Debian 12's own 3.11.2, Ubuntu 24.04's 3.12, Homebrew's and python.org's
3.13 and 3.14), `make` takes the newest of them and refuses another Python with a message that
says how to get one, and `workbook check` tells an instructor up front whether this machine can
grade. (tests/grading/test_python_versions.py installs the course with 3.12 and 3.13 and runs it.)"""

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
    (``attention-workbook[lab,grader,hub]``) written out."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras, out = project["optional-dependencies"], list(project["dependencies"])
    for requirement in extras["dev"]:
        if requirement.startswith(project["name"] + "["):
            for extra in requirement.split("[")[1].split("]")[0].split(","):
                out += extras[extra]
        else:
            out.append(requirement)
    return out


def test_the_claimed_pythons_are_3_11_to_3_14_in_pyproject_and_makefile():
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["requires-python"] == ">=3.11,<3.15"
    makefile = (REPO / "Makefile").read_text()
    assert "PYTHONS := 3.14 3.13 3.12 3.11" in makefile  # newest first
    assert "(3, 11) <= sys.version_info[:2] <= (3, 14)" in makefile


def _pins() -> dict[str, str]:
    pins = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            pins[name.lower().replace("_", "-")] = version
    return pins


CLAIMED = ["3.11.0", "3.12", "3.13", "3.14"]


@pytest.fixture(scope="module")
def resolutions(tmp_path_factory) -> dict[str, tuple[subprocess.CompletedProcess, Path]]:
    """pip's resolution of pyproject's requirements under constraints.txt as each claimed Python
    would do it, wheels only; the four run at once (each is mostly waiting for the index)."""
    folder = tmp_path_factory.mktemp("resolve")
    requirements = folder / "requirements.txt"
    requirements.write_text("\n".join(_requirements()) + "\n")
    running = {}
    for version in CLAIMED:
        report = folder / f"report-{version}.json"
        running[version] = (subprocess.Popen(
            [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--ignore-installed",
             "--python-version", version, "--only-binary=:all:", "--target", str(folder / f"target-{version}"),
             "-c", str(REPO / "constraints.txt"), "-r", str(requirements), "--report", str(report)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True), report)
    done = {}
    for version, (proc, report) in running.items():
        out, err = proc.communicate(timeout=900)
        done[version] = (subprocess.CompletedProcess(proc.args, proc.returncode, out, err), report)
    return done


@pytest.mark.parametrize("python_version", CLAIMED)
def test_the_pins_resolve_for_every_claimed_python(resolutions, python_version):
    """A pin whose release needs a later 3.11 (soupsieve 4.1.1 needs 3.11.5) fails on 3.11.0, a
    pin without a wheel for 3.14 fails there, and everything that gets installed has a pin."""
    proc, report = resolutions[python_version]
    assert proc.returncode == 0, f"the pins do not install on Python {python_version}:\n{proc.stderr[-3000:]}"
    resolved = {item["metadata"]["name"].lower().replace("_", "-"): item["metadata"]["version"]
                for item in json.loads(report.read_text())["install"]}
    pins = _pins()
    unpinned = sorted(set(resolved) - set(pins))
    assert not unpinned, f"installed without a pin in constraints.txt: {unpinned}"
    assert {name: version for name, version in resolved.items() if not version.startswith(pins[name])} == {}
    assert resolved["torch"].startswith(pins["torch"])


def _fake_python(folder: Path, version: str, name: str = "python") -> Path:
    """An interpreter that prints ``version`` and runs ``-c ''`` (what make's search asks),
    and fails everything else: enough for make to pick it or refuse it."""
    path = folder / name
    path.write_text(f'#!/bin/sh\n[ "$1" = --version ] && {{ echo "Python {version}"; exit 0; }}\n'
                    f'[ "$1" = -c ] && [ -z "$2" ] && exit 0\n'
                    f'exec /usr/bin/env python3 -c "import sys; sys.exit(1)"\n')
    path.chmod(0o755)
    return path


def _copy_setup(folder: Path) -> None:
    for name in ("Makefile", "pyproject.toml", "constraints.txt"):
        shutil.copy(REPO / name, folder / name)


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
@pytest.mark.parametrize("target", ["lab", "test", "setup"])
def test_make_refuses_another_python_and_says_how_to_get_one(tmp_path, target):
    _copy_setup(tmp_path)
    python = _fake_python(tmp_path, "3.10.12")
    proc = subprocess.run(["make", "-s", target, f"PYTHON={python}"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode != 0
    assert "The workbook needs Python 3.11, 3.12, 3.13 or 3.14" in proc.stderr
    assert "is Python 3.10.12" in proc.stderr
    for how in ("sudo apt-get install python3 python3-venv", "brew install python@3.13",
                "https://www.python.org/downloads/", "uv python install 3.13", "make lab PYTHON=/path/to/python3.13"):
        assert how in proc.stderr, how
    assert not (tmp_path / ".venv").exists()


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_takes_the_newest_supported_python_that_runs(tmp_path):
    """On PATH: a python3.14 that does not run (as pyenv's shim for a version not selected), a
    3.13 and a 3.12: make takes 3.13; with none of python3.11-3.14, plain python3."""
    _copy_setup(tmp_path)
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "python3.14").write_text("#!/bin/sh\necho 'pyenv: python3.14: command not found' >&2; exit 127\n")
    (bin_ / "python3.14").chmod(0o755)
    for name, version in (("python3.13", "3.13.0"), ("python3.12", "3.12.1"), ("python3", "3.10.12")):
        _fake_python(bin_, version, name)
    env = {"PATH": str(bin_), "HOME": str(tmp_path)}  # (make runs its recipes with /bin/sh)

    def chosen() -> str:
        proc = subprocess.run([shutil.which("make"), "-n", ".venv/.installed"], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=60)
        return next(line.split()[0] for line in proc.stdout.splitlines() if line.endswith("-m venv .venv"))

    assert chosen() == str(bin_ / "python3.13")
    (bin_ / "python3.13").unlink()
    assert chosen() == str(bin_ / "python3.12")
    (bin_ / "python3.12").unlink()
    assert chosen() == str(bin_ / "python3")  # refused by the version check when the recipe runs


def test_workbook_check_says_the_machine_is_ready(tmp_path, capsys):
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed (make sandbox)")
    (tmp_path / "nbgrader_config.py").write_text("c = get_config()\n")
    sandbox.check_available.cache_clear()
    assert cli.main(["--course", str(tmp_path), "check"]) == 0
    out = capsys.readouterr().out
    assert "sandbox: ready (bubblewrap at " in out
    from autograder.sealing import cpu_share
    groups, why = cpu_share.found()  # how each run's CPU is shared, said either way
    assert (groups.words() if groups else f"new sessions refused (no CPU group: {why})") in out, out
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
