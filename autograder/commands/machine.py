"""The commands about this machine and the course's setup: ``check``, ``student-edition``,
``gradebook migrate``, ``scheduler`` and ``worker`` (a Dask cluster), ``html`` (any notebook as
one offline page). Each takes the course (None where it needs none), the parsed arguments and
the options it passes on, and returns the exit status."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..course import Course
from ..doors.intake import shown

__all__ = ["check", "student_edition", "gradebook", "dask_process", "html"]


def check(course: Course, args: argparse.Namespace, extra: list[str]) -> int:
    """What `make setup` runs last: whether `workbook autograde` can seal submissions off here,
    whether the gradebook opens, and whether nbgrader's exchange is the grader's (no folder of it a
    student's: :func:`autograder.pipeline.exchange.exchange_problems`); each problem with its fix."""
    from ..sealing.sandbox import SandboxUnavailable, check_available
    ready = True
    try:
        bwrap = check_available()
        from ..pipeline.worker import seal_check
        ready, how = seal_check()
        print(f"sandbox: ready (bubblewrap at {bwrap}; each notebook {how})" if ready else f"sandbox: NOT READY: {how}")
    except SandboxUnavailable as exc:
        print(f"sandbox: NOT READY: {exc}")
        ready = False
    gradebook, words = course.gradebook_ready()
    print(f"gradebook: {words}")
    ready = ready and gradebook
    from ..pipeline.exchange import exchange_inbound, exchange_problems
    if course.course_id:
        exchange = exchange_inbound(course).parent
        untrusted = exchange_problems(course)
        if untrusted:
            print("exchange: NOT READY: " + "\n  ".join(untrusted))
            ready = False
        elif exchange.is_dir():
            print(f"exchange: ready ({exchange}: the grader's, with nbgrader's modes)")
        else:
            print(f"exchange: {exchange} is not made yet (`nbgrader release_assignment` makes it; on a hub, "
                  "deploy/jupyterhub/setup_course.py)")
    print("ready to grade" if ready else "not ready to grade: fix the lines above, then run `workbook check` again")
    return 0 if ready else 2



def student_edition(course: Course, args: argparse.Namespace, extra: list[str]) -> int:
    from ..platforms.student_edition import write_edition
    for line in write_edition(course, Path(args.out), install_url=args.install_url):
        print(f"  {line}")
    print(f"student edition written to {args.out}: its README says how to start (make lab)")
    return 0


def gradebook(course: Course, args: argparse.Namespace, extra: list[str]) -> int:
    from ..course.migrate import migrate
    copied = migrate(course, args.source, args.target)
    print("copied " + ", ".join(f"{n} {t}" for t, n in copied.items() if n) + " into the gradebook")
    return 0


def dask_process(course: Course | None, args: argparse.Namespace, extra: list[str]) -> int:
    """``dask scheduler`` or ``dask worker`` (of this course), their options passed on; replaces
    this process."""
    from ..pipeline.cluster import exec_dask
    exec_dask(args.command, ([args.address] if args.command == "worker" else []) + extra,
              course.root if course is not None else None)
    return 0


def html(course: None, args: argparse.Namespace, extra: list[str]) -> int:
    """Any notebook, in or out of a course folder, as one offline page."""
    from ..reports.notebook_html import notebook_html
    source = Path(args.notebook)
    if not source.is_file():
        print(f"workbook html: no notebook {shown(str(source), 300)}", file=sys.stderr)
        return 2
    target = Path(args.output) if args.output else source.with_suffix(".html")
    try:
        page = notebook_html(source)
    except Exception as exc:  # not a notebook nbformat can read
        print(f"workbook html: {shown(str(source), 300)} could not be read as a notebook: "
              f"{shown(f'{type(exc).__name__}: {exc}', 300)}", file=sys.stderr)
        return 2
    target.write_text(page, encoding="utf-8")
    print(f"wrote {target} ({len(page) // 1024} kB, offline: math as MathML, widgets as their last picture)")
    return 0
