"""collect's times: when a submission was handed in, from a source the student cannot write
(``time_from``), and what the student's own ``timestamp.txt`` claimed (recorded, flagged where
it disagrees, never believed)."""

from __future__ import annotations

import datetime as dt

from ..course.problems import problem
from ..doors import intake
from ..doors.intake import shown
from .collect_files import StudentFiles, Taken
from .collect_identities import Matcher

__all__ = ["submission_times", "CLAIM_TOLERANCE"]

CLAIM_TOLERANCE = dt.timedelta(minutes=1)


def submission_times(student: StudentFiles, matcher: Matcher, taken: Taken, time_from: str,
           given: dt.datetime | None = None) -> dict:
    """The submission's time from a source the student cannot write, and what the
    student's own timestamp.txt claimed."""
    when = None
    if time_from == "name":
        for name in student.lms_names:
            text = matcher.time_in_name(name, student.id)
            if text is not None:
                when = intake.parse_time(text)
                break
    elif time_from in ("zip", "files"):
        when = max(student.source_times) if student.source_times else None
    elif time_from == "collect":
        when = dt.datetime.now(dt.timezone.utc).replace(tzinfo=None)
    elif time_from == "given":
        when = given
    claimed = [intake.parse_time(text) for text in taken.claimed]
    problems = []
    for text, time in zip(taken.claimed, claimed):
        if time is None:
            problems.append(problem("timestamp_claim", f"the submission's own timestamp.txt "
                                                       f"('{shown(text.decode('utf-8', 'replace'), 60)}') cannot be "
                                                       "read; it was ignored"))
        elif when is not None and abs(time - when) > CLAIM_TOLERANCE:
            problems.append(problem("timestamp_claim", f"the submission's own timestamp.txt says "
                                                       f"{time:%Y-%m-%d %H:%M:%S} UTC, the {_SOURCES[time_from]} says "
                                                       f"{when:%Y-%m-%d %H:%M:%S} UTC; the latter was used"))
    claim = next((t for t in claimed if t is not None), None)
    return {"time": when.isoformat(sep=" ") if when else None, "source": time_from if when else "none",
            "claimed": claim.isoformat(sep=" ") if claim else None, "problems": problems}


_SOURCES = {"name": "LMS's file name", "zip": "LMS download", "files": "file system", "collect": "moment of collect",
            "given": "LMS's record", "none": "nothing"}
