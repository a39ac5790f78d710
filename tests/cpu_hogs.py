"""Busy cells for a sealed run's CPU share (autograder/sealing/cpu_share.py), graded through
the real grader (autograder.pipeline.worker.grade_notebook) as a worker grades them: one
thread each. Used by tests/grading/test_cpu_share.py and benchmarks/cpu_share.py.

Each cell measures itself, inside the seal: its processes' own CPU time against the wall
time of the same run, printed as one JSON line after a tag (:func:`report` reads it back).
"""

from __future__ import annotations

import json
from pathlib import Path

import nbformat

from autograder.pipeline.worker import grade_notebook
from autograder.sealing import sandbox
from autograder.sealing.zygote import Zygotes

UID = sandbox.SANDBOX_UID_BASE + 4400  # the slot users of these runs (a hog beside: UID + 1)

# Start N busy processes, each after setsid() (refused or not: the process goes on), each busy
# for SECONDS of wall time; print how much CPU they got together against the wall time.
HOG = r'''
import json, os, sys, time
N, SECONDS = {n}, {seconds}
refused = 0
started = time.monotonic()
children = []
for _ in range(N):
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            os.setsid()
        except PermissionError:
            refused = 1
        end = time.monotonic() + SECONDS
        while time.monotonic() < end:
            pass
        os.write(write, json.dumps([time.process_time(), refused]).encode())
        os._exit(0)
    os.close(write)
    children.append(read)
got = [json.loads(os.read(fd, 100)) for fd in children]
for _ in children:
    os.wait()
print("HOG " + json.dumps({{"cpu": sum(c for c, _ in got), "wall": time.monotonic() - started, "t0": started,
                           "refused": sum(r for _, r in got)}}))
'''

# A fixed amount of work (CPU seconds of this process's own), and how long it took.
HONEST = r'''
import json, time
started, cpu = time.monotonic(), time.process_time()
while time.process_time() - cpu < {cpu}:
    sum(i * i for i in range(1000))
print("HONEST " + json.dumps({{"cpu": time.process_time() - cpu, "wall": time.monotonic() - started, "t0": started}}))
'''


def graded(course: dict, source: str, uid: int = UID, zygotes: Zygotes | None = None,
           limits: sandbox.Limits | None = None) -> tuple[dict, str]:
    """One one-cell notebook graded in ``course`` (``{"copy": a course copy, "tmp": a folder the
    slot users can enter, "n": runs so far}``) as a worker grades it: its result and what its
    cell printed (its error's text included)."""
    course["n"] += 1
    limits = limits or sandbox.Limits(cell_timeout=120, notebook_timeout=240, memory_mb=2048)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source)])
    job = {"notebook": nbformat.writes(nb), "salts": {}, "extra_files": [], "job_id": f"cpu-{course['n']}",
           "limits": limits.__dict__.copy(), "threads": 1}
    result = grade_notebook(job, course["copy"], Path(course["tmp"]) / f"job-{course['n']}", uid=uid, zygotes=zygotes)
    assert not result.get("crash"), result
    cell = nbformat.reads(result["notebook"], as_version=4).cells[0]
    return result, "".join(o.get("text", "") + o.get("evalue", "") for o in cell.outputs)


def report(printed: str, tag: str) -> dict:
    """The JSON a cell printed after ``tag``."""
    assert tag + " " in printed, printed
    return json.loads(printed.split(tag + " ", 1)[1].splitlines()[0])
