"""What grading depends on: a digest of every course file (course_lib, the autograder, the
assignment sources, ``nbgrader_config.py``). ``autograde`` keeps it in each submission's
fingerprint (a change regrades), and every Dask task carries it: a worker whose files
differ refuses (autograder/pipeline/cluster.py)."""

from __future__ import annotations

import hashlib
import threading
import time
from pathlib import Path

from .course import Course

__all__ = ["course_manifest", "manifest_fingerprint", "manifest_differences"]

SETTLED_NS = 2 * 10**9  # a file untouched this long may have its digest kept (see _file_digest)


_DIGESTS: dict[str, tuple[tuple[int, ...], str]] = {}  # path -> (its stat when hashed, sha256)


_DIGESTS_LOCK = threading.Lock()



def _file_digest(path: Path) -> str:
    """The sha256 of ``path``, kept in this process while the file's size, modification
    and change times and inode stay the same: a long-lived worker stats every course
    file for each task but hashes only what changed. Any write, ``utime`` or ``chmod``
    moves the change time (which no one can set back), so an edit is never missed; a
    file changed within the last ``SETTLED_NS`` is hashed every time, as a second write
    within one timestamp tick would leave its times as they were."""
    def state() -> tuple[int, ...]:
        st = path.stat()
        return st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev

    before = state()
    with _DIGESTS_LOCK:
        known = _DIGESTS.get(str(path))
    if known and known[0] == before:
        return known[1]
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if time.time_ns() - max(before[1], before[2]) > SETTLED_NS and state() == before:
        with _DIGESTS_LOCK:
            _DIGESTS[str(path)] = (before, digest)
    return digest


def _digest_tree(root: Path, prefix: str, out: dict[str, str]) -> None:
    for p in sorted(root.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts and ".ipynb_checkpoints" not in p.parts:
            out[f"{prefix}/{p.relative_to(root).as_posix()}"] = _file_digest(p)


def course_manifest(course: Course) -> dict[str, str]:
    """``name -> sha256`` of every file grading depends on: the imported course_lib and
    autograder packages, the assignment sources (``solutions/``) and ``nbgrader_config.py``."""
    import course_lib
    out: dict[str, str] = {}
    _digest_tree(Path(course_lib.__file__).parent, "course_lib", out)
    _digest_tree(Path(__file__).resolve().parents[1], "autograder", out)
    _digest_tree(course.source_dir, course.source_dir.name, out)
    config = course.root / "nbgrader_config.py"
    out["nbgrader_config.py"] = _file_digest(config)
    return out


def manifest_fingerprint(manifest: dict[str, str]) -> str:
    """One short hash of a manifest."""
    h = hashlib.sha256()
    for name in sorted(manifest):
        h.update(f"{name}\0{manifest[name]}\n".encode())
    return h.hexdigest()[:16]


def manifest_differences(expected: dict[str, str], local: dict[str, str], limit: int = 8) -> list[str]:
    """What differs between the instructor's manifest and a worker's, in words
    (``course_lib/attention.py differs``); empty when they are the same."""
    out = []
    for name in sorted(set(expected) | set(local)):
        if name not in local:
            out.append(f"{name} is missing on the worker")
        elif name not in expected:
            out.append(f"{name} exists only on the worker")
        elif expected[name] != local[name]:
            out.append(f"{name} differs")
    if len(out) > limit:
        out = out[:limit] + [f"and {len(out) - limit} more"]
    return out

