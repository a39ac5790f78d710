"""The session's graded class, graded once, in a process of its own, while the tests that do
not need it run.

Every submission the test modules register (``nbtools.register``, ``nbgrader_suite``) is
graded in one ``workbook autograde -j 2`` run. As soon as the tests are collected (by the
first pytest process that collects one needing ``graded_class``), this module's builder
starts in the background with the modules those tests are in: it imports them (which
registers their submissions), grades the class and writes what the tests read
(``state.json``) into a folder the whole session shares. The ``graded_class`` fixture waits
for it. With pytest-xdist (``make test`` runs two workers, ``--dist loadfile``), both workers
share the one class and grading overlaps with their other tests; the tests that need it are
run last.

    python tests/graded_class.py SHARED_DIR MODULE.py [MODULE.py ...]   (what the builder runs)
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parent
SHARED = "WORKBOOK_GRADED_CLASS_DIR"  # set for the whole session by tests/conftest.py


def start(shared: Path, modules: list[Path]) -> bool:
    """Start the builder for ``modules`` unless a process of this session already did; True
    when this call started it."""
    try:
        fd = os.open(shared / "started", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        f.write("\n".join(str(m) for m in modules))
    log = open(shared / "builder.log", "w")
    process = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), str(shared), *map(str, modules)],
                               stdout=log, stderr=subprocess.STDOUT, cwd=str(TESTS.parent), start_new_session=True)
    (shared / "builder.pid").write_text(str(process.pid))
    return True


def stop(shared: Path) -> None:
    """End the builder if it still runs (an interrupted session)."""
    import signal
    try:
        pid = int((shared / "builder.pid").read_text())
        os.killpg(pid, signal.SIGTERM)
    except (OSError, ValueError):
        pass


class SharedGradedClass:
    """What the tests read of the graded class: its course folder (an ``nbtools.Course``),
    every assignment's scores, the run's log and time, and the snapshot of the course files
    taken before grading."""

    def __init__(self, state: dict) -> None:
        from nbtools import Course
        self.course = Course.existing(Path(state["root"]), state["assignments"])
        self._scores = state["scores"]
        self.log = state["log"]
        self.seconds = state["seconds"]
        self.before = state["before"]
        self.submission_seconds = state["submission_seconds"]

    def scores(self, assignment: str) -> dict[str, dict[str, float]]:
        return self._scores[assignment]


def wait(shared: Path, timeout: float = 5400) -> SharedGradedClass:
    """The graded class, once its builder has finished (its log in the error otherwise)."""
    deadline = time.monotonic() + timeout
    while True:
        if (shared / "state.json").exists():
            return SharedGradedClass(json.loads((shared / "state.json").read_text()))
        if (shared / "failed").exists() or time.monotonic() > deadline:
            log = (shared / "builder.log").read_text(errors="replace") if (shared / "builder.log").exists() else ""
            raise RuntimeError(f"the graded class could not be built:\n{log[-6000:]}")
        time.sleep(2)


def _import(path: Path) -> None:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    spec.loader.exec_module(module)


def main(argv: list[str]) -> int:
    shared, modules = Path(argv[0]), [Path(p) for p in argv[1:]]
    sys.path[:0] = sorted({str(TESTS), *(str(m.parent) for m in modules), str(TESTS.parent)})
    os.environ.setdefault("MPLBACKEND", "Agg")
    try:
        for path in modules:
            _import(path)
        from nbtools import CLASS, GradedClass
        graded = GradedClass(keep=True)
        state = {"root": str(graded.course.root), "assignments": sorted(CLASS),
                 "scores": {a: graded.scores(a) for a in CLASS}, "log": graded.log, "seconds": graded.seconds,
                 "before": graded.before, "submission_seconds": graded.submission_seconds}
        (shared / "state.json.tmp").write_text(json.dumps(state))
        os.replace(shared / "state.json.tmp", shared / "state.json")
        return 0
    except BaseException:
        (shared / "failed").write_text("")
        raise


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
