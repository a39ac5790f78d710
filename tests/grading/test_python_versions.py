"""The course on the Pythons students have, really installed (not only resolved): for Python
3.12 and 3.13, a virtual environment made with that Python gets the pinned course, runs notebook
03 top to bottom with every check passing in that Python's own kernel, and grades submissions
with that environment's `workbook autograde`, sandboxed. With 3.13 the environment is made by
the README's commands for a student without make, run as written (in a copy of the checkout),
and its JupyterLab opens on the student's copies. With 3.12, first as on Colab: an environment
that has PyTorch already installs the student edition from the first cell of its notebook
(`--install-url`), keeps its PyTorch, and runs notebook 03 from a folder outside any checkout.

The Pythons are found on PATH (``python3.12``) or among pyenv's interpreters; where one is
missing its tests skip and say how to get it. (The suite itself runs on the machine's default
Python: 3.11 here; tests/unit/test_setup.py resolves the pins for 3.11.0 to 3.14.)"""

from __future__ import annotations

import csv
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest

from browser import free_port
from workbook_class import make_course

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
NOTEBOOK = "03_self_attention"
RUN_NOTEBOOK = REPO / "tests" / "run_notebook.py"


def find_python(version: str) -> Path | None:
    """An interpreter of ``version`` (``"3.12"``) that runs and can make a virtual environment:
    ``python3.12`` on PATH, then pyenv's newest 3.12.x."""
    candidates = [shutil.which(f"python{version}")]
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    candidates += sorted(root.glob(f"versions/{version}.*/bin/python{version}"),
                         key=lambda p: [int(x) for x in p.parts[-3].split(".") if x.isdigit()], reverse=True)
    for candidate in filter(None, candidates):
        probe = subprocess.run([str(candidate), "-c", "import sys, venv, ensurepip; print(sys.version_info[:2])"],
                               capture_output=True, text=True, timeout=60)
        if probe.returncode == 0 and probe.stdout.strip() == str(tuple(int(x) for x in version.split("."))):
            return Path(candidate)
    return None


def _python_or_skip(version: str) -> Path:
    python = find_python(version)
    if python is None:
        pytest.skip(f"no Python {version} here (python{version} on PATH or pyenv's): install one "
                    f"(pyenv install {version}, or uv python install {version}) to run this test")
    return python


