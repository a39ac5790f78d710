"""Similarity at the scale of a large class: ``workbook similarity`` on a generated class of
notebook 09 (9 code items, 3 written answers: 12 items).

    PYTHONPATH=. .venv/bin/python benchmarks/similarity.py [--students 1000]

Each student's answer to a code item is the released stub with a body of their own:
statements drawn from the item's vocabulary (torch calls, operators, names, numbers), a
third of them from a pool of idioms that the whole class draws on with Zipf-like
popularity (so that fingerprints are shared by two, ten, a hundred students, as in a
real class). Written answers are sentences of their own with shared phrases. Planted:
3% of students copied another student (names changed, statements reordered, a debugging
print), 1% pasted course_lib's reference. Timed: the whole command (start-up included),
against two baselines measured in the same run: reading the class through the intake
door alone (what any tool reading the submissions pays), and the all-pairs comparison
the index avoids (every two students' fingerprint sets intersected, for one item). The
target: 1,000 students x 10 items in 60 s on 2 cores. The machine's load (1-minute
average) is printed before and after: timings on a shared machine are noisy.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests"), str(REPO)]

ASSIGNMENT = "09_efficient_attention"
API = ["arange", "ones", "zeros", "tril", "triu", "softmax", "exp", "log", "sum", "cumsum", "amax", "max", "clamp",
       "unsqueeze", "transpose", "reshape", "view", "expand", "matmul", "einsum", "where", "masked_fill",
       "logical_not", "abs", "sqrt", "new_zeros", "new_full", "pad", "unfold", "gather", "scatter", "cat", "stack",
       "split", "chunk", "contiguous", "to", "float", "bool", "size", "shape", "flatten", "roll", "flip",
       "diagonal", "square", "mean", "norm", "detach", "clone", "index_select", "repeat", "type_as"]
OPS = ["+", "-", "*", "/", "@", "<", "<=", ">=", "&", "|"]
WORDS = ("attention window block key query value cache memory cost grows linear quadratic tile softmax running max "
         "sum rescale exact approximate position token sequence length time each every new old previous store "
         "reuse compute once again layer head model faster slower because since therefore only never all some "
         "because large small constant factor overhead kernel").split()


def _expr(rng: random.Random, names: list[str], depth: int = 0) -> str:
    r = rng.random()
    if depth > 2 or r < (0.1 if depth == 0 else 0.3):
        return rng.choice(names) if rng.random() < 0.8 else str(rng.randint(0, 9))
    if r < 0.6:
        args = ", ".join(_expr(rng, names, depth + 1) for _ in range(rng.randint(1, 3)))
        return f"{rng.choice(['torch', rng.choice(names)])}.{rng.choice(API)}({args})"
    if r < 0.8:
        return f"{_expr(rng, names, depth + 1)} {rng.choice(OPS)} {_expr(rng, names, depth + 1)}"
    return f"{rng.choice(names)}[..., {rng.choice([':', '-1', 'None'])}]"


def _statement(rng: random.Random, names: list[str]) -> str:
    target = rng.choice(names + [f"t{rng.randint(0, 30)}"])
    if rng.random() < 0.15:
        return f"if {_expr(rng, names)} is not None:\n    {target} = {_expr(rng, names)}"
    return f"{target} = {_expr(rng, names)}"


def _idioms(rng: random.Random, count: int = 40) -> list[str]:
    """One item's idioms: short statements many students write alike (``idx = torch.arange(T)``)."""
    names = ["x", "mask", "scores", "idx", "out"]
    return [f"{rng.choice(names)} = {rng.choice(names)}.{rng.choice(API)}({_expr(rng, names, 2)})"
            for _ in range(count)]


def _body(rng: random.Random, idioms: list[str]) -> str:
    names = [rng.choice(["a", "b", "c", "tmp", "res", "s", "m", "w", "z", "acc"]) + str(rng.randint(0, 99))
             for _ in range(5)] + ["x", "mask"]
    lines = []
    for _ in range(rng.randint(8, 20)):
        if rng.random() < 0.35:
            lines.append(idioms[min(int(rng.paretovariate(1.0)) - 1, len(idioms) - 1)])  # Zipf-like
        else:
            lines.append(_statement(rng, names))
    lines.append(f"return {rng.choice(names)}")
    return "\n".join(lines)


