"""What people read once grading is done: ``feedback`` (the students' pages), ``status``
(the instructor's table, the grades CSV) and ``class_report`` (what the class got wrong).
Imports ``doors/`` and ``course/`` (never the pipeline: they read what it recorded).
"""
