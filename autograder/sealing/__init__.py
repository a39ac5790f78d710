"""How a submission is sealed off while it runs: ``sandbox`` (bubblewrap), ``container``
(where bubblewrap cannot start: another Unix user) and ``course_copy`` (the copy of course_lib
the sealed notebook sees, its graded references replaced by stubs). Imports ``doors/`` and
``course/`` only.
"""