def _env() -> dict[str, str]:
    """A plain environment: nothing of this checkout on the path, plots to files."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "WORKBOOK_"))}
    env.update(MPLBACKEND="Agg", PIP_DISABLE_PIP_VERSION_CHECK="1", PYTHONDONTWRITEBYTECODE="1")
    return env


def _run(argv: list, timeout: int = 1800, **kwargs) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=timeout,
                          env=kwargs.pop("env", _env()), **kwargs)
    assert proc.returncode == 0, f"{' '.join(map(str, argv))}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def _venv(python: Path, folder: Path) -> Path:
    _run([python, "-m", "venv", folder])
    return folder / "bin" / "python"


def _pip(venv_python: Path, *args) -> subprocess.CompletedProcess:
    return _run([venv_python, "-m", "pip", "install", "--quiet", "-c", REPO / "constraints.txt", *args])


def _with_solutions(released: Path, out: Path) -> Path:
    """The released notebook with every solution cell as the solution notebook has it: what a
    student who got everything right hands in."""
    solution = nbformat.read(str(REPO / "solutions" / NOTEBOOK / f"{NOTEBOOK}.ipynb"), as_version=4)
    answers = {c.metadata.nbgrader.grade_id: c.source for c in solution.cells
               if c.get("metadata", {}).get("nbgrader", {}).get("solution")}
    nb = nbformat.read(str(released), as_version=4)
    filled = 0
    for c in nb.cells:
        gid = c.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if gid in answers and c.cell_type == "code":
            c.source = "\n".join(line for line in answers[gid].splitlines() if "### " not in line)
            filled += 1
    assert filled >= 4, filled
    out.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(out))
    return out


def _run_notebook(venv_python: Path, path: Path, **env) -> dict:
    proc = _run([venv_python, RUN_NOTEBOOK, path, "--cwd", path.parent], env={**_env(), **env})
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _assert_every_check_passes(summary: dict, version: str) -> None:
    assert summary["python"].startswith(version + "."), summary["python"]
    assert not summary["errors"], summary["errors"]
    graded = summary["graded"]
    assert len(graded) >= 4, graded.keys()
    for gid, cell in graded.items():
        assert cell["score"] == cell["points"] > 0, f"{gid}: {cell['text']}"
        assert cell["stderr"] == "", f"{gid} wrote to stderr: {cell['stderr']}"


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("pythons")


@pytest.fixture(scope="module")
def with_torch_312(base) -> Path:
    """A Python 3.12 environment with PyTorch and a kernel, as Colab or a lab machine has."""
    python = _python_or_skip("3.12")
    venv_python = _venv(python, base / "py312")
    _pip(venv_python, "torch==2.13.0", "ipykernel", "nbclient", "nbformat")
    return venv_python


def _torch_fingerprint(venv_python: Path) -> tuple[str, int]:
    out = _run([venv_python, "-c", "import os, torch; print(torch.__version__, os.stat(torch.__file__).st_mtime_ns)"],
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
    notebook = _with_solutions(edition / "notebooks" / NOTEBOOK / f"{NOTEBOOK}.ipynb",
                               base / "colab-content" / f"{NOTEBOOK}.ipynb")
    assert nbformat.read(str(notebook), as_version=4).cells[0].metadata.tags == ["colab-install"]

    summary = _run_notebook(with_torch_312, notebook, PYTHONPATH=str(base / "colab-modules"))

    _assert_every_check_passes(summary, "3.12")
    where = _run([with_torch_312, "-c", "import course_lib; print(course_lib.__file__)"], cwd=base).stdout.strip()
    site = _run([with_torch_312, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip()
    assert where.startswith(site), where  # installed, not found in a checkout
    assert _torch_fingerprint(with_torch_312) == torch_before  # the PyTorch that was there, untouched
    listed = _run([with_torch_312, "-m", "pip", "list", "--format=json"]).stdout
    names = {p["name"].lower() for p in json.loads(listed)}
    assert "attention-workbook-student" in names and "jupyterlab" not in names and "nbgrader" not in names


def readme_without_make() -> list[str]:
    """The README's commands for a student without make (its PowerShell block)."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    block = re.search(r"Without `make`.*?```powershell\n(.*?)```", text, re.S)
    assert block, "the README shows no commands for a student without make"
    return [line for line in block.group(1).splitlines() if line.strip()]


