"""How a submission is sealed off while it runs: ``isolation`` (which way, decided in one
place, checked before a batch), ``sandbox`` (bubblewrap), ``container`` (where bubblewrap
cannot start: another Unix user) and ``course_copy`` (the copy of course_lib the sealed
notebook sees, its graded references replaced by stubs). Imports ``doors/`` and ``course/``.
"""
