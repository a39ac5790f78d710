"""The innermost layer of the seal: what the runner does to itself before the first cell.

:func:`lock_down` runs in the sealed process as the student's user, before any of the
student's code (autograder/inside/notebook_runner.py calls it first; in a zygote's child,
autograder/inside/zygote.py has dropped to that user just before). It

1. empties the user's kernel keyrings (the user keyring and the user-session keyring): as
   root, the grader gives each worker slot one user, whose keyrings would otherwise carry
   whatever one student's code put there to the next student graded on that slot;
2. sets ``no_new_privs`` and installs a seccomp filter, inherited by every process the
   student's code starts, that refuses what a notebook never needs and what would widen the
   kernel's attack surface or reach outside the run (:data:`REFUSED`): new namespaces (user
   namespaces above all), ``setns``, mounting, keyrings, tracing and reading other processes'
   memory, BPF, io_uring, userfaultfd, perf events, loading kernels and modules, personality
   changes. Each is refused with the errno programs expect (``EPERM``, as for an unprivileged
   user; ``ENOSYS`` for ``clone3`` and io_uring, whose callers fall back to ``clone`` and to
   plain reads). A 32-bit or x32 system call is not let through on another architecture's
   numbers: it kills the process (libseccomp's default for a foreign architecture).

The filter is built by libseccomp (its ctypes binding ``pyseccomp``, in the grader's
environment), never written by hand. :func:`seal_status` reads back what the kernel says of
this process. This module imports nothing but the standard library and that binding: it is
copied into the seal with the runner (its folder is all the sandbox sees of the autograder).
"""

from __future__ import annotations

import ctypes
import errno
import os

__all__ = ["REFUSED", "SESSIONS", "SealError", "build_filter", "lock_down", "seal_status", "clear_keyrings",
           "NAMESPACE_FLAGS"]

EPERM, ENOSYS = errno.EPERM, errno.ENOSYS

# system call -> the errno it gets (refused whatever its arguments)
REFUSED: dict[str, int] = {
    # other namespaces: entered (user namespaces are refused in clone and unshare below)
    "setns": EPERM,
    # the file system tree: mounting, pivoting, the new mount API, file handles
    **dict.fromkeys(("mount", "umount2", "pivot_root", "chroot", "move_mount", "open_tree", "fsopen", "fsconfig",
                     "fsmount", "fspick", "mount_setattr", "open_by_handle_at", "name_to_handle_at"), EPERM),
    # kernel keyrings
    **dict.fromkeys(("keyctl", "add_key", "request_key"), EPERM),
    # other processes: tracing, their memory, their descriptors
    **dict.fromkeys(("ptrace", "process_vm_readv", "process_vm_writev", "pidfd_getfd", "kcmp"), EPERM),
    # kernel interfaces with a history of privilege escalations
    "bpf": EPERM, "userfaultfd": EPERM, "perf_event_open": EPERM, "fanotify_init": EPERM,
    **dict.fromkeys(("io_uring_setup", "io_uring_enter", "io_uring_register"), ENOSYS),
    "clone3": ENOSYS,  # its flags are in memory a filter cannot read; glibc then uses clone
    # the machine itself
    **dict.fromkeys(("kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "reboot",
                     "swapon", "swapoff", "acct", "quotactl", "quotactl_fd", "syslog", "vhangup", "iopl", "ioperm",
                     "settimeofday", "clock_settime", "lookup_dcookie", "uselib"), EPERM),
}

# Where the grader cannot give a run a CPU group of its own (autograder/sealing/cpu_share.py), new
# sessions and process groups are refused too: the kernel's per-session CPU sharing (autogroups)
# would otherwise give each of a cell's processes in a session of its own as much CPU as a whole
# notebook graded beside it.
SESSIONS: dict[str, int] = {"setsid": EPERM, "setpgid": EPERM}

# clone(2) and unshare(2) flags that make a namespace; CLONE_NEWTIME (0x80) only in unshare
NAMESPACE_FLAGS = {"CLONE_NEWNS": 0x00020000, "CLONE_NEWCGROUP": 0x02000000, "CLONE_NEWUTS": 0x04000000,
                   "CLONE_NEWIPC": 0x08000000, "CLONE_NEWUSER": 0x10000000, "CLONE_NEWPID": 0x20000000,
                   "CLONE_NEWNET": 0x40000000}
CLONE_NEWTIME = 0x80

# personality(2): the query (0xffffffff) and these personas stay allowed; anything else
# (turning off address randomisation, READ_IMPLIES_EXEC, ...) is refused
PERSONALITY_QUERY = 0xFFFFFFFF
PERSONALITY_ALLOWED_BITS = 0x0008 | 0x0020000  # PER_LINUX32, UNAME26 (PER_LINUX is 0)

