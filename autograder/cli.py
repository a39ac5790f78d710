"""``workbook``: the instructor's one command, from release to grades.

    workbook check                            is this machine ready to grade? (the sandbox, the gradebook, the exchange)
    workbook gradebook migrate                copy grading/gradebook.db into db_url's database
    workbook student-edition OUT              the repository students receive (no solutions, no hidden tests)
    workbook release [ASSIGNMENT] [--check]   regenerate notebooks/, record it in the gradebook
                                              (--check: only check notebooks/ is in sync)
    workbook collect SOURCE [-a ASSIGNMENT]   import submissions (folder, LMS download, zip)
    workbook collect --exchange ASSIGNMENT    import them from nbgrader's exchange (a hub)
    workbook autograde [ASSIGNMENT ...]       grade in parallel, each submission sealed off
    workbook feedback [ASSIGNMENT ...] [-j N] per-student HTML (no hidden test code)
    workbook export [-o FILE]                 grades CSV: every notebook and the total
    workbook export --format canvas --roster EXPORT.csv   an LMS's grade import (canvas, moodle, blackboard)
    workbook gradescope ASSIGNMENT -o ZIP     the assignment as a Gradescope autograder
    workbook status [ASSIGNMENT ...]          students × notebooks, with the problems
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
import csv
import io
import sys
from pathlib import Path

from .course import Course, CourseError
from .doors.intake import shown

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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="workbook", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("--course", help="the course folder (default: the nearest folder with nbgrader_config.py)")
    sub = parser.add_subparsers(dest="command", required=True)

    sub.add_parser("check", help="is this machine ready to grade? (the grading sandbox, the gradebook, the exchange)")

    p = sub.add_parser("student-edition", help="write the repository students receive: notebooks, course_lib "
                                               "without hidden checks, the README's student part; no solutions")
    p.add_argument("out", help="a new folder")
    p.add_argument("--install-url", help="where students' Colab installs the course from (the edition's git URL "
                                         "or an archive of it): each notebook gets a first cell that runs "
                                         "`pip install URL` on Colab and does nothing elsewhere")

    p = sub.add_parser("gradebook", help="gradebook housekeeping: `gradebook migrate` copies the SQLite gradebook "
                                         "into the database db_url names (e.g. PostgreSQL)")
    p.add_argument("action", choices=["migrate"])
    p.add_argument("--from", dest="source", help="the gradebook to copy (default: sqlite:///grading/gradebook.db)")
    p.add_argument("--to", dest="target", help="the empty gradebook to fill (default: db_url of nbgrader_config.py)")

    p = sub.add_parser("release", help="regenerate the student notebooks from solutions/")
    p.add_argument("assignment", nargs="?")
    p.add_argument("--check", action="store_true", help="only check that notebooks/ is in sync")

    p = sub.add_parser("collect", help="import submissions from a folder, an LMS download or nbgrader's exchange")
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

    p = sub.add_parser("autograde", help="autograde submissions in parallel")
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
    p.add_argument("--force", action="store_true",
                   help="grade again submissions already graded with the same notebook, course and limits")
    p.add_argument("--gpu", action="store_true", help="let submissions use the NVIDIA GPUs (checks run on CUDA)")
    p.add_argument("--unsafe-no-sandbox", action="store_true",
                   help="grade without the bubblewrap sandbox (every grade is marked unverified)")
    p.add_argument("--scheduler", metavar="ADDRESS",
                   help="grade on the Dask cluster of this scheduler (e.g. tcp://10.0.0.5:8786; default: "
                        "c.Workbook.scheduler in nbgrader_config.py, else local processes)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")

    p = sub.add_parser("feedback", help="write per-student feedback HTML")
    p.add_argument("assignments", nargs="*")
    p.add_argument("-s", "--student", action="append")
    p.add_argument("-j", "--workers", type=_positive, help="students rendered at once (default: one per core)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")

    p = sub.add_parser("export", help="write the grades CSV, or an LMS's grade-import file")
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

    p = sub.add_parser("gradescope", help="build a Gradescope autograder (setup.sh, run_autograder) that grades "
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

    p = sub.add_parser("html", help="a notebook as one offline HTML page: math as MathML, each widget as the "
                                    "picture it last showed, no script (nbconvert's page needs the web)")
    p.add_argument("notebook", help="the .ipynb file (a student's work/ copy, a solution, an autograded one)")
    p.add_argument("-o", "--output", help="the page to write (default: beside the notebook, .html)")
    p = sub.add_parser("status", help="table of students × notebooks (one block an assignment where one table "
                                      "would not fit the terminal)")
    p.add_argument("assignments", nargs="*")
    p.add_argument("--wide", action="store_true", help="one table, however wide")

    p = sub.add_parser("due", help="show the due dates, or set one (late work is marked, and penalised as "
                                   "nbgrader_config.py says)")
    p.add_argument("assignment", nargs="?")
    p.add_argument("date", nargs="?", help='e.g. "2026-12-01 23:59 Europe/Berlin" (UTC when no zone is given); '
                                           '"none" removes it')

    p = sub.add_parser("report", help="what the class got wrong: an offline HTML page with its data")
    p.add_argument("assignments", nargs="*", help="default: every assignment in the gradebook")
    p.add_argument("-o", "--output", help="folder (default: grading/class-report)")
    p.add_argument("--names", action="store_true",
                   help="show student ids (default: students are numbered, so the page can be shown to the class)")

    p = sub.add_parser("similarity", help="which answers look copied from each other or from course_lib, per "
                                          "graded item, offline: a CSV and an HTML page side by side")
    p.add_argument("assignment")
    p.add_argument("--csv", help="the CSV to write (default: grading/similarity/ASSIGNMENT/similarity.csv)")
    p.add_argument("--html", help="the folder of the page, index.html (default: grading/similarity/ASSIGNMENT)")
    p.add_argument("--threshold", type=float, default=0.5,
                   help="similarity (0 to 1) from which a pair is flagged (default 0.5)")

    p = sub.add_parser("formgrader", help="grade the written answers in nbgrader's Formgrader (opens JupyterLab; "
                                          "JupyterLab options such as --port or --no-browser pass through)")
    p.add_argument("assignment", nargs="?", help="open on this assignment's submissions")
    p.add_argument("--hub", action="store_true",
                   help="run as a JupyterHub service (the course's Formgrader on a hub: deploy/jupyterhub), "
                        "its users signed in by the hub")

    sub.add_parser("scheduler", help="start a Dask scheduler for `autograde --scheduler` (`dask scheduler`'s "
                                     "options pass through), with settings that leave the cores to grading")
    p = sub.add_parser("worker", help="start a Dask worker that grades with this course (`dask worker`'s options "
                                      "pass through: --nworkers 2 --nthreads 1)")
    p.add_argument("address", help="the scheduler, e.g. tcp://10.0.0.5:8786")
    return parser


def _lms_export(course: Course, args: argparse.Namespace) -> int:
    from .platforms.lms import lms_export
    explicit = {}
    for item in args.column:
        notebook, sep, header = item.partition("=")
        if not sep or not notebook or not header:
            raise CourseError(f"--column {shown(item)}: write it NOTEBOOK=HEADER")
        explicit[notebook] = header
    to_terminal = args.output == "-"
    target = None if to_terminal or not args.output else Path(args.output)
    text, notes = lms_export(course, args.format, args.roster, args.assignments or None, explicit, target,
                             write=not to_terminal)
    _wrote(text, target or course.grading_dir / f"grades-{args.format}.csv", to_terminal)
    for note in notes:
        print(f"{args.format}: {note}", file=sys.stderr)
    return 0


def _wrote(text: str, target: Path, to_terminal: bool) -> None:
    """The CSV on the terminal (``-o -``), or one line saying what was written where."""
    if to_terminal:
        print(text, end="")
        return
    lines = text.splitlines()
    columns = len(next(csv.reader(lines[:1]), []))
    print(f"wrote {target}: {max(len(lines) - 1, 0)} rows, {columns} columns")


def _check(course: Course) -> int:
    """What `make setup` runs last: whether `workbook autograde` can seal submissions off here,
    whether the gradebook opens, and whether nbgrader's exchange is the grader's (no folder of it a
    student's: :func:`autograder.pipeline.exchange.exchange_problems`); each problem with its fix."""
    from .sealing.sandbox import SandboxUnavailable, check_available
    ready = True
    try:
        bwrap = check_available()
        from .pipeline.worker import seal_check
        ready, how = seal_check()
        print(f"sandbox: ready (bubblewrap at {bwrap}; each notebook {how})" if ready else f"sandbox: NOT READY: {how}")
    except SandboxUnavailable as exc:
        print(f"sandbox: NOT READY: {exc}")
        ready = False
    gradebook, words = course.gradebook_ready()
    print(f"gradebook: {words}")
    ready = ready and gradebook
    from .pipeline.exchange import exchange_inbound, exchange_problems
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


def _release(course: Course, args: argparse.Namespace) -> int:
    from .course import release
    which = [args.assignment] if args.assignment else None
    if which and which[0] not in release.assignments(course):
        raise CourseError(f"no assignment {which[0]!r} in {course.source_dir}; known: "
                          f"{', '.join(release.assignments(course))}")
    if args.check:
        return release.check(course, which, "workbook release")
    for path in release.release(which, course, record=True):  # generated once, and recorded
        print(f"generated {path.relative_to(course.root)} and recorded it in the gradebook")
    return 0


def _collect(course: Course, args: argparse.Namespace) -> int:
    from .course import write_json_atomic
    from .pipeline.collect import collect, collect_exchange
    from .platforms.lms_roster import roster_file_names
    from .reports.status import missing_words
    names = roster_file_names(args.roster) if args.roster else None
    roster = set(names) if names is not None else None
    if args.exchange:
        clash = [flag for flag, given in (("SOURCE", args.source), ("--pattern", args.pattern),
                                          ("--timezone", args.timezone)) if given]
        if args.assignment and args.assignment != args.exchange:
            clash.append("-a")
        if clash:
            raise CourseError(f"--exchange reads the exchange's inbound folder: {', '.join(clash)} cannot be given "
                              "with it")
        result = collect_exchange(course, args.exchange, roster=roster, dry_run=args.dry_run,
                                  time_from=args.time_from or "files")
    else:
        if not args.source:
            raise CourseError("say where the submissions are: a folder or a .zip (or --exchange ASSIGNMENT for "
                              "nbgrader's exchange on a hub)")
        result = collect(course, args.source, args.assignment, roster=roster, pattern=args.pattern,
                         dry_run=args.dry_run, time_from=args.time_from or "none", timezone=args.timezone)
    verb = "would import" if args.dry_run else "imported"
    for student, notebooks in sorted(result.imported.items()):
        when = result.times.get(student, {}).get("time")
        notes = "".join(f"\n    note: {shown(n['message'], 400)}" for n in result.notes.get(student, []))
        print(f"  {student}: {', '.join(notebooks)}" + (f" (handed in {when} UTC)" if when else "") + notes)
    for line in result.ignored:
        print(f"  ignored {shown(line, 400)}")
    for student, why in sorted(result.rejected.items()):
        print(f"  REJECTED {student}: {shown(why, 400)}", file=sys.stderr)
    for line in result.errors:
        print(f"  ERROR {shown(line, 400)}", file=sys.stderr)
    print(f"{verb} {len(result.imported)} students; {len(result.rejected)} rejected; {len(result.ignored)} files "
          f"ignored; {len(result.errors)} errors")
    if names is not None:
        if not args.dry_run:
            write_json_atomic(course.roster_path, {"source": str(args.roster), "students": names})
        for assignment in sorted({a for a in [args.exchange or args.assignment] if a} or
                                 set(course.submitted_assignments())):
            print(missing_words(course, assignment, names, result.imported))
    return 1 if result.errors or result.rejected else 0


def _autograde(course: Course, args: argparse.Namespace) -> int:
    from .course.settings import workbook_settings
    from .pipeline.dispatch import warm_up
    from .pipeline.options import GradingOptions
    from .sealing.sandbox import SandboxUnavailable
    assignments = args.assignments or course.submitted_assignments()
    if not assignments:
        raise CourseError(f"no submissions in {course.submitted_dir}: run `workbook collect` first")
    settings = workbook_settings(course, workers=args.workers, cell_timeout=args.cell_timeout,
                                 notebook_timeout=args.notebook_timeout, memory_mb=args.memory_mb,
                                 max_output_kb=args.max_output_kb, threads=args.threads, scheduler=args.scheduler)
    options = GradingOptions.from_settings(course, settings, students=args.student, gpu=args.gpu, force=args.force,
                                           unsafe_no_sandbox=args.unsafe_no_sandbox)
    warm_up(options)  # the workers' fork server imports torch and the checks while this process does too
    from .pipeline.autograde import autograde_assignments
    if args.unsafe_no_sandbox:
        print("warning: grading WITHOUT the sandbox: submissions' code runs with your privileges; every grade "
              "written is marked unverified.", file=sys.stderr)
    else:
        try:
            from .sealing.sandbox import check_available
            check_available()
        except SandboxUnavailable as exc:
            raise CourseError(f"cannot grade safely: {exc}") from None
    course.check_assignments(args.assignments, released=True)
    for assignment in assignments:
        course.check_submitted(assignment, args.student)
    counts = {a: {"kept": 0, "graded": 0} for a in assignments}
    sealed: dict[str, dict[str, int]] = {a: {} for a in assignments}  # how the notebooks graded now were sealed
    bar = None
    if not args.quiet:
        from tqdm.auto import tqdm
        from .pipeline.cluster import WorkerTally
        from .course.release import recorded_notebooks
        total = sum(len(args.student or course.submitted_students(a)) * len(recorded_notebooks(course, a))
                    for a in assignments)
        what = assignments[0] if len(assignments) == 1 else f"{len(assignments)} assignments"
        bar = tqdm(total=total, desc=f"autograde {what}", unit="notebook")
        tally = WorkerTally()

    def show(record: dict) -> None:
        counts[record["assignment"]]["kept" if record.get("status") == "kept" else "graded"] += 1
        if record.get("sealed"):
            ways = sealed[record["assignment"]]
            ways[record["sealed"]] = ways.get(record["sealed"], 0) + 1
        if bar is None:
            return
        bar.update(1)
        if record.get("worker"):  # graded on a cluster: done / failed / remaining per worker
            tally.add(record["worker"], record["status"] == "failed")
            bar.set_postfix_str(tally.line(bar.total - bar.n), refresh=True)
    # one batch for every assignment: one set of workers, none idle between two assignments
    graded = autograde_assignments(course, assignments, options, progress=show)
    if bar:
        bar.close()
    for assignment, reports in graded.items():
        print(f"{assignment}: {_graded_words(reports, counts[assignment])}")
        for how, n in sealed[assignment].items():
            print(f"  sealed off: {n} notebook{'s' if n != 1 else ''} {how}")
        for report in reports:
            for record in report["notebooks"].values():
                for p in record.get("problems", []):
                    if p["kind"] == "rejected":
                        print(f"  REJECTED {report['student']} {record['notebook']}: {shown(p['message'], 400)}")
        for why in course.refused_folders(assignment):
            print(f"  NOT GRADED {shown(why, 400)}")
    return 0


def _graded_words(reports: list[dict], counts: dict[str, int]) -> str:
    """What a run of autograde did, in words: what it graded, what it kept from an earlier run."""
    if not counts["graded"]:
        return (f"nothing new to grade; {len(reports)} students already graded with these notebooks, course and "
                "limits (`--force` grades them again)")
    failed = sum(1 for r in reports for n in r["notebooks"].values() if n["status"] == "failed")
    flagged = sum(1 for r in reports for n in r["notebooks"].values() if n["problems"])
    kept = f"; {counts['kept']} notebooks already graded were kept" if counts["kept"] else ""
    return (f"graded {counts['graded']} notebooks of {len(reports)} students ({failed} could not be graded, "
            f"{flagged} with problems; see `workbook status`){kept}")


def _feedback(course: Course, args: argparse.Namespace) -> int:
    from .reports.feedback import generate_feedback
    from .reports.similarity import default_jobs
    assignments = args.assignments or sorted(p.name for p in course.reports_dir.glob("*") if p.is_dir())
    if not assignments:
        raise CourseError("nothing graded yet: run `workbook autograde` first")
    for student in args.student or []:
        if not any(course.report_path(a, student).is_file() for a in assignments):
            raise CourseError(f"no graded work of student {student!r} in {', '.join(assignments)}")
    for assignment in assignments:
        bar = []

        def progress(n: int, assignment: str = assignment) -> None:
            if args.quiet:
                return
            if n:
                from tqdm.auto import tqdm
                bar.append(tqdm(total=n, desc=f"feedback {assignment}", unit="student"))
            elif bar:
                bar[0].update(1)
        written = generate_feedback(course, assignment, args.student, workers=args.workers or default_jobs(),
                                    progress=progress)
        if bar:
            bar[0].close()
        print(f"{assignment}: feedback for {len(written)} students in {course.feedback_dir}")
    return 0


def _due(course: Course, args: argparse.Namespace) -> int:
    from nbgrader.utils import parse_utc
    course.check_assignments([args.assignment] if args.assignment else None)
    with course.gradebook() as gb:
        if args.date is not None:
            if args.date.lower() == "none":
                when = None
            else:
                try:
                    when = parse_utc(args.date)
                except (ValueError, OverflowError) as exc:
                    raise CourseError(f"cannot read the date {args.date!r} ({exc}); "
                                      'write it like "2026-12-01 23:59 Europe/Berlin"') from None
            gb.update_or_create_assignment(args.assignment, duedate=when)
        names = [args.assignment] if args.assignment else sorted(a.name for a in gb.assignments)
        for name in names:
            due = gb.find_assignment(name).duedate
            print(f"{name}: {'due ' + due.strftime('%Y-%m-%d %H:%M UTC') if due else 'no due date'}")
    return 0


def _html(args: argparse.Namespace) -> int:
    from .reports.notebook_html import notebook_html
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


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and args.command not in ("formgrader", "scheduler", "worker"):  # these pass options on
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command in ("scheduler", "worker"):
        from .pipeline.cluster import exec_dask
        try:
            course = (Course(args.course) if args.course else Course()).root if args.command == "worker" else None
        except (CourseError, FileNotFoundError) as exc:
            print(f"workbook worker: {exc}", file=sys.stderr)
            return 2
        exec_dask(args.command, ([args.address] if args.command == "worker" else []) + extra, course)
    if args.command == "html":  # any notebook, in or out of a course folder
        return _html(args)
    try:
        course = Course(args.course) if args.course else Course()
        if args.command not in ("gradebook", "check", "student-edition"):
            from .course.migrate import check_switch
            check_switch(course)  # a gradebook moved to a server, the grades left behind: say so, every time
        if args.command in ("feedback", "export", "report", "status"):
            course.check_assignments(getattr(args, "assignments", None))
        if args.command == "check":
            return _check(course)
        if args.command == "student-edition":
            from .platforms.student_edition import write_edition
            for line in write_edition(course, Path(args.out), install_url=args.install_url):
                print(f"  {line}")
            print(f"student edition written to {args.out}: its README says how to start (make lab)")
            return 0
        if args.command == "gradebook":
            from .course.migrate import migrate
            copied = migrate(course, args.source, args.target)
            print("copied " + ", ".join(f"{n} {t}" for t, n in copied.items() if n) + " into the gradebook")
            return 0
        if args.command == "release":
            return _release(course, args)
        if args.command == "collect":
            return _collect(course, args)
        if args.command == "autograde":
            return _autograde(course, args)
        if args.command == "feedback":
            return _feedback(course, args)
        if args.command == "export":
            if args.format != "csv":
                return _lms_export(course, args)
            if args.roster or args.column:
                raise CourseError("--roster and --column go with an LMS --format (canvas, moodle, blackboard)")
            from .reports.grades import export_csv, grade_rows
            from .doors.outbound import write_csv
            if args.output == "-":
                columns, rows = grade_rows(course, args.assignments or None)
                _wrote(write_csv(io.StringIO(), rows, columns), Path("-"), True)
                return 0
            text = export_csv(course, args.output, args.assignments or None)
            _wrote(text, Path(args.output) if args.output else course.grading_dir / "grades.csv", False)
            return 0
        if args.command == "due":
            return _due(course, args)
        if args.command == "gradescope":
            from .platforms.gradescope.build import build
            settings = build(course, args.assignment, Path(args.output), hidden=args.hidden,
                             timeout_minutes=args.timeout_minutes, memory_mb=args.memory_mb,
                             cell_timeout=args.cell_timeout)
            limits = settings["limits"]
            print(f"{args.output}: Gradescope autograder of {args.assignment} ({', '.join(settings['notebooks'])}); "
                  f"hidden checks {settings['hidden_visibility']}; a notebook may run {limits['notebook_timeout']} s, "
                  f"a cell {limits['cell_timeout']} s, with {limits['memory_mb']} MB. On Gradescope: set the "
                  f"autograder timeout to {settings['timeout_minutes']} min and the memory as docs/gradescope.md says.")
            return 0
        if args.command == "report":
            from .reports.class_report import write_class_report
            page = write_class_report(course, args.output, args.assignments or None, names=args.names)
            print(f"class report: {page} (data: report.json and CSV files beside it)")
            return 0
        if args.command == "similarity":
            from .reports.similarity_report import similarity_report
            course.check_assignments([args.assignment], released=True)
            lines, csv_path, page = similarity_report(course, args.assignment, args.threshold,
                                                      Path(args.csv) if args.csv else None,
                                                      Path(args.html) if args.html else None)
            print("\n".join(lines) + f"\nCSV: {csv_path}\npage: {page}")
            return 0
        if args.command == "formgrader":
            from .platforms.formgrader import open_formgrader
            course.check_assignments([args.assignment] if args.assignment else None)
            return open_formgrader(course, args.assignment, extra, hub=args.hub)
        if args.command == "status":
            from .reports.status import status_table
            print(status_table(course, args.assignments or None, wide=args.wide))
            return 0
    except (CourseError, FileNotFoundError) as exc:
        print(f"workbook {args.command}: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