def _text(rng: random.Random, phrases: list[str]) -> str:
    sentences = []
    for _ in range(rng.randint(2, 5)):
        words = [rng.choice(WORDS) for _ in range(rng.randint(6, 14))]
        if rng.random() < 0.4:
            words.insert(rng.randint(0, len(words)), phrases[min(int(rng.paretovariate(1.0)) - 1, len(phrases) - 1)])
        sentences.append(" ".join(words).capitalize() + ".")
    return " ".join(sentences)


def _copy(rng: random.Random, code: str) -> str:
    """What a student does to what they copy: names changed, a debugging print, two lines swapped."""
    lines = code.split("\n")
    stub_end = next(i for i, line in enumerate(lines) if line.strip().startswith("# YOUR CODE HERE")) + 1
    body = lines[stub_end:]
    simple = [i for i in range(len(body) - 2) if "if " not in body[i] and body[i].startswith("    ")
              and not body[i + 1].startswith("        ") and "if " not in body[i + 1]
              and not body[i].startswith("        ")]
    if simple:
        i = rng.choice(simple)
        body[i], body[i + 1] = body[i + 1], body[i]
    body.insert(rng.randint(0, len(body) - 1), "    print('debug', x.shape)")
    return re.sub(r"\b([abcmswz]|tmp|res|acc)(\d+)\b", r"renamed_\1\2", "\n".join(lines[:stub_end] + body))


