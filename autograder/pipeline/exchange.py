"""nbgrader's exchange as the grader sees it: where students hand in (``inbound``), and whether
the course's folders there are the grader's, with the modes nbgrader's own commands give them
(a folder a student made first could list, plant or replace what others hand in)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ..course import Course, CourseError
from ..doors.intake import shown
from .collect_sources import account_name

__all__ = ["exchange_inbound", "exchange_problems"]


def exchange_inbound(course: Course) -> Path:
    """The folder nbgrader's exchange hands submissions in to: ``<Exchange.root>/<course id>/inbound``."""
    root = course.setting("Exchange", "root", "/srv/nbgrader/exchange")
    if not course.course_id:
        raise CourseError("nbgrader_config.py sets no c.CourseDirectory.course_id: the exchange keeps each course's "
                          "submissions under its id")
    return Path(root) / course.course_id / "inbound"


# nbgrader's exchange as its own commands make it (release_assignment, submit, release_feedback):
# the folder -> (mode bits that no one but the grader may have, what they would let a student do)
_EXCHANGE_MODES = {
    "": (0o022, "add or replace the course's folders"),  # <root>/<course>: 0755
    "outbound": (0o022, "publish an assignment of their own, or replace a released one"),  # 0755
    "inbound": (0o044, "list the others' hand-ins"),  # 2733: write-only for students
    "feedback": (0o066, "list the others' feedback pages, or plant one"),  # 0711
}


def _owner(info: os.stat_result) -> str:
    return shown(account_name(info.st_uid))


def exchange_problems(course: Course) -> list[str]:
    """Whether the course's folders in nbgrader's exchange are the grader's, as nbgrader's own
    exchange expects them: the root a folder of root's or the grader's (sticky if everyone may
    write in it); ``<course>``, ``outbound``, ``inbound`` and ``feedback`` the grader's, with
    nbgrader's modes (``inbound`` write-only for students, ``feedback`` not listable); every
    release in ``outbound`` and page in ``feedback`` the grader's. The grader is the account
    running this, root, or the owner of the course's folder. One line for each folder that is
    not, naming it, what it lets a student do and the fix; [] when all are (a folder not made
    yet is no problem: nbgrader makes it the grader's)."""
    course_dir = exchange_inbound(course).parent
    root = course_dir.parent
    trusted = {os.geteuid(), 0, os.stat(course.root).st_uid}  # the grader: this account, root, the course's owner
    shared = bool(course.setting("CourseDirectory", "groupshared", False))  # (instructors share a group)
    fix = ("take it back: on a hub run deploy/jupyterhub/setup_course.py again as root (it sets a folder a "
           "student made aside and makes it anew), or remove it and let `nbgrader release_assignment` make it")
    problems: list[str] = []

    def look(path: Path, forbidden: int, would: str) -> os.stat_result | None:
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            return None
        except OSError as exc:
            problems.append(f"{path}: cannot be read ({exc.strerror})")
            return None
        mode = stat.S_IMODE(info.st_mode)
        if not stat.S_ISDIR(info.st_mode):
            problems.append(f"{path} is {'a symbolic link' if stat.S_ISLNK(info.st_mode) else 'not a folder'}: {fix}")
        elif info.st_uid not in trusted:
            problems.append(f"{path} belongs to the account {_owner(info)}, not to the grader: that account can "
                            f"{would}; {fix}")
        elif mode & (forbidden & ~0o070 if shared else forbidden):
            problems.append(f"{path} has mode {mode:04o}: other accounts can {would}; "
                            f"chmod {mode & ~forbidden:04o} {path} (nbgrader's own mode for it)")
        else:
            return info
        return None

    top = look(root, 0, "rename or replace the course's folder")
    if top is not None and stat.S_IMODE(top.st_mode) & 0o002 and not top.st_mode & stat.S_ISVTX:
        problems.append(f"{root} lets every account write in it but is not sticky: any account can rename or "
                        f"remove the course's folder; chmod 1777 {root}")
    if look(course_dir, *_EXCHANGE_MODES[""]) is None:
        return problems
    for name in ("outbound", "inbound", "feedback"):
        folder = course_dir / name
        if look(folder, *_EXCHANGE_MODES[name]) is None or name == "inbound":
            continue  # (inbound holds the students' own folders: collect checks each one's owner)
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError as exc:
            problems.append(f"{folder}: cannot be listed ({exc.strerror})")
            continue
        for entry in entries:
            info = entry.stat(follow_symlinks=False)
            if info.st_uid not in trusted:
                problems.append(f"{folder}/{shown(entry.name)} belongs to the account {_owner(info)}, not to the "
                                f"grader: it was planted there; {fix}")
            elif stat.S_ISDIR(info.st_mode) and stat.S_IMODE(info.st_mode) & (0o002 if shared else 0o022):
                problems.append(f"{folder}/{shown(entry.name)} has mode {stat.S_IMODE(info.st_mode):04o}: other "
                                f"accounts can change what is in it; chmod 0755 it")
    return problems
