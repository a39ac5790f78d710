"""What runs inside Gradescope's container, from the zip autograder/platforms/gradescope/build.py
made: :func:`prepare` (``setup.sh``, once per image: the assignment released, the secret in
its place) and :func:`grade_submission` (``run_autograder``, once per submission), by the same
checks and the same sealed runner as ``workbook autograde``.

A submission is collected (autograder/pipeline/collect.py: the same door, renamed notebooks
recognised, its time from Gradescope's ``submission_metadata.json``, the due date from
there too), graded by :func:`autograder.pipeline.autograde.autograde` and written as Gradescope's
``results.json`` (autograder/platforms/gradescope/results.py), always: a failure of the grader's
own is a result that says so.

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

import datetime as dt
import json
import os
import pwd
import shutil
import stat
import sys
import time
import traceback
from pathlib import Path

from ...course import Course, CourseError, read_json
from ...doors.intake import MAX_DEPTH
from ...sealing import trees
from ...sealing.isolation import resolve
from . import DEFAULT_USER, SETTINGS
from .results import plain_text, results_for

__all__ = ["prepare", "grade_submission"]


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
    for top, dirs, files in trees.walk(submission):  # (no recursion: a folder a thousand levels deep is fine)
        rel_top = Path(top).relative_to(submission)
        if len(rel_top.parts) > MAX_DEPTH:  # collect refuses what is deeper, named by the first level past it
            dirs[:] = []
        for name in dirs + files:
            src, dst = Path(top) / name, dest / rel_top / name
            try:
                info = os.lstat(src)
            except OSError:  # (a path past the system's limit)
                continue
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


def grade_submission(root: Path, env: dict[str, str] | None = None) -> dict:
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
        if isolation.one_user:
            try:
                uid = pwd.getpwnam(user_name).pw_uid  # (a missing user: autograde says how to make one)
            except KeyError:
                pass
        results = _grade(root, settings, isolation, user_name)
    except Exception as exc:  # the grader's own failure: say so, never leave Gradescope without results
        traceback.print_exc(file=sys.stdout)
        results = {"score": 0.0, "output": "The autograder could not grade this submission "
                                           f"({plain_text(type(exc).__name__, 100)}: {plain_text(exc, 500)}). "
                                           "Your instructor sees the details; please tell them.",
                   "tests": []}
    if uid is not None and uid != 0:  # nothing of the student's runs while results.json is written
        left = _clean_up_user(uid)
        if left:  # the instructor's to look into (this log is theirs alone); never the student's fault
            results.setdefault("extra_data", {})["cleanup"] = left
    results.update(execution_time=int(round(time.monotonic() - started)), output_format="text",
                   test_output_format="text", test_name_format="text", stdout_visibility="hidden")
    results.setdefault("extra_data", {})["isolation"] = getattr(isolation, "value", isolation)
    text = json.dumps(results, indent=1, ensure_ascii=False, allow_nan=False)
    tmp = results_path.with_name(".results.json.tmp")
    tmp.write_text(text + "\n", encoding="utf-8")
    os.replace(tmp, results_path)
    print(f"results.json written: {results['score']:g} points, isolation {getattr(isolation, 'value', isolation) or 'none'}, "
          f"{results['execution_time']} s")
    return results


def _clean_up_user(uid: int) -> str:
    """Kill every process of the student's user and remove what it left where every user may
    write (autograder/sealing/container.py); what could not be done, in words ('' when all went).
    Never raises: results.json is written whatever the student's files are."""
    from ...sealing.container import kill_user, remove_user_files
    try:
        survivors = kill_user(uid)
        removal = remove_user_files(uid, pwd.getpwuid(uid).pw_gid)
        left = [f"processes of the student's user survived SIGKILL: {survivors}"] if survivors else []
        if not removal.complete:
            left.append(f"what the student's code left could not all be removed: {removal.summary()}")
    except Exception as exc:  # a fault of the grader's own
        traceback.print_exc(file=sys.stdout)
        left = [f"the clean-up failed: {type(exc).__name__}: {exc}"]
    text = plain_text("; ".join(left), 2000)
    if text:
        print(f"clean-up: {text}")
    return text


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
    trees.remove_tree(work)
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
