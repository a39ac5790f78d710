"""``workbook gradescope``: one assignment as a Gradescope autograder, graded by the same
checks and the same sealed runner as ``workbook autograde``.

    workbook gradescope 03_self_attention -o autograder.zip [--hidden after_published]

The zip is in Gradescope's documented format (``setup.sh`` and ``run_autograder`` at its
root; https://gradescope-autograders.readthedocs.io/en/latest/specs/):

===================  ======================================================================
``setup.sh``         run once, as root, when Gradescope builds the image (Ubuntu 22.04): Python
                     3.11 beside Ubuntu's ``python3`` (3.10, which runs Gradescope's own
                     harness and is left alone), a virtual environment with the course's
                     pinned packages (torch's CPU wheel), the student's user, bubblewrap where
                     apt has it, and the assignment released once (``prepare`` below)
``run_autograder``   run for every submission, as root, in ``/autograder``: ``run`` below,
                     which always leaves ``/autograder/results/results.json``
``autograder/``,     the grader and the checks, as the instructor has them
``course_lib/``
``course/``          ``nbgrader_config.py`` and ``solutions/<assignment>/``
``gradescope.json``  what was chosen at build: the assignment, its notebooks, the limits, when
                     the hidden checks are shown
``secret``           this autograder's own grading secret (hidden inputs are derived from it)
===================  ======================================================================

A submission is collected (autograder/pipeline/collect.py: the same door, renamed notebooks
recognised, its time from Gradescope's ``submission_metadata.json``, the due date from
there too), graded by :func:`autograder.pipeline.autograde.autograde` and written as Gradescope's
``results.json``: per graded item one test for its visible checks (always shown) and one
for its hidden checks (shown as the instructor chose: after the grades are published, after
the due date, or never), per written answer one test without points (a person grades it),
the late-work and unverified notes and the problems found, all as plain text
(``output_format: text``: nothing a student wrote is rendered), as strict JSON.

Where bubblewrap cannot start (Gradescope's containers have no user namespaces), the
submission runs in container mode (autograder/sealing/container.py): as the unprivileged user
``setup.sh`` made, unable to read ``/autograder``, and with all its processes killed before
``results.json`` is written.

Settings of a run, from the environment (the defaults are Gradescope's):
``WORKBOOK_AUTOGRADER_ROOT`` (``/autograder``), ``WORKBOOK_VENV`` (``/opt/workbook/venv``),
``WORKBOOK_STUDENT_USER`` (``workbook-student``), ``WORKBOOK_ISOLATION`` (``auto``:
bubblewrap where it starts, else container mode; or ``bubblewrap``, ``container``, ``none``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import pwd
import secrets
import shutil
import stat
import sys
import time
import traceback
import zipfile
from pathlib import Path
from typing import Any

from ...course import Course, CourseError, read_json
from ...sealing.isolation import resolve

__all__ = ["build", "prepare", "run", "results_for", "HIDDEN_VISIBILITIES", "DEFAULT_USER", "main"]

ROOT = Path(__file__).resolve().parents[3]  # the repository: autograder/, course_lib/, constraints.txt
TEMPLATES = Path(__file__).resolve().parent / "templates"
HIDDEN_VISIBILITIES = ("after_published", "after_due_date", "hidden")
DEFAULT_USER = "workbook-student"
STARTUP_MARGIN_S = 150  # of Gradescope's time limit, kept for starting Python, torch, the release and the records
MAX_OUTPUT = 20_000  # characters of one test's output (a written answer, a report)
SETTINGS = "gradescope.json"


# ---------------------------------------------------------------------------
# Build (the instructor's machine)
# ---------------------------------------------------------------------------

def _requirements() -> list[str]:
    """The course's dependencies as pyproject.toml declares them (setup.sh installs them
    with constraints.txt; the course's own packages stay out of the virtual environment,
    which the student's code can read)."""
    import tomllib
    with open(ROOT / "pyproject.toml", "rb") as f:
        return list(tomllib.load(f)["project"]["dependencies"])


def _add_tree(zf: zipfile.ZipFile, folder: Path, name: str) -> None:
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder)
        if path.is_file() and not any(p in ("__pycache__", ".ipynb_checkpoints") for p in rel.parts) \
                and path.suffix != ".pyc":
            zf.write(path, f"{name}/{rel.as_posix()}")


def _add_text(zf: zipfile.ZipFile, name: str, text: str | bytes, mode: int = 0o644) -> None:
    info = zipfile.ZipInfo(name, date_time=time.localtime()[:6])
    info.external_attr = (stat.S_IFREG | mode) << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    zf.writestr(info, text)


