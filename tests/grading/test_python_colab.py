"""The course on Colab, as a student meets it: an environment with Python 3.12 and PyTorch
already (made in the background, tests/python_envs.py) installs the student edition from the
first cell of its notebook (`workbook student-edition --install-url`), keeps its PyTorch, and
runs notebook 03 from a folder outside any checkout with every check passing."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import nbformat
import pytest

from python_envs import NOTEBOOK, REPO, assert_every_check_passes, made, run, run_notebook, with_solutions

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("colab")


@pytest.fixture(scope="module")
def with_torch_312() -> Path:
    """A Python 3.12 environment with PyTorch and a kernel, as Colab or a lab machine has."""
    return made("py312")


def _torch_fingerprint(venv_python: Path) -> tuple[str, int]:
    out = run([venv_python, "-c", "import os, torch; print(torch.__version__, os.stat(torch.__file__).st_mtime_ns)"],
               cwd=venv_python.parent).stdout.split()
    return out[0], int(out[1])


def test_on_colab_the_first_cell_installs_the_edition_keeps_torch_and_notebook_03_passes(with_torch_312, base):
    edition = base / "edition"
    made = subprocess.run([REPO / "workbook", "student-edition", edition, "--install-url", edition], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert made.returncode == 0, made.stderr
    assert f"installs the course on Colab from {edition}" in made.stdout
    torch_before = _torch_fingerprint(with_torch_312)
    fake = base / "colab-modules" / "google"  # google.colab importable, as on Colab
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "colab.py").write_text("")
    notebook = with_solutions(edition / "notebooks" / NOTEBOOK / f"{NOTEBOOK}.ipynb",
                               base / "colab-content" / f"{NOTEBOOK}.ipynb")
    assert nbformat.read(str(notebook), as_version=4).cells[0].metadata.tags == ["colab-install"]

    summary = run_notebook(with_torch_312, notebook, PYTHONPATH=str(base / "colab-modules"))

    assert_every_check_passes(summary, "3.12")
    where = run([with_torch_312, "-c", "import course_lib; print(course_lib.__file__)"], cwd=base).stdout.strip()
    site = run([with_torch_312, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    assert where.startswith(site), where  # installed, not found in a checkout
    assert _torch_fingerprint(with_torch_312) == torch_before  # the PyTorch that was there, untouched
    listed = run([with_torch_312, "-m", "pip", "list", "--format=json"]).stdout
    names = {p["name"].lower() for p in json.loads(listed)}
    assert "attention-workbook-student" in names and "jupyterlab" not in names and "nbgrader" not in names
