"""``workbook``: the instructor's one command, from release to grades.

    workbook check                            is this machine ready to grade? (the sandbox, the gradebook, the exchange)
    workbook gradebook migrate                copy grading/gradebook.db into db_url's database
    workbook student-edition OUT              the repository students receive (no solutions, no hidden tests)
    workbook release [ASSIGNMENT] [--check]   regenerate notebooks/, record it in the gradebook
                                              (--check: only check notebooks/ is in sync)
    workbook collect SOURCE [-a ASSIGNMENT]   import submissions (folder, LMS download, zip)
    workbook collect --exchange ASSIGNMENT    import them from nbgrader's exchange (a hub)
    workbook autograde [ASSIGNMENT ...]       grade in parallel, each submission sealed off
    workbook regrade [ASSIGNMENT ...]         grade again after a fix to the course; what moved, as a CSV
                                              and a page (-s, --item, --dry-run, --keep-higher, --note)
    workbook feedback [ASSIGNMENT ...] [-j N] per-student HTML (no hidden test code)
    workbook export [-o FILE]                 grades CSV: every notebook and the total
    workbook export --format canvas --roster EXPORT.csv   an LMS's grade import (canvas, moodle, blackboard)
    workbook gradescope ASSIGNMENT -o ZIP     the assignment as a Gradescope autograder
    workbook status [ASSIGNMENT ...]          students × notebooks, with the problems
                                              (--history STUDENT: how each of their scores came to be)
    workbook due [ASSIGNMENT [DATE]]          show or set due dates (late work: nbgrader's penalty)
    workbook report [ASSIGNMENT ...]          what the class got wrong: an HTML page, JSON, CSV
                                              (--names: show student ids; default: numbered)
    workbook html NOTEBOOK [-o PAGE]          a notebook as one offline page (MathML, widgets as pictures)
    workbook similarity ASSIGNMENT            which answers look copied, per graded item (offline): a CSV
                                              and an HTML page (--csv FILE, --html FOLDER, --threshold X)
    workbook formgrader [ASSIGNMENT]          grade the written answers in nbgrader's Formgrader
                                              (JupyterLab options pass through: --port 8899;
                                              --hub: as a JupyterHub service, deploy/jupyterhub)
    workbook scheduler [OPTIONS]              a Dask scheduler for grading on many machines
    workbook worker ADDRESS [OPTIONS]         a Dask worker of this course (`dask worker`'s options
                                              pass through: --nworkers 2 --nthreads 1)

Run inside the course folder (the one with nbgrader_config.py) or pass --course.
"""

from __future__ import annotations

import argparse
import sys

from typing import Callable

from .commands import grading, machine, results
from .course import Course, CourseError

__all__ = ["main", "build_parser"]


def _memory(text: str) -> int | None:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected megabytes (0 for no limit), got {text}")
    return value


def _positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text}")
    return value


def _command(sub: argparse._SubParsersAction, name: str, handler: Callable[..., int], help: str,
             needs_course: bool = True, sees_grades: bool = True, checks_assignments: bool = False,
             passes_options: bool = False) -> argparse.ArgumentParser:
    """A subcommand and what :func:`main` does for it: ``handler(course, args, extra)``, with the
    course found first (``needs_course``), the gradebook's move checked (``sees_grades``), the
    named assignments checked (``checks_assignments``), options it does not know passed on
    (``passes_options``)."""
    p = sub.add_parser(name, help=help)
    p.set_defaults(handler=handler, needs_course=needs_course, sees_grades=needs_course and sees_grades,
                   checks_assignments=checks_assignments, passes_options=passes_options)
    return p


