"""The course on the Pythons students have, really installed (not only resolved): for Python
3.12 and 3.13, a virtual environment made with that Python gets the pinned course, runs notebook
03 top to bottom with every check passing in that Python's own kernel, and grades submissions
with that environment's `workbook autograde`, sandboxed. With 3.13 the environment is made by
the README's commands for a student without make, run as written (in a copy of the checkout),
and its JupyterLab opens on the student's copies. (3.12 as on Colab: test_python_colab.py.)

The environments are made in the background while the rest of the suite runs
(tests/python_envs.py, started by tests/conftest.py as soon as these tests are collected):
making them is mostly waiting on downloads and disks. The Pythons are found on PATH
(``python3.12``) or among pyenv's interpreters; where one is missing its tests skip and say how
to get it. (The suite itself runs on the machine's default
Python: 3.11 here; tests/unit/test_setup.py resolves the pins for 3.11.0 to 3.14.)"""

from __future__ import annotations

import csv
import json
import os
import shutil
import sys
from pathlib import Path

import nbformat
import pytest

from python_envs import NOTEBOOK, assert_every_check_passes, find_python, made, run, run_notebook, with_solutions
from workbook_class import make_course

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("pythons")


@pytest.fixture(scope="module", params=["3.12", "3.13"])
def course_env(request) -> tuple[str, Path]:
    """(version, the Python of a virtual environment with the pinned course). 3.13's is made by
    the README's commands without make (and its JupyterLab opened on work/); 3.12's has PyTorch first, as on
    Colab (tests/grading/test_python_colab.py), then the course. Both have the grader's tools
    (``-e .[lab,grader]``)."""
    version = request.param
    if version == "3.12":
        venv_python = made("py312course")
    else:
        venv_python = made("py313")
    return version, venv_python


def test_the_pinned_course_installs_and_notebook_03_passes_in_that_pythons_kernel(course_env, base):
    version, venv_python = course_env
    frozen = run([venv_python, "-m", "pip", "list", "--format=json", "--exclude-editable"]).stdout
    pins = {line.split("==")[0].lower().replace("_", "-"): line.split("==")[1]
            for line in (REPO / "constraints.txt").read_text().splitlines() if line and not line.startswith("#")}
    installed = {p["name"].lower().replace("_", "-"): p["version"] for p in json.loads(frozen)}
    installed.pop("pip", None)
    assert sorted(set(installed) - set(pins)) == []  # everything installed has a pin ...
    assert {n: v for n, v in installed.items() if not v.startswith(pins[n])} == {}  # ... and is that pin
    notebook = base / f"run{version}" / f"{NOTEBOOK}.ipynb"
    notebook.parent.mkdir()
    shutil.copyfile(REPO / "solutions" / NOTEBOOK / f"{NOTEBOOK}.ipynb", notebook)

    assert_every_check_passes(run_notebook(venv_python, notebook), version)


def test_that_pythons_workbook_autogrades_in_the_sandbox(course_env, base):
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed (make sandbox)")
    version, venv_python = course_env
    workbook = venv_python.parent / "workbook"
    root, assignment = make_course(base / f"course{version}", NOTEBOOK)
    run([workbook, "--course", root, "release", assignment], cwd=root)
    released = root / "notebooks" / assignment / f"{NOTEBOOK}.ipynb"
    hand_in = base / f"hand-in{version}"
    with_solutions(released, hand_in / "alice" / f"{NOTEBOOK}.ipynb")
    (hand_in / "bob").mkdir()
    shutil.copyfile(released, hand_in / "bob" / f"{NOTEBOOK}.ipynb")  # the stubs, as released
    run([workbook, "--course", root, "collect", hand_in, "-a", assignment], cwd=root)

    graded = run([workbook, "--course", root, "autograde", assignment, "-j", "1", "--cell-timeout", "120",
                   "--notebook-timeout", "600", "--memory-mb", "3072"], cwd=root)
    assert "unsafe" not in graded.stdout.lower()

    run([workbook, "--course", root, "export", "-o", base / f"grades{version}.csv"], cwd=root)
    with open(base / f"grades{version}.csv", newline="") as f:
        rows = {r["student"]: r for r in csv.DictReader(f)}
    source = nbformat.read(str(root / "solutions" / assignment / f"{NOTEBOOK}.ipynb"), as_version=4)
    automatic = sum(float(c.metadata.nbgrader.points) for c in source.cells
                    if c.cell_type == "code" and c.get("metadata", {}).get("nbgrader", {}).get("grade"))
    assert automatic > 0
    assert float(rows["alice"]["auto"]) == automatic, rows["alice"]
    assert float(rows["bob"]["auto"]) == 0.0, rows["bob"]
    assert rows["alice"]["unverified"] == rows["bob"]["unverified"] == ""  # graded in the sandbox


def test_the_interpreters_are_found_where_students_and_these_machines_have_them():
    """Not a skip in disguise: on a machine with pyenv's 3.12 and 3.13 (as the course's CI has)
    both are found, so the tests above ran."""
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    for version in ("3.12", "3.13"):
        if shutil.which(f"python{version}") or list(root.glob(f"versions/{version}.*/bin/python{version}")):
            assert find_python(version) is not None, version
    assert find_python("3.9.99") is None
    assert sys.version_info[:2] >= (3, 11)
