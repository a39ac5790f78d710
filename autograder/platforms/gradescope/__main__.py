"""``python -m autograder.platforms.gradescope prepare SOURCE | run [ROOT]``: what the zip's
``setup.sh`` and ``run_autograder`` call inside Gradescope's container (in_container.py)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from .in_container import grade_submission, prepare


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autograder.platforms.gradescope", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("prepare", help="release the assignment in the autograder's source folder (setup.sh)") \
        .add_argument("source")
    sub.add_parser("run", help="grade /autograder/submission into /autograder/results/results.json") \
        .add_argument("root", nargs="?", default=os.environ.get("WORKBOOK_AUTOGRADER_ROOT", "/autograder"))
    args = parser.parse_args(argv)
    if args.command == "prepare":
        course = prepare(Path(args.source).resolve())
        print(f"released {', '.join(p.name for p in course.release_dir.iterdir())} in {course.root}")
        return 0
    grade_submission(Path(args.root).resolve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
