"""The other Pythons' environments for tests/grading/test_python_versions.py, made in a process
of their own while the rest of the suite runs.

Making them is mostly waiting (PyPI's PyTorch for Linux is a 2.7 GB download, then gigabytes
unpacked): as soon as the tests are collected, tests/conftest.py starts this builder in the
background, and the test module's fixtures wait for what it made. Two environments are made
side by side, each reported in a file of its own in the session's shared folder:

- ``py312``: Python 3.12 with PyTorch and a kernel (ipykernel, nbclient, nbformat), as Colab or
  a lab machine has before the student edition's first cell runs;
- ``py312course``: the same, hard-linked (its PyTorch shared, not copied), with the pinned course
  and the grader's tools installed (``-e .[lab,grader]``), for the tests of the course itself;
- ``py313``: a copy of the checkout set up by the README's commands for a student without make,
  run as written (their last command opens JupyterLab, checked to list the student's copy of
  notebook 03 in ``work/``), then the grader's tools (``-e .[lab,grader]``).

    python tests/python_envs.py FOLDER      (what the builder runs)
"""

from __future__ import annotations

import functools
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
import urllib.request
from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
NOTEBOOK = "03_self_attention"
FOLDER = "pythons"  # in the session's shared folder (tests/graded_class.py's SHARED)
BUILDER_NICENESS = 5  # tests/conftest.py WORKER_NICENESS
BUILDS = {"py312": "3.12", "py313": "3.13"}  # (py312course is made from py312)


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


def missing_python(version: str) -> str:
    return (f"no Python {version} here (python{version} on PATH or pyenv's): install one "
            f"(pyenv install {version}, or uv python install {version}) to run this test")


def plain_env() -> dict[str, str]:
    """A plain environment: nothing of this checkout on the path, plots to files."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "WORKBOOK_"))}
    env.update(MPLBACKEND="Agg", PIP_DISABLE_PIP_VERSION_CHECK="1", PYTHONDONTWRITEBYTECODE="1")
    return env


def run(argv: list, timeout: int = 1800, **kwargs) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(a) for a in argv], capture_output=True, text=True, timeout=timeout,
                          env=kwargs.pop("env", plain_env()), **kwargs)
    assert proc.returncode == 0, f"{' '.join(map(str, argv))}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def pip(venv_python: Path, *args) -> subprocess.CompletedProcess:
    return run([venv_python, "-m", "pip", "install", "--quiet", "-c", REPO / "constraints.txt", *args])


def readme_without_make() -> list[str]:
    """The README's commands for a student without make (its PowerShell block)."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    block = re.search(r"Without `make`.*?```powershell\n(.*?)```", text, re.S)
    assert block, "the README shows no commands for a student without make"
    return [line for line in block.group(1).splitlines() if line.strip()]


def copy_checkout(folder: Path) -> Path:
    """The checkout's tracked files (as they are now) in ``folder``: a fresh clone."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    for name in filter(None, listed.decode().split("\0")):
        if (REPO / name).is_file():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, folder / name)
    return folder


def open_lab(argv: list[str], cwd: Path) -> list[str]:
    """Start the README's last command (JupyterLab on work/), return what its contents API lists
    for notebook 03's folder, and stop it."""
    from browser import free_port
    port = free_port()
    lab = subprocess.Popen([*argv, "--no-browser", f"--port={port}", "--IdentityProvider.token=readme"], cwd=cwd,
                           env=plain_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
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


def without_make(python: Path, clone: Path) -> Path:
    """The README's commands without make, run as written with the POSIX spelling it gives
    (``python3`` for ``py``, ``.venv/bin/python`` for ``.venv\\Scripts\\python``)."""
    commands = readme_without_make()
    assert len(commands) == 3, commands
    for line in commands:
        argv = shlex.split(line.replace("\\", "/"), posix=True)
        argv = [str(python) if a == "py" else ".venv/bin/python" if a == ".venv/Scripts/python" else a for a in argv]
        if "course_lib.workspace" in argv:
            listed = open_lab(argv, clone)
            assert listed == [f"{NOTEBOOK}.ipynb"], listed  # the student's own copy, in work/
            assert (clone / "work" / NOTEBOOK / f"{NOTEBOOK}.ipynb").is_file()
        else:
            run(argv, cwd=clone)
    return clone / ".venv" / "bin" / "python"


def _build(name: str, folder: Path) -> dict:
    python = find_python(BUILDS[name])
    if python is None:
        return {"skip": missing_python(BUILDS[name])}
    if name == "py312":
        run([python, "-m", "venv", folder / name])
        venv_python = folder / name / "bin" / "python"
        pip(venv_python, "torch==2.13.0", "ipykernel", "nbclient", "nbformat")
        # (linked before any test may install into py312: see _course_copy)
        run(["cp", "-al", folder / "py312", folder / "py312course"])
    else:
        clone = copy_checkout(folder / name)
        venv_python = without_make(python, clone)
        pip(venv_python, "-e", f"{clone}[lab,grader]")
    return {"python": str(venv_python)}


def _course_copy(folder: Path) -> dict:
    """The course and the grader's tools installed into py312course, py312 hard-linked as it was
    made (a venv's paths are found from its own python, so a copy works where it lies): pip
    writes new files and unlinks old ones, never writing through a link into py312."""
    venv_python = folder / "py312course" / "bin" / "python"
    pip(venv_python, "-e", f"{REPO}[lab,grader]")
    return {"python": str(venv_python)}


def _report(name: str, folder: Path) -> dict:
    started = time.monotonic()
    try:
        result = _build(name, folder) if name in BUILDS else _course_copy(folder)
    except BaseException as exc:  # the test that needs it fails with this
        result = {"error": f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-4000:]}"}
    result["seconds"] = round(time.monotonic() - started, 1)
    (folder / f"{name}.json.tmp").write_text(json.dumps(result))
    os.replace(folder / f"{name}.json.tmp", folder / f"{name}.json")
    return result