_GRADEBOOK_HERE = '''
# workbook gradescope: the gradebook of one submission, a SQLite file in the container
import os as _workbook_os
c.CourseDirectory.db_url = "sqlite:///" + _workbook_os.path.join(
    _workbook_os.path.dirname(_workbook_os.path.abspath(__file__)), "grading", "gradebook.db")
'''


def build(course: Course, assignment: str, out: Path, hidden: str = "after_published", timeout_minutes: int = 10,
          memory_mb: int = 2048, cell_timeout: int | None = None) -> dict:
    """Write ``out``, the Gradescope autograder of ``assignment``; return its settings.

    ``hidden``: when students see the hidden checks' results (one of
    :data:`HIDDEN_VISIBILITIES`); ``timeout_minutes``: the assignment's autograder timeout
    on Gradescope (the notebook's limit is that less :data:`STARTUP_MARGIN_S`);
    ``memory_mb``: the student's processes' memory limit (the container needs more: see
    docs/gradescope.md)."""
    from ...course.release import assignments
    if hidden not in HIDDEN_VISIBILITIES:
        raise CourseError(f"--hidden {hidden!r}: one of {', '.join(HIDDEN_VISIBILITIES)}")
    if assignment not in assignments(course):
        raise CourseError(f"no assignment {assignment!r} in {course.source_dir}; known: "
                          f"{', '.join(assignments(course)) or 'none'}")
    notebook_timeout = timeout_minutes * 60 - STARTUP_MARGIN_S
    if notebook_timeout < 60:
        raise CourseError(f"a Gradescope timeout of {timeout_minutes} min leaves no time to grade (at least "
                          f"{(STARTUP_MARGIN_S + 60) // 60 + 1} min)")
    cell = min(cell_timeout or int(course.setting("Execute", "timeout", 300)), notebook_timeout)
    source = course.source_dir / assignment
    settings = {
        "assignment": assignment,
        "notebooks": sorted(p.stem for p in source.glob("*.ipynb")),
        "hidden_visibility": hidden,
        "timeout_minutes": timeout_minutes,
        "limits": {"cell_timeout": cell, "notebook_timeout": notebook_timeout, "memory_mb": memory_mb},
        "threads": 1,
        "built": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
        _add_text(zf, "setup.sh", (TEMPLATES / "setup.sh").read_text(), 0o755)
        _add_text(zf, "run_autograder", (TEMPLATES / "run_autograder").read_text(), 0o755)
        _add_tree(zf, ROOT / "autograder", "autograder")
        _add_tree(zf, ROOT / "course_lib", "course_lib")
        config = (course.root / "nbgrader_config.py").read_text(encoding="utf-8")
        _add_text(zf, "course/nbgrader_config.py", config + _GRADEBOOK_HERE)
        _add_tree(zf, source, f"course/{course.source_dir.name}/{assignment}")
        _add_text(zf, "requirements.txt", "\n".join(_requirements()) + "\n")
        _add_text(zf, "constraints.txt", (ROOT / "constraints.txt").read_text())
        _add_text(zf, SETTINGS, json.dumps(settings, indent=1) + "\n")
        _add_text(zf, "secret", secrets.token_bytes(32), 0o600)
    os.replace(tmp, out)
    return settings


# ---------------------------------------------------------------------------
# Prepare (setup.sh, once per image)
# ---------------------------------------------------------------------------

def prepare(source: Path) -> Course:
    """Release the assignment once in ``source/course`` (the gradebook learns its cells),
    put the autograder's secret in its place, and make ``source`` root's alone."""
    from ...course.release import release
    settings = json.loads((source / SETTINGS).read_text())
    course = Course(source / "course")
    for name in ("grading", course.release_dir.name):
        shutil.rmtree(course.root / name, ignore_errors=True)
    course.grading_dir.mkdir(parents=True, exist_ok=True)
    release([settings["assignment"]], course, record=True)
    secret = course.grading_dir / ".workbook-secret"
    shutil.copyfile(source / "secret", secret)
    secret.chmod(0o600)
    source.chmod(0o700)
    return course


# ---------------------------------------------------------------------------
# Run (run_autograder, once per submission)
# ---------------------------------------------------------------------------

def _number(value: Any) -> float:
    """A score as results.json may hold it: finite, 4 decimals (strict JSON has no NaN)."""
    value = float(value or 0.0)
    return round(value, 4) if math.isfinite(value) else 0.0


def _text(value: Any, limit: int = MAX_OUTPUT) -> str:
    """A string for results.json: no control or bidirectional characters but newlines and
    tabs, no lone surrogates, cut at ``limit``."""
    from ...doors.outbound import clean_text
    text = clean_text(str(value))
    return text if len(text) <= limit else text[:limit] + "\n… (cut here)"


def _lock_down(root: Path) -> None:
    """``root`` (/autograder: the source, the submission, its metadata, the results) and
    the folders in it become root's alone: the student's user may enter none of them."""
    for path in (root, root / "source", root / "results", root / "submission", root / "submission_metadata.json"):
        if path.exists() and not path.is_symlink():
            path.chmod(0o700 if path.is_dir() else 0o600)


def _student(metadata: dict) -> str:
    """The submitter's id in the gradebook: Gradescope's user id (the first user of a group)."""
    from ...doors.intake import Refused, student_id
    users = metadata.get("users") or [{}]
    raw = str((users[0] or {}).get("id", "")) if isinstance(users[0], dict) else ""
    try:
        return student_id(f"gs{raw}") if raw else "student"
    except Refused:
        return "student"


def _due(metadata: dict) -> dt.datetime | None:
    """The due date, from Gradescope's metadata: the submitter's own (an extension) if set."""
    from ...doors.intake import parse_time
    users = metadata.get("users") or []
    own = ((users[0] or {}).get("assignment") or {}).get("due_date") if users and isinstance(users[0], dict) else None
    text = own or (metadata.get("assignment") or {}).get("due_date")
    return parse_time(text) if isinstance(text, str) else None


def _stage(submission: Path, dest: Path, budget: int) -> None:
    """Copy the submission into ``dest`` for collect: folders and regular files as they
    are, links as links (collect refuses them, with the reason), nothing else; stops at
    ``budget`` bytes (collect then refuses what is over its limit)."""
    dest.mkdir(parents=True)
    used = 0
    for top, dirs, files in os.walk(submission, followlinks=False):
        rel_top = Path(top).relative_to(submission)
        for name in dirs + files:
            src, dst = Path(top) / name, dest / rel_top / name
            info = os.lstat(src)
            if stat.S_ISLNK(info.st_mode):
                os.symlink(os.readlink(src), dst)
            elif stat.S_ISDIR(info.st_mode):
                dst.mkdir()
            elif stat.S_ISREG(info.st_mode) and used <= budget:
                fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
                with os.fdopen(fd, "rb") as f, open(dst, "wb") as g:
                    data = f.read(budget + 1 - used)
                    used += len(data)
                    g.write(data)
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(top, d))]


