"""``workbook gradescope``: one assignment as a Gradescope autograder, graded by the same
checks and the same sealed runner as ``workbook autograde``.

- ``build.py``: the zip, built on the instructor's machine (``workbook gradescope``);
- ``in_container.py``: what runs inside Gradescope's container, from the zip: ``prepare``
  (``setup.sh``, once per image) and ``grade_submission`` (``run_autograder``, once per
  submission: collect, autograde, results.json);
- ``results.py``: Gradescope's ``results.json`` from what grading recorded;
- ``python -m autograder.platforms.gradescope prepare|run``: what the zip's two scripts call.

A zip carries its own copy of the grader (``autograder/``, ``course_lib/``), so one built
before a change keeps grading as it did when it was built; build it again to grade with the
change.
"""

SETTINGS = "gradescope.json"  # in the zip: what was chosen at build
DEFAULT_USER = "workbook-student"  # the student's user in the container (setup.sh makes it)
