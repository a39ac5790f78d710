"""What people read once grading is done: ``feedback`` (the students' pages), ``status`` (the
instructor's table), ``grades`` (the grades, and their CSV) and the class report
(``class_report``: the page, from ``class_data``, with ``class_plots``). Imports ``doors/``
and ``course/``, never the pipeline: they read what it recorded.
"""