def _children_cpu() -> float:
    """CPU seconds (user and system) of this process's finished children and theirs."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def class_answers(students: int, seed: int = 0) -> tuple[dict[str, dict[str, str]], dict]:
    """Every student's answers (student -> grade_id -> source), and what was planted."""
    import nbformat

    from course_lib.grading.judge.registry import all_specs
    from autograder.reports.similarity import reference_source

    released = nbformat.read(str(REPO / "notebooks" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"), as_version=4)
    rng = random.Random(seed)
    cells = [c for c in released.cells if c.get("metadata", {}).get("nbgrader", {}).get("solution")]
    idioms = {c.metadata.nbgrader["grade_id"]: _idioms(rng) for c in cells}
    phrases = [" ".join(rng.choice(WORDS) for _ in range(4)) for _ in range(30)]
    ids = [f"s{i:04d}" for i in range(students)]
    answers: dict[str, dict[str, str]] = {s: {} for s in ids}
    for s in ids:
        for c in cells:
            gid = c.metadata.nbgrader["grade_id"]
            if c.cell_type == "markdown":
                answers[s][gid] = _text(rng, phrases)
            else:
                stub = c.source.split("raise NotImplementedError()")[0].rstrip(" ")
                answers[s][gid] = stub + "\n".join("    " + line for line in _body(rng, idioms[gid]).split("\n"))
    planted = {"copies": [], "references": []}
    code_items = [c.metadata.nbgrader["grade_id"] for c in cells if c.cell_type == "code"]
    for i in range(0, students, 100):  # 3 copiers and 1 who pasted the reference per hundred
        for j in range(3):
            source, copier = ids[i + j], ids[i + 50 + j]
            item = code_items[(i // 100 + j) % len(code_items)]
            answers[copier][item] = _copy(rng, answers[source][item])
            planted["copies"].append((item, *sorted((source, copier))))
        item = code_items[(i // 100) % len(code_items)]
        reference = reference_source(item) if item in all_specs() else None
        if reference:
            answers[ids[i + 90]][item] = reference
            planted["references"].append((item, ids[i + 90]))
    return answers, planted


def generate(root: Path, students: int, seed: int = 0) -> dict:
    """The class, written as submissions of notebook 09 under ``root``; returns what was planted."""
    from similarity_class import write_course

    answers, planted = class_answers(students, seed)
    write_course(root, answers, ASSIGNMENT)
    return planted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--students", type=int, default=1000)
    parser.add_argument("--verbose", action="store_true", help="print the command's summary too")
    args = parser.parse_args()
    if args.students < 100 or args.students % 100:  # (the plan plants copies per hundred)
        parser.error("--students: a multiple of 100")

    from autograder.course import Course
    from autograder.reports.similarity import compare_item, read_class

    with tempfile.TemporaryDirectory(prefix="workbook-similarity-") as tmp:
        root = Path(tmp)
        start = time.perf_counter()
        planted = generate(root, args.students)
        print(f"generated {args.students} students in {time.perf_counter() - start:.1f} s (setup, not timed)")
        load_before = os.getloadavg()[0]

        start, cpu = time.perf_counter(), _children_cpu()
        proc = subprocess.run([sys.executable, "-m", "autograder.cli", "--course", str(root), "similarity", ASSIGNMENT],
                              capture_output=True, text=True, check=True)
        command, command_cpu = time.perf_counter() - start, _children_cpu() - cpu

        course = Course(root)
        start, cpu = time.perf_counter(), _children_cpu() + time.process_time()
        answers = read_class(course, ASSIGNMENT)
        reading, reading_cpu = time.perf_counter() - start, _children_cpu() + time.process_time() - cpu

        item = next(i for i in answers.items if i.kind == "code")
        sets = [set(item.prints[s].unique().tolist()) for s in sorted(item.prints)]
        start = time.perf_counter()
        for a in range(len(sets)):
            for b in range(a + 1, len(sets)):
                len(sets[a] & sets[b])
        all_pairs = time.perf_counter() - start
        start = time.perf_counter()
        compare_item(item, 0.5)
        indexed = time.perf_counter() - start
        load_after = os.getloadavg()[0]

        rows = list(__import__("csv").DictReader((root / "grading" / "similarity" / ASSIGNMENT / "similarity.csv")
                                                 .open(encoding="utf-8")))
        flagged = {(r["item"], r["student_a"], r["student_b"]) for r in rows if r["flagged"] == "true"}
        scores = {(r["item"], r["student_a"], r["student_b"]): float(r["similarity"]) for r in rows}
        expected = {tuple(c) for c in planted["copies"]} | {(i, s, "course_lib") for i, s in planted["references"]}
        expected |= {(i, *sorted((s, t))) for i, s in planted["references"] for j, t in planted["references"]
                     if i == j and s != t}  # two who pasted the same reference
        items = len(answers.items)
        print(f"\n{'what':58s} {'wall s':>8s} {'CPU s':>8s}")
        print(f"{'reading and fingerprinting the class (read_class)':58s} {reading:8.2f} {reading_cpu:8.2f}")
        print(f"{'workbook similarity (the whole command)':58s} {command:8.2f} {command_cpu:8.2f}  "
              f"{command / reading:.2f}x reading")
        print(f"{f'one item, every pair intersected ({len(sets) * (len(sets) - 1) // 2:,} pairs; baseline)':58s} "
              f"{all_pairs:8.2f}")
        print(f"{'one item through the index (fingerprints taken: the pairs)':58s} {indexed:8.2f}  "
              f"{indexed / all_pairs:.2f}x all pairs")
        print(f"\nplanted copies flagged: {len(expected & flagged)} of {len(expected)}; other pairs flagged: "
              f"{len(flagged - expected)}")
        for missed in sorted(expected - flagged):
            print(f"  not flagged: {' '.join(missed)} (similarity {scores.get(missed, 0):.2f})")
        for extra in sorted(flagged - expected):
            print(f"  flagged, not planted: {' '.join(extra)} (similarity {scores[extra]:.2f})")
        verdict = "meets" if command <= 60 else "misses"
        print(f"{args.students} students x {items} items: {command:.1f} s wall ({verdict} the 60 s target for "
              f"1,000 x 10), {command_cpu:.1f} s of CPU, on {os.cpu_count()} cores, load {load_before:.1f} before, "
              f"{load_after:.1f} after")
        if args.verbose:
            print(proc.stdout)


if __name__ == "__main__":
    main()