def run(root: Path, env: dict[str, str] | None = None) -> dict:
    """Grade the submission in ``root/submission`` and write ``root/results/results.json``
    (always: a failure of the grader's own is written as a result that says so). Returns
    the results."""
    env = dict(os.environ if env is None else env)
    started = time.monotonic()
    results_path = root / "results" / "results.json"
    results_path.parent.mkdir(parents=True, exist_ok=True)
    if results_path.exists() or results_path.is_symlink():
        results_path.unlink()
    isolation, uid = "", None
    try:
        _lock_down(root)
        settings = json.loads((root / "source" / SETTINGS).read_text())
        # as asked, or (auto) bubblewrap where it starts, else container mode (as root), else none
        isolation = resolve(env.get("WORKBOOK_ISOLATION") or "auto", setting="WORKBOOK_ISOLATION")
        user_name = env.get("WORKBOOK_STUDENT_USER") or DEFAULT_USER
        if isolation == "container":
            try:
                uid = pwd.getpwnam(user_name).pw_uid  # (a missing user: autograde says how to make one)
            except KeyError:
                pass
        results = _grade(root, settings, isolation, user_name)
    except Exception as exc:  # the grader's own failure: say so, never leave Gradescope without results
        traceback.print_exc(file=sys.stdout)
        results = {"score": 0.0, "output": "The autograder could not grade this submission "
                                           f"({_text(type(exc).__name__, 100)}: {_text(exc, 500)}). "
                                           "Your instructor sees the details; please tell them.",
                   "tests": []}
    if uid is not None and uid != 0:  # nothing of the student's runs while results.json is written
        from ...sealing.container import kill_user, remove_user_files
        survivors = kill_user(uid)
        remove_user_files(uid)
        if survivors:
            print(f"processes of the student's user still there after SIGKILL: {survivors}")
    results.update(execution_time=int(round(time.monotonic() - started)), output_format="text",
                   test_output_format="text", test_name_format="text", stdout_visibility="hidden")
    results.setdefault("extra_data", {})["isolation"] = isolation
    text = json.dumps(results, indent=1, ensure_ascii=False, allow_nan=False)
    tmp = results_path.with_name(".results.json.tmp")
    tmp.write_text(text + "\n", encoding="utf-8")
    os.replace(tmp, results_path)
    print(f"results.json written: {results['score']:g} points, isolation {isolation or 'none'}, "
          f"{results['execution_time']} s")
    return results


