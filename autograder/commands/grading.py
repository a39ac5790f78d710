"""The commands of grading, in the order a course runs them: ``release``, ``collect``,
``autograde``, ``feedback``, and ``regrade`` after a fix to the course. Each takes the course,
the parsed arguments and the options it passes on, and returns the exit status."""

from __future__ import annotations

import argparse
import sys

from ..course import Course, CourseError
from ..doors.intake import shown

__all__ = ["release", "collect", "autograde", "regrade", "feedback"]


def release(course: Course, args: argparse.Namespace, extra: list[str]) -> int:
    from ..course import release as releasing
    which = [args.assignment] if args.assignment else None
    if which and which[0] not in releasing.assignments(course):
        raise CourseError(f"no assignment {which[0]!r} in {course.source_dir}; known: "
                          f"{', '.join(releasing.assignments(course))}")
    if args.check:
        return releasing.check(course, which, "workbook release")
    for path in releasing.release(which, course, record=True):  # generated once, and recorded
        print(f"generated {path.relative_to(course.root)} and recorded it in the gradebook")
    return 0


def collect(course: Course, args: argparse.Namespace, extra: list[str]) -> int:
    from ..course import write_json_atomic
    from ..pipeline.collect import collect, collect_exchange
    from ..platforms.lms_roster import roster_file_names
    from ..reports.status import missing_words
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


def _grading(course: Course, args: argparse.Namespace, force: bool):
    """The assignments to grade and how (``autograde``'s and ``regrade``'s options), the sandbox
    checked, the workers warming up."""
    from ..course.settings import workbook_settings
    from ..pipeline.dispatch import warm_up
    from ..pipeline.options import GradingOptions
    from ..sealing.sandbox import SandboxUnavailable
    assignments = args.assignments or course.submitted_assignments()
    if not assignments:
        raise CourseError(f"no submissions in {course.submitted_dir}: run `workbook collect` first")
    settings = workbook_settings(course, workers=args.workers, cell_timeout=args.cell_timeout,
                                 notebook_timeout=args.notebook_timeout, memory_mb=args.memory_mb,
                                 max_output_kb=args.max_output_kb, threads=args.threads, scheduler=args.scheduler)
    options = GradingOptions.from_settings(course, settings, students=args.student, gpu=args.gpu, force=force,
                                           unsafe_no_sandbox=args.unsafe_no_sandbox)
    warm_up(options)  # the workers' fork server imports torch and the checks while this process does too
    if args.unsafe_no_sandbox:
        print("warning: grading WITHOUT the sandbox: submissions' code runs with your privileges; every grade "
              "written is marked unverified.", file=sys.stderr)
    else:
        try:
            from ..sealing.sandbox import check_available
            check_available()
        except SandboxUnavailable as exc:
            raise CourseError(f"cannot grade safely: {exc}") from None
    course.check_assignments(args.assignments, released=True)
    for assignment in assignments:
        course.check_submitted(assignment, args.student)
    return assignments, options


def _bar(course: Course, args: argparse.Namespace, assignments: list[str], verb: str):
    """A progress bar of the notebooks to grade (None with --quiet)."""
    if args.quiet:
        return None
    from tqdm.auto import tqdm
    from ..course.release import recorded_notebooks
    total = sum(len(args.student or course.submitted_students(a)) * len(recorded_notebooks(course, a))
                for a in assignments)
    what = assignments[0] if len(assignments) == 1 else f"{len(assignments)} assignments"
    return tqdm(total=total, desc=f"{verb} {what}", unit="notebook")


def autograde(course: Course, args: argparse.Namespace, extra: list[str]) -> int:
    assignments, options = _grading(course, args, args.force)
    from ..pipeline.autograde import autograde_assignments
    counts = {a: {"kept": 0, "graded": 0} for a in assignments}
    sealed: dict[str, dict[str, int]] = {a: {} for a in assignments}  # how the notebooks graded now were sealed
    bar = _bar(course, args, assignments, "autograde")
    from ..pipeline.cluster import WorkerTally
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


def regrade(course: Course, args: argparse.Namespace, extra: list[str]) -> int:
    from ..pipeline.regrade import regrade as regrading
    from ..reports.regrade_report import write_regrade_report
    assignments, options = _grading(course, args, True)
    bar = _bar(course, args, assignments, "regrade (dry run)" if args.dry_run else "regrade")

    def show(record: dict) -> None:
        if bar is not None and record.get("status") != "kept":
            bar.update(1)
    outcomes = regrading(course, assignments, options, students=args.student, items=args.item, dry_run=args.dry_run,
                         keep_higher=args.keep_higher, note=args.note or "", progress=show)
    if bar is not None:
        bar.close()
    for outcome in outcomes:
        csv_path, page = write_regrade_report(course, outcome)
        print(shown(outcome.summary(), 2000))
        for change in outcome.moved[:20]:
            print(f"  {shown(change.student, 64)} {shown(change.item, 80)}: {change.old_points:g} → "
                  f"{change.new_points:g}" + (f" ({shown(change.new_mistake, 120)})" if change.new_mistake else ""))
        if len(outcome.moved) > 20:
            print(f"  … and {len(outcome.moved) - 20} more")
        print(f"  report: {csv_path} and {page.name}")
        for export in outcome.stale_exports:
            print(f"  STALE: {shown(export, 400)} was exported before this regrade; export again")
        if not args.dry_run and outcome.moved:
            from ..reports.feedback import generate_feedback
            from ..reports.similarity import default_jobs
            moved = sorted({c.student for c in outcome.moved})
            written = generate_feedback(course, outcome.assignment, moved, workers=args.workers or default_jobs())
            print(f"  feedback rewritten for {len(written)} students whose points moved (what changed"
                  + (", and your note)" if outcome.note else ")"))
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


def feedback(course: Course, args: argparse.Namespace, extra: list[str]) -> int:
    from ..reports.feedback import generate_feedback
    from ..reports.similarity import default_jobs
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
