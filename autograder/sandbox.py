"""Start a kernel under resource limits: ``python -m autograder.sandbox [options] -- CMD``.

The autograder puts this in front of the kernel's command line. It records the
kernel's process id (so that a stuck grading worker can be cleaned up), caps the
address space (memory), the size of files the student's code may write and core
dumps, then replaces itself with the kernel (``exec``: same process id).
"""

from __future__ import annotations

import argparse
import os
import resource
import sys

MB = 1024 * 1024


def apply_limits(memory_mb: int | None, file_mb: int | None) -> None:
    """Limit this process (and what it starts) to ``memory_mb`` of address space and
    files of at most ``file_mb``; never write core dumps."""
    if memory_mb:
        resource.setrlimit(resource.RLIMIT_AS, (memory_mb * MB, memory_mb * MB))
    if file_mb:
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_mb * MB, file_mb * MB))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        raise SystemExit("usage: python -m autograder.sandbox [--memory-mb N] [--file-mb N] [--pid-file F] [--log F] -- CMD ...")
    split = argv.index("--")
    parser = argparse.ArgumentParser(prog="python -m autograder.sandbox")
    parser.add_argument("--memory-mb", type=int, default=None)
    parser.add_argument("--file-mb", type=int, default=None)
    parser.add_argument("--pid-file", default=None)
    parser.add_argument("--log", default=None, help="send the kernel's own stdout and stderr to this file")
    args = parser.parse_args(argv[:split])
    command = argv[split + 1:]
    if not command:
        raise SystemExit("autograder.sandbox: no command after --")
    if args.pid_file:
        with open(args.pid_file, "w") as f:
            f.write(str(os.getpid()))
    if args.log:
        fd = os.open(args.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
    apply_limits(args.memory_mb, args.file_mb)
    os.execvp(command[0], command)


if __name__ == "__main__":
    main()
