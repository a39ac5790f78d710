"""Everything of the autograder that runs inside the sandbox, with the student's code, and
nothing else: the sandbox mounts this folder alone (autograder/sealing/sandbox.py), and nothing
here imports the rest of ``autograder`` (tests/unit/test_architecture.py checks both).

- ``notebook_runner.py``: the sandbox's first process: runs the notebook's code cells, streams
  their outputs, answers each test cell's plan with the student's objects;
- ``channel.py``: the frames both sides exchange over one socket (plain data only);
- ``cells.py``: what a cell is to the grader (its nbgrader metadata, test or not);
- ``grading_init.py`` and ``reference_stubs.py``: copied into the sandbox's course_lib (by
  autograder/sealing/course_copy.py) as ``course_lib.grading`` and the stubs of the notebook's references.

Everything here may be tampered with by the student's code: the trusted side believes
none of it, it only validates, caps and judges what comes out.
"""