def _grading_arguments(p: argparse.ArgumentParser) -> None:
    """What ``autograde`` and ``regrade`` share: which submissions, the limits, where to grade."""
    p.add_argument("assignments", nargs="*", help="default: every assignment with submissions")
    p.add_argument("-s", "--student", action="append", help="only this student (repeatable)")
    # each limit's default comes from c.Workbook.<name> in nbgrader_config.py (autograder/course/settings.py)
    p.add_argument("-j", "--workers", type=_positive, help="worker processes (default: one per core)")
    p.add_argument("--cell-timeout", type=_positive, help="seconds per cell (default: Execute.timeout of the config)")
    p.add_argument("--notebook-timeout", type=_positive, help="seconds per notebook (default 1800)")
    p.add_argument("--memory-mb", type=_memory,
                   help="address-space limit of a notebook in MB (default 4096, none with --gpu: CUDA reserves "
                        "a large address space; 0: none)")
    p.add_argument("--max-output-kb", type=_positive, help="output kept per cell (default 256)")
    p.add_argument("--threads", type=_positive, help="CPU threads per notebook (default 1)")
    p.add_argument("--gpu", action="store_true", help="let submissions use the NVIDIA GPUs (checks run on CUDA)")
    p.add_argument("--unsafe-no-sandbox", action="store_true",
                   help="grade without the bubblewrap sandbox (every grade is marked unverified)")
    p.add_argument("--scheduler", metavar="ADDRESS",
                   help="grade on the Dask cluster of this scheduler (e.g. tcp://10.0.0.5:8786; default: "
                        "c.Workbook.scheduler in nbgrader_config.py, else local processes)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="workbook", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("--course", help="the course folder (default: the nearest folder with nbgrader_config.py)")
    sub = parser.add_subparsers(dest="command", required=True)

    _command(sub, "check", machine.check, sees_grades=False, help="is this machine ready to grade? (the grading sandbox, the gradebook, the exchange)")

    p = _command(sub, "student-edition", machine.student_edition, sees_grades=False, help="write the repository students receive: notebooks, course_lib "
                                               "without hidden checks, the README's student part; no solutions")
    p.add_argument("out", help="a new folder")
    p.add_argument("--install-url", help="where students' Colab installs the course from (the edition's git URL "
                                         "or an archive of it): each notebook gets a first cell that runs "
                                         "`pip install URL` on Colab and does nothing elsewhere")

    p = _command(sub, "gradebook", machine.gradebook, sees_grades=False, help="gradebook housekeeping: `gradebook migrate` copies the SQLite gradebook "
                                         "into the database db_url names (e.g. PostgreSQL)")
    p.add_argument("action", choices=["migrate"])
    p.add_argument("--from", dest="source", help="the gradebook to copy (default: sqlite:///grading/gradebook.db)")
    p.add_argument("--to", dest="target", help="the empty gradebook to fill (default: db_url of nbgrader_config.py)")

    p = _command(sub, "release", grading.release, help="regenerate the student notebooks from solutions/")
    p.add_argument("assignment", nargs="?")
    p.add_argument("--check", action="store_true", help="only check that notebooks/ is in sync")

    p = _command(sub, "collect", grading.collect, help="import submissions from a folder, an LMS download or nbgrader's exchange")
    p.add_argument("source", nargs="?", help="a folder or a .zip")
    p.add_argument("--exchange", metavar="ASSIGNMENT",
                   help="collect ASSIGNMENT from nbgrader's exchange (a hub's Assignments tab, nbgrader submit): "
                        "each student's latest submission, checked against the Unix account that wrote it "
                        "(c.Workbook.exchange_identity), dated by the file system")
    p.add_argument("-a", "--assignment", help="the assignment (needed unless the folders name it)")
    p.add_argument("--roster", help="file of student ids (one per line, or a CSV with an 'id' column)")
    p.add_argument("--pattern", help="regular expression with a (?P<student>...) group for LMS file names")
    p.add_argument("--dry-run", action="store_true", help="report what would be imported; write nothing")
    p.add_argument("--time-from", choices=("none", "name", "zip", "files", "collect"),
                   help="where each submission's time comes from (never the student's own timestamp.txt): the "
                        "LMS's file name (a (?P<time>...) group in --pattern, or Blackboard's <id>_attempt_<date>), "
                        "the download's zip entries, the files' change times in a folder the exchange wrote, or "
                        "now; default none: lateness unknown (with --exchange: files)")
    p.add_argument("--timezone", help="the zone of times without one (zip entries, LMS names; default UTC)")

    p = _command(sub, "autograde", grading.autograde, help="autograde submissions in parallel")
    _grading_arguments(p)
    p.add_argument("--force", action="store_true",
                   help="grade again submissions already graded with the same notebook, course and limits")

    p = _command(sub, "regrade", grading.regrade, help="grade submissions again with the course as it is now (after a "
                                                      "fix to a check, a reference or a hidden test) and report what "
                                                      "moved: grading/regrades/<time>-<assignment>.csv and .html")
    _grading_arguments(p)
    p.add_argument("--item", action="append", metavar="GRADE_ID",
                   help="only this item's points change (repeatable; causal_mask or test_causal_mask)")
    p.add_argument("--dry-run", action="store_true",
                   help="grade into a scratch copy of the gradebook: report what would change, write nothing")
    p.add_argument("--keep-higher", action="store_true", help="never lower an item's points (said in the report)")
    p.add_argument("--note", help="shown on the feedback of each student whose points moved")

    p = _command(sub, "feedback", grading.feedback, checks_assignments=True, help="write per-student feedback HTML")
    p.add_argument("assignments", nargs="*")
    p.add_argument("-s", "--student", action="append")
    p.add_argument("-j", "--workers", type=_positive, help="students rendered at once (default: one per core)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")

    p = _command(sub, "export", results.export, checks_assignments=True, help="write the grades CSV, or an LMS's grade-import file")
    p.add_argument("assignments", nargs="*",
                   help="the assignments to export (default: the csv format every assignment of the gradebook; an "
                        "LMS format the assignments with grades, so that the LMS makes no empty assignments)")
    p.add_argument("-o", "--output", help="the file to write (default: grading/grades.csv, grading/grades-<format>.csv "
                                          "for an LMS; - writes the CSV to the terminal instead)")
    p.add_argument("--format", choices=("csv", "canvas", "moodle", "blackboard"), default="csv",
                   help="csv: every column of the workbook; canvas, moodle, blackboard: that LMS's grade import "
                        "(a column per notebook, scores after the late penalty)")
    p.add_argument("--roster", help="the LMS's own export (Canvas's gradebook export, Moodle's grade export or "
                                    "participants list, Blackboard's Grade Center download): maps students and columns")
    p.add_argument("--column", action="append", default=[], metavar="NOTEBOOK=HEADER",
                   help="the LMS column of a notebook, as the LMS's export names it (repeatable)")

    p = _command(sub, "gradescope", results.gradescope, help="build a Gradescope autograder (setup.sh, run_autograder) that grades "
                                          "the assignment with the same checks, sealed off")
    p.add_argument("assignment")
    p.add_argument("-o", "--output", default="autograder.zip", help="the zip to write (default: autograder.zip)")
    p.add_argument("--hidden", choices=("after_published", "after_due_date", "hidden"), default="after_published",
                   help="when students see the hidden checks' results (default: after_published, when you "
                        "publish the grades; hidden: never, their points still count)")
    p.add_argument("--timeout-minutes", type=_positive, default=10,
                   help="the assignment's autograder timeout on Gradescope (default 10, Gradescope's own)")
    p.add_argument("--memory-mb", type=_positive, default=2048,
                   help="memory of the student's processes, all together (default 2048; Gradescope's container "
                        "needs more: docs/gradescope.md)")
    p.add_argument("--cell-timeout", type=_positive, help="seconds per cell (default: Execute.timeout of the config)")

    p = _command(sub, "html", machine.html, needs_course=False, help="a notebook as one offline HTML page: math as MathML, each widget as the "
                                    "picture it last showed, no script (nbconvert's page needs the web)")
    p.add_argument("notebook", help="the .ipynb file (a student's work/ copy, a solution, an autograded one)")
    p.add_argument("-o", "--output", help="the page to write (default: beside the notebook, .html)")
    p = _command(sub, "status", results.status, checks_assignments=True, help="table of students × notebooks (one block an assignment where one table "
                                      "would not fit the terminal)")
    p.add_argument("assignments", nargs="*")
    p.add_argument("--wide", action="store_true", help="one table, however wide")
    p.add_argument("--history", metavar="STUDENT",
                   help="how each of STUDENT's scores came to be: every grade recorded, when, by which course")

    p = _command(sub, "due", results.due, help="show the due dates, or set one (late work is marked, and penalised as "
                                   "nbgrader_config.py says)")
    p.add_argument("assignment", nargs="?")
    p.add_argument("date", nargs="?", help='e.g. "2026-12-01 23:59 Europe/Berlin" (UTC when no zone is given); '
                                           '"none" removes it')

    p = _command(sub, "report", results.report, checks_assignments=True, help="what the class got wrong: an offline HTML page with its data")
    p.add_argument("assignments", nargs="*", help="default: every assignment in the gradebook")
    p.add_argument("-o", "--output", help="folder (default: grading/class-report)")
    p.add_argument("--names", action="store_true",
                   help="show student ids (default: students are numbered, so the page can be shown to the class)")
    p.add_argument("--compare-regrades", nargs=2, metavar=("CSV", "CSV"),
                   help="compare the named mistakes after two regrades (the CSVs in grading/regrades/)")

    p = _command(sub, "similarity", results.similarity, help="which answers look copied from each other or from course_lib, per "
                                          "graded item, offline: a CSV and an HTML page side by side")
    p.add_argument("assignment")
    p.add_argument("--csv", help="the CSV to write (default: grading/similarity/ASSIGNMENT/similarity.csv)")
    p.add_argument("--html", help="the folder of the page, index.html (default: grading/similarity/ASSIGNMENT)")
    p.add_argument("--threshold", type=float, default=0.5,
                   help="similarity (0 to 1) from which a pair is flagged (default 0.5)")

    p = _command(sub, "formgrader", results.formgrader, passes_options=True, help="grade the written answers in nbgrader's Formgrader (opens JupyterLab; "
                                          "JupyterLab options such as --port or --no-browser pass through)")
    p.add_argument("assignment", nargs="?", help="open on this assignment's submissions")
    p.add_argument("--hub", action="store_true",
                   help="run as a JupyterHub service (the course's Formgrader on a hub: deploy/jupyterhub), "
                        "its users signed in by the hub")

    _command(sub, "scheduler", machine.dask_process, needs_course=False, passes_options=True, help="start a Dask scheduler for `autograde --scheduler` (`dask scheduler`'s "
                                     "options pass through), with settings that leave the cores to grading")
    p = _command(sub, "worker", machine.dask_process, sees_grades=False, passes_options=True, help="start a Dask worker that grades with this course (`dask worker`'s options "
                                      "pass through: --nworkers 2 --nthreads 1)")
    p.add_argument("address", help="the scheduler, e.g. tcp://10.0.0.5:8786")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and not args.passes_options:  # formgrader, scheduler and worker pass options on
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        course = (Course(args.course) if args.course else Course()) if args.needs_course else None
        if args.sees_grades:
            from .course.migrate import check_switch
            check_switch(course)  # a gradebook moved to a server, the grades left behind: say so, every time
        if args.checks_assignments:
            course.check_assignments(getattr(args, "assignments", None))
        return args.handler(course, args, extra)
    except (CourseError, FileNotFoundError) as exc:
        print(f"workbook {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
