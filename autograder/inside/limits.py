"""The limits a sealed run sets on itself (autograder/inside/notebook_runner.py): processes, file
size, open files and core dumps at once, the address space when the first cell starts. Also used
by the grader's own bounded children (autograder/reports/feedback.py)."""

from __future__ import annotations

import resource


def vm_size() -> int:
    """The bytes this process maps now (``VmSize`` of /proc/self/status; 0 where there is none)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def apply_limits(limits: dict) -> None:
    """The per-process limits but the address space's (:func:`limit_address_space`, at the
    first cell): processes, file size, open files, no core dumps."""
    cap(resource.RLIMIT_NPROC, int(limits["max_processes"]))
    cap(resource.RLIMIT_FSIZE, int(limits["file_mb"]) * 2**20)
    cap(resource.RLIMIT_NOFILE, int(limits["max_open_files"]))
    cap(resource.RLIMIT_CORE, 0)


def limit_address_space(limits: dict) -> None:
    """The address space as ``memory_mb`` on top of what this process maps when the first cell
    starts (torch, IPython, the runner's threads: PyPI's Linux build of torch alone maps about
    3 GB of CUDA libraries, a CPU build about 600 MB; a zygote's child has mapped what its zygote
    imported): the same allowance for a submission whichever build and whichever seal grades it."""
    if limits.get("memory_mb"):
        cap(resource.RLIMIT_AS, vm_size() + int(limits["memory_mb"]) * 2**20)


def cap(kind: int, value: int) -> None:
    """Lower a limit, soft and hard alike (never above the hard limit already set)."""
    soft, hard = resource.getrlimit(kind)
    if hard != resource.RLIM_INFINITY:
        value = min(value, hard)
    resource.setrlimit(kind, (value, value))