def _grade(root: Path, settings: dict, isolation: str, user_name: str) -> dict:
    from ...pipeline.autograde import autograde
    from ...pipeline.options import GradingOptions
    from ...pipeline.collect import collect
    from ...doors.intake import parse_time
    from ...sealing.sandbox import Limits
    from ...course.settings import intake_limits

    metadata = read_json(root / "submission_metadata.json", {}) or {}
    student, assignment = _student(metadata), settings["assignment"]
    work = root / "work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(mode=0o700)
    shutil.copytree(root / "source" / "course", work / "course")
    course = Course(work / "course")
    submission = root / "submission"
    if submission.is_dir() and not submission.is_symlink():
        _stage(submission, work / "incoming" / student, intake_limits(course).unpacked_bytes)
    else:
        (work / "incoming" / student).mkdir(parents=True)
    created = metadata.get("created_at")
    when = parse_time(created) if isinstance(created, str) else None
    try:
        found = collect(course, work / "incoming", assignment, roster={student},
                        time_from="given" if when else "none", given=when)
    except CourseError as exc:  # an empty submission: nothing to import
        found = None
        print(f"collect: {exc}")
        (course.submission_dir(student, assignment)).mkdir(parents=True, exist_ok=True)
    if found is not None:
        for line in found.errors + found.ignored:
            print(f"collect: {line}")
    with course.gradebook() as gb:
        gb.update_or_create_assignment(assignment, duedate=_due(metadata))
    limits = Limits(**settings["limits"])
    options = GradingOptions(workers=1, limits=limits, threads_per_kernel=settings.get("threads", 1),
                             students=[student], isolation=isolation, container_user=user_name, in_process=True)
    print(f"grading {assignment} of {student} ({isolation}), limits {limits}")
    autograde(course, assignment, options)
    return results_for(course, assignment, student, settings["hidden_visibility"])


def _parts(item: str, data: dict | None, score: float, max_score: float) -> list[tuple[str, float, float, str]]:
    """An item's tests: ``(which, score, max_score, output)`` for its visible checks and for
    its hidden ones (either left out when it has none)."""
    from course_lib.grading import get_spec
    from course_lib.grading.runner import ItemResult, format_report

    from ...pipeline.judge import not_checked
    if data is None:  # nothing ran (a rejected or unreadable submission): the spec's points
        try:
            subs = [(s.hidden, float(s.points)) for s in get_spec(item).subchecks]
        except KeyError:
            subs = [(False, max_score)]
        out = []
        for hidden in (False, True):
            points = sum(p for h, p in subs if h == hidden)
            if points or any(h == hidden for h, _ in subs):
                out.append(("hidden" if hidden else "visible", 0.0, points, "Not graded: see the notes above."))
        return out
    result = ItemResult.from_data(data)
    reason = not_checked(result)
    out = []
    visible_score = 0.0
    for hidden in (False, True):
        subs = [r for r in result.results if r.hidden == hidden]
        if not subs:
            continue
        points = float(sum(r.points for r in subs))
        part = ItemResult(result.item, subs, True, points, result.reference_used,
                          list(result.notes) if not hidden else [])
        if hidden:  # the rest of the item's score as the gradebook holds it
            earned = min(max(score - visible_score, 0.0), points)
        else:
            earned = visible_score = min(part.earned, score)
        text = format_report(part)
        if reason and reason not in text:
            text = reason + "\n" + text
        out.append(("hidden" if hidden else "visible", earned, points, text))
    return out