PR_SET_NO_NEW_PRIVS = 38
_UNKNOWN = -1  # __NR_SCMP_ERROR: a name libseccomp does not know
KEYCTL_CLEAR = 7
KEY_SPEC_USER_KEYRING, KEY_SPEC_USER_SESSION_KEYRING = -4, -5


class SealError(RuntimeError):
    """The filter could not be built or installed here (the message says why)."""


def _binding():
    try:
        import pyseccomp
    except (ImportError, RuntimeError, OSError) as exc:  # RuntimeError: libseccomp itself is missing
        raise SealError(f"libseccomp's Python binding (pyseccomp) cannot be loaded: {exc}. Install libseccomp "
                        "(Debian/Ubuntu: apt-get install libseccomp2) and the grader's dependencies "
                        "(pip install -e '.[grader]')") from None
    return pyseccomp


def build_filter(refuse_sessions: bool = False):
    """The seccomp filter (a ``pyseccomp.SyscallFilter``, not loaded): everything allowed
    but :data:`REFUSED` (and :data:`SESSIONS` with ``refuse_sessions``), namespace flags in
    ``clone``/``unshare``, and personality changes.
    A system call this libseccomp does not know on this architecture is left out (the kernel
    has none of that number either)."""
    sc = _binding()
    f = sc.SyscallFilter(sc.ALLOW)
    f.set_attr(sc.Attr.CTL_TSYNC, 1)  # every thread of the process, not only the caller

    def rule(action: int, name: str, *args) -> None:
        number = sc.resolve_syscall(sc.Arch.NATIVE, name)
        if number != _UNKNOWN:  # (an older libseccomp may not know the newest calls)
            f.add_rule(action, number, *args)

    for name, code in (REFUSED | SESSIONS if refuse_sessions else REFUSED).items():
        rule(sc.ERRNO(code), name)
    for flag in NAMESPACE_FLAGS.values():
        rule(sc.ERRNO(EPERM), "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
        rule(sc.ERRNO(EPERM), "unshare", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    rule(sc.ERRNO(EPERM), "unshare", sc.Arg(0, sc.MASKED_EQ, CLONE_NEWTIME, CLONE_NEWTIME))
    top = 1 << 31
    for bit in (1 << k for k in range(31)):
        if not bit & PERSONALITY_ALLOWED_BITS:  # a flag set on a persona (bit 31 clear)
            rule(sc.ERRNO(EPERM), "personality", sc.Arg(0, sc.MASKED_EQ, bit | top, bit))
        # bit 31 set: only the query itself, all ones, passes
        rule(sc.ERRNO(EPERM), "personality", sc.Arg(0, sc.MASKED_EQ, bit | top, top))
    return f


def clear_keyrings() -> None:
    """Empty this user's user keyring and user-session keyring (what a run on the same
    user left there). Where the kernel has no keyrings, there is nothing to clear."""
    libc = ctypes.CDLL(None, use_errno=True)
    number = _binding().resolve_syscall(0, "keyctl")
    for ring in (KEY_SPEC_USER_KEYRING, KEY_SPEC_USER_SESSION_KEYRING):
        if libc.syscall(number, KEYCTL_CLEAR, ring) != 0 and ctypes.get_errno() not in (errno.ENOSYS, errno.EOPNOTSUPP):
            raise SealError(f"the user's keyring could not be cleared: {os.strerror(ctypes.get_errno())}")


def lock_down(refuse_sessions: bool = False) -> dict[str, str]:
    """Clear this user's keyrings, then install the filter on this process (and every
    process it will start; new sessions and process groups refused with ``refuse_sessions``);
    :class:`SealError` if the kernel refuses. Returns :func:`seal_status`, read after the
    filter is in."""
    clear_keyrings()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise SealError(f"no_new_privs could not be set: {os.strerror(ctypes.get_errno())}")
    try:
        build_filter(refuse_sessions).load()
    except OSError as exc:
        raise SealError(f"the kernel refused the seccomp filter ({exc.strerror or exc}): it needs "
                        "CONFIG_SECCOMP_FILTER (every distribution's kernel has it)") from None
    status = seal_status()
    status["sessions"] = "refused" if refuse_sessions else "allowed"
    if status.get("Seccomp") != "2":
        raise SealError(f"the seccomp filter is not in force (Seccomp: {status.get('Seccomp')})")
    return status


def seal_status() -> dict[str, str]:
    """What the kernel says of this process: ``Seccomp`` (2: a filter), ``NoNewPrivs``,
    ``CapEff`` (effective capabilities, hex), ``Uid``."""
    out: dict[str, str] = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("Seccomp", "NoNewPrivs", "CapEff", "Uid"):
                out[key] = value.split()[0] if value.split() else ""
    return out