def _copy_checkout(folder: Path) -> Path:
    """The checkout's tracked files (as they are now) in ``folder``: a fresh clone."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    for name in filter(None, listed.decode().split("\0")):
        if (REPO / name).is_file():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, folder / name)
    return folder


def _open_lab(argv: list[str], cwd: Path) -> list[str]:
    """Start the README's last command (JupyterLab on work/), return what its contents API lists
    for notebook 03's folder, and stop it."""
    port = free_port()
    lab = subprocess.Popen([*argv, "--no-browser", f"--port={port}", "--IdentityProvider.token=readme"], cwd=cwd,
                           env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                url = f"http://127.0.0.1:{port}/api/contents/{NOTEBOOK}?token=readme"
                with urllib.request.urlopen(url, timeout=10) as reply:
                    return [f["name"] for f in json.loads(reply.read())["content"]]
            except OSError:
                assert lab.poll() is None and time.monotonic() < deadline, lab.stdout.read().decode()[-3000:]
                time.sleep(1)
    finally:
        os.killpg(lab.pid, signal.SIGTERM)
        lab.wait(timeout=60)


def _without_make(python: Path, clone: Path) -> Path:
    """The README's commands without make, run as written with the POSIX spelling it gives
    (``python3`` for ``py``, ``.venv/bin/python`` for ``.venv\\Scripts\\python``)."""
    commands = readme_without_make()
    assert len(commands) == 3, commands
    for line in commands:
        argv = shlex.split(line.replace("\\", "/"), posix=True)
        argv = [str(python) if a == "py" else ".venv/bin/python" if a == ".venv/Scripts/python" else a for a in argv]
        if "course_lib.workspace" in argv:
            assert _open_lab(argv, clone) == [f"{NOTEBOOK}.ipynb"]  # the student's own copy, in work/
            assert (clone / "work" / NOTEBOOK / f"{NOTEBOOK}.ipynb").is_file()
        else:
            _run(argv, cwd=clone)
    return clone / ".venv" / "bin" / "python"


@pytest.fixture(scope="module", params=["3.12", "3.13"])
def course_env(request, base) -> tuple[str, Path]:
    """(version, the Python of a virtual environment with the pinned course). 3.13's is made by
    the README's commands without make; 3.12's is the Colab test's environment, the student
    edition uninstalled first. Both then get the grader's tools (``-e .[lab,grader]``)."""
    version = request.param
    if version == "3.12":
        venv_python = request.getfixturevalue("with_torch_312")
        _run([venv_python, "-m", "pip", "uninstall", "--quiet", "--yes", "attention-workbook-student"])
        _pip(venv_python, "-e", f"{REPO}[lab,grader]")
    else:
        clone = _copy_checkout(base / f"clone{version.replace('.', '')}")
        venv_python = _without_make(_python_or_skip(version), clone)
        _pip(venv_python, "-e", f"{clone}[lab,grader]")
    return version, venv_python


def test_the_pinned_course_installs_and_notebook_03_passes_in_that_pythons_kernel(course_env, base):
    version, venv_python = course_env
    frozen = _run([venv_python, "-m", "pip", "list", "--format=json", "--exclude-editable"]).stdout
    pins = {line.split("==")[0].lower().replace("_", "-"): line.split("==")[1]
            for line in (REPO / "constraints.txt").read_text().splitlines() if line and not line.startswith("#")}
    installed = {p["name"].lower().replace("_", "-"): p["version"] for p in json.loads(frozen)}
    installed.pop("pip", None)
    assert sorted(set(installed) - set(pins)) == []  # everything installed has a pin ...
    assert {n: v for n, v in installed.items() if not v.startswith(pins[n])} == {}  # ... and is that pin
    notebook = base / f"run{version}" / f"{NOTEBOOK}.ipynb"
    notebook.parent.mkdir()
    shutil.copyfile(REPO / "solutions" / NOTEBOOK / f"{NOTEBOOK}.ipynb", notebook)

    _assert_every_check_passes(_run_notebook(venv_python, notebook), version)


def test_that_pythons_workbook_autogrades_in_the_sandbox(course_env, base):
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed (make sandbox)")
    version, venv_python = course_env
    workbook = venv_python.parent / "workbook"
    root, assignment = make_course(base / f"course{version}", NOTEBOOK)
    _run([workbook, "--course", root, "release", assignment], cwd=root)
    released = root / "notebooks" / assignment / f"{NOTEBOOK}.ipynb"
    hand_in = base / f"hand-in{version}"
    _with_solutions(released, hand_in / "alice" / f"{NOTEBOOK}.ipynb")
    (hand_in / "bob").mkdir()
    shutil.copyfile(released, hand_in / "bob" / f"{NOTEBOOK}.ipynb")  # the stubs, as released
    _run([workbook, "--course", root, "collect", hand_in, "-a", assignment], cwd=root)

    graded = _run([workbook, "--course", root, "autograde", assignment, "-j", "1", "--cell-timeout", "120",
                   "--notebook-timeout", "600", "--memory-mb", "3072"], cwd=root)
    assert "unsafe" not in graded.stdout.lower()

    _run([workbook, "--course", root, "export", "-o", base / f"grades{version}.csv"], cwd=root)
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