def _py312_then_course(folder: Path) -> None:
    made = _report("py312", folder)
    if "python" in made:
        _report("py312course", folder)
    else:
        (folder / "py312course.json").write_text(json.dumps(made))  # skipped or failed alike


def start(shared: Path) -> bool:
    """Start the builder in ``shared``'s pythons/ unless a process of this session already did;
    True when this call started it."""
    folder = shared / FOLDER
    try:
        folder.mkdir()
    except FileExistsError:
        return False
    log = open(folder / "builder.log", "w")
    # mostly downloads, waited for last: at the pytest workers' priority, behind the graded class
    process = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), str(folder)],
                               stdout=log, stderr=subprocess.STDOUT, cwd=str(REPO), start_new_session=True,
                               preexec_fn=functools.partial(os.nice, BUILDER_NICENESS))
    (folder / "builder.pid").write_text(str(process.pid))
    return True


def stop(shared: Path) -> None:
    """End the builder if it still runs (an interrupted session)."""
    try:
        os.killpg(int((shared / FOLDER / "builder.pid").read_text()), signal.SIGTERM)
    except (OSError, ValueError):
        pass


def wait(shared: Path, name: str, timeout: float = 3600) -> dict:
    """What the builder made for ``name`` (``{"python": ...}``, ``{"skip": why}`` or
    ``{"error": what}``), once it is made."""
    path, deadline = shared / FOLDER / f"{name}.json", time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            return {"error": f"{name} was not made within {timeout:.0f} s"}
        time.sleep(2)
    return json.loads(path.read_text())


# -- what the tests use ---------------------------------------------------------

def made(name: str) -> Path:
    """The environment the background builder made (tests/python_envs.py): its Python."""
    import pytest

    from graded_class import SHARED
    shared = Path(os.environ[SHARED])
    start(shared)  # (already started when the session collected this module)
    result = wait(shared, name)
    if "skip" in result:
        pytest.skip(result["skip"])
    assert "error" not in result, f"{name} could not be made:\n{result['error']}"
    return Path(result["python"])


def with_solutions(released: Path, out: Path) -> Path:
    """The released notebook with every solution cell as the solution notebook has it: what a
    student who got everything right hands in."""
    import nbformat
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


def run_notebook(venv_python: Path, path: Path, **env) -> dict:
    proc = run([venv_python, TESTS / "run_notebook.py", path, "--cwd", path.parent], env={**plain_env(), **env})
    return json.loads(proc.stdout.strip().splitlines()[-1])


def assert_every_check_passes(summary: dict, version: str) -> None:
    assert summary["python"].startswith(version + "."), summary["python"]
    assert not summary["errors"], summary["errors"]
    graded = summary["graded"]
    assert len(graded) >= 4, graded.keys()
    for gid, cell in graded.items():
        assert cell["score"] == cell["points"] > 0, f"{gid}: {cell['text']}"
        assert cell["stderr"] == "", f"{gid} wrote to stderr: {cell['stderr']}"


def main(argv: list[str]) -> int:
    folder = Path(argv[0])
    threads = [threading.Thread(target=_py312_then_course, args=(folder,)),
               threading.Thread(target=_report, args=("py313", folder))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
