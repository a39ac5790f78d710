"""The student's side of a check: what runs beside the student's code (in a graded notebook, in
its sealed process) and hands back plain data. ``calls`` (what the grader asks for), ``perform``
(the only code that touches a student's implementation), ``probes`` (the ways of asking),
``watch`` (the reference and forbidden callables), ``silence`` (output kept off the page),
``wire`` (the plain-data format both sides speak) and ``fixtures`` (objects built on the
student's side). Copied whole into the sealed course; imports nothing of ``judge`` or ``items``
(tests/unit/test_architecture.py)."""