def results_for(course: Course, assignment: str, student: str, hidden_visibility: str) -> dict:
    """Gradescope's results of ``student``'s graded ``assignment`` (as the gradebook, the
    report and the autograded notebook hold it): see the module docstring."""
    import nbformat
    from nbgrader import utils as nbutils
    from nbgrader.api import MissingEntry

    from ...reports.feedback import grading_notes, lateness
    from ...course.release import recorded_notebooks
    report = read_json(course.report_path(assignment, student), {}) or {}
    tests: list[dict] = []
    notes: list[str] = []
    total = 0.0
    extra: dict[str, Any] = {"student": student, "notebooks": {}}
    with course.gradebook() as gb:
        for notebook in recorded_notebooks(course, assignment):
            record = report.get("notebooks", {}).get(notebook, {})
            cells = {c["grade_id"]: c for c in record.get("cells", [])}
            items = record.get("items", {})
            try:
                sub = gb.find_submission_notebook(notebook, assignment, student)
                penalty = float(sub.late_submission_penalty or 0.0)
                scores = {g.name: float(g.score or 0.0) for g in sub.grades}
                score = float(sub.score) - penalty
            except MissingEntry:
                penalty, scores, score = 0.0, {}, 0.0
            total += score
            released = nbformat.read(str(course.release_dir / assignment / f"{notebook}.ipynb"), as_version=4)
            graded_path = course.autograded_path(student, assignment, notebook)
            answers = {}
            if graded_path.is_file():
                for cell in nbformat.read(str(graded_path), as_version=4).cells:
                    gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
                    if cell.cell_type == "markdown" and gid:
                        answers[gid] = cell.source
            written = 0.0
            for cell in released.cells:
                meta = cell.get("metadata", {}).get("nbgrader", {})
                gid = meta.get("grade_id", "")
                if not nbutils.is_grade(cell):
                    continue
                points = float(meta.get("points", 0) or 0)
                number = len({t["number"].split(".")[0] for t in tests}) + 1
                if cell.cell_type == "markdown":
                    written += points
                    answer = answers.get(gid, "").strip()
                    tests.append({"name": f"{notebook}: written answer {gid} ({points:g} points, graded by a person)",
                                  "number": str(number), "visibility": "visible",
                                  "output": _text(answer or "(no answer was written)")})
                    continue
                item = gid.removeprefix("test_")
                got = scores.get(gid, float(cells.get(gid, {}).get("score", 0.0)))
                for which, earned, max_score, output in _parts(item, items.get(item), got, points):
                    label = "visible checks (as in your notebook)" if which == "visible" else "hidden checks"
                    tests.append({"name": f"{notebook}: {item}: {label}", "number": f"{number}.{1 + (which == 'hidden')}",
                                  "score": _number(earned), "max_score": _number(max_score),
                                  "visibility": "visible" if which == "visible" else hidden_visibility,
                                  "output": _text(output)})
            automatic = sum(float(c.get("max_score", 0)) for c in record.get("cells", [])) or \
                sum(float(c.metadata.nbgrader.get("points", 0) or 0) for c in released.cells
                    if nbutils.is_grade(c) and c.cell_type == "code")
            line = f"{notebook}: {score:g} of {automatic:g} points from the checks"
            if written:
                line += f"; the written answers ({written:g} points) are graded by a person"
            notes.append(line + ".")
            late = lateness(course.db_url, assignment, notebook, student) if record else {}
            shown = grading_notes(record or {"notebook": notebook}, late)
            if shown["late"]:
                notes.append(f"Late work: {shown['late']}")
            if record.get("unverified"):
                notes.append("Unverified: this submission was graded without sealing its code off from the grader; "
                             "the score may change when it is graded again.")
            problems = [p for p in shown["problems"] if p]
            if problems:
                notes.append("Found while grading:\n" + "\n".join(f"- {p}" for p in problems))
            extra["notebooks"][notebook] = {"score": _number(score), "late_penalty": _number(penalty),
                                            "status": record.get("status", "not graded")}
    return {"score": _number(total), "output": _text("\n\n".join(notes)), "tests": tests, "extra_data": extra}


# ---------------------------------------------------------------------------
# Command line (setup.sh and run_autograder call these)
# ---------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autograder.platforms.gradescope.in_container", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("prepare", help="release the assignment in the autograder's source folder (setup.sh)") \
        .add_argument("source")
    sub.add_parser("run", help="grade /autograder/submission into /autograder/results/results.json") \
        .add_argument("root", nargs="?", default=os.environ.get("WORKBOOK_AUTOGRADER_ROOT", "/autograder"))
    args = parser.parse_args(argv)
    if args.command == "prepare":
        course = prepare(Path(args.source).resolve())
        print(f"released {', '.join(p.name for p in course.release_dir.iterdir())} in {course.root}")
        return 0
    run(Path(args.root).resolve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
