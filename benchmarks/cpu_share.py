"""An honest notebook graded beside a hog, against the same notebook graded alone, in the same
run: what a sealed run's CPU share (autograder/sealing/cpu_share.py) leaves the notebooks graded
beside one whose cell starts many busy processes, each in a session of its own.

    sudo .venv/bin/python benchmarks/cpu_share.py [--rounds 3]

Each round grades the honest notebook (1.5 CPU-seconds of work in one cell: its sandbox's
start, imports and cell all count) alone, then beside a hog of 56 busy processes, through the
real grader (one thread each, as a worker grades). It prints both wall times, their ratio (the
share the honest notebook keeps; 1.0 is nothing lost) and what the hog got, CPUs per second of
its own wall time (its run's share is one). Target on an idle machine of two or more CPUs:
a ratio of at least 0.5. Needs root (slot users, cgroups); run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests"), str(REPO)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("run it as root: the slot users and the CPU groups are root's")

    from autograder.sealing import cpu_share, sandbox
    from autograder.sealing.course_copy import build_course_copy
    from cpu_hogs import HOG, HONEST, UID, graded, report

    sandbox.check_available()
    groups, why = cpu_share.found()
    print(f"CPU groups: {'yes' if groups else 'no (' + why + ')'}; {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp).chmod(0o711)
        course = {"copy": build_course_copy(Path(tmp) / "course", []), "tmp": tmp, "n": 0}
        graded(course, HONEST.format(cpu=0.1))  # the disk cache filled
        print(f"{'round':>5} {'alone s':>8} {'beside s':>9} {'ratio':>6} {'hog CPUs':>9}")
        ratios = []
        for round_ in range(1, args.rounds + 1):
            started = time.monotonic()
            graded(course, HONEST.format(cpu=1.5))
            alone = time.monotonic() - started
            hogged: dict = {}
            thread = threading.Thread(target=lambda: hogged.update(
                printed=graded(course, HOG.format(n=56, seconds=15.0), uid=UID + 1)[1]))
            thread.start()
            try:
                time.sleep(4.0)  # the hog's processes are busy
                started = time.monotonic()
                graded(course, HONEST.format(cpu=1.5))
                beside = time.monotonic() - started
            finally:
                thread.join()
            hog = report(hogged.get("printed", ""), "HOG")
            ratios.append(alone / beside)
            print(f"{round_:>5} {alone:>8.1f} {beside:>9.1f} {alone / beside:>6.2f} {hog['cpu'] / hog['wall']:>9.2f}")
        print(f"median ratio {sorted(ratios)[len(ratios) // 2]:.2f} (target ≥ 0.5 on an idle machine)")


if __name__ == "__main__":
    main()
