"""How submissions are sealed off, decided in one place.

Three ways (:data:`ISOLATIONS`): ``bubblewrap`` (the default: Linux namespaces,
autograder/sealing/sandbox.py), ``container`` (where bubblewrap cannot start, as on
Gradescope: another Unix user, autograder/sealing/container.py) and ``none`` (no seal:
``--unsafe-no-sandbox``, every grade marked unverified). :func:`resolve` turns what was asked
(an option, a flag, ``WORKBOOK_ISOLATION``) into one of them; :func:`seal` checks, before a
batch starts, that this machine can seal with it, and gives container mode's user.
"""

from __future__ import annotations

import os
from pathlib import Path

from ..course import Course, CourseError
from .container import ContainerUser, check_user
from .sandbox import SandboxUnavailable, check_available

__all__ = ["ISOLATIONS", "resolve", "seal"]

ISOLATIONS = ("bubblewrap", "container", "none")


def resolve(requested: str = "", unsafe_no_sandbox: bool = False, setting: str = "isolation") -> str:
    """The isolation to grade with: ``requested`` when given (``auto``: bubblewrap where it
    starts, else container mode when the grader is root, else none); otherwise ``none`` for
    ``unsafe_no_sandbox`` and ``bubblewrap`` by default. A :class:`CourseError` when it asks
    for none of these (naming ``setting``, where the request came from, unless an option)."""
    if requested == "auto":
        try:
            check_available()
            return "bubblewrap"
        except SandboxUnavailable:
            return "container" if os.geteuid() == 0 else "none"
    found = requested or ("none" if unsafe_no_sandbox else "bubblewrap")
    if found not in ISOLATIONS:
        if setting == "isolation":
            raise CourseError(f"unknown isolation {found!r}; one of {', '.join(ISOLATIONS)}")
        raise CourseError(f"{setting}={found!r}: one of auto, {', '.join(ISOLATIONS)}")
    return found


def seal(isolation: str, course: Course, container_user: str, one_at_a_time: bool) -> ContainerUser | None:
    """Check that submissions can be sealed off here with ``isolation`` before anything runs
    (:class:`SandboxUnavailable` says why not and how to fix it); returns container mode's
    user, checked: unprivileged, and unable to read the course folder, the autograder or
    course_lib (whose check specs hold the hidden tests). Container mode grades one notebook at
    a time on this machine (``one_at_a_time``: one worker, no scheduler), as every submission
    runs as the same user."""
    if isolation == "bubblewrap":
        check_available()
        return None
    if isolation != "container":
        return None
    if not one_at_a_time:
        raise CourseError("container mode grades one notebook at a time, on this machine (-j 1, no scheduler): "
                          "every submission runs as the same user")
    import course_lib

    package = Path(__file__).resolve().parents[1]  # the autograder
    private = [course.root, course.grading_dir, package, Path(course_lib.__file__).resolve().parent]
    return check_user(container_user, private)
