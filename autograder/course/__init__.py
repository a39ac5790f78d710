"""The course folder and what grading depends on: ``course`` (nbgrader's configuration, the
folders, the gradebook), ``settings`` (``c.Workbook`` and ``c.Intake`` in nbgrader_config.py),
``problems`` (what can be wrong with a submission), ``manifest`` (a digest of the course
files), ``release`` (the student notebooks from ``solutions/``) and ``migrate`` (the gradebook
to another database). Imports only ``doors/``.
"""

from .course import Course, CourseError, counted_points, find_course_root, read_json, with_retry, write_json_atomic

__all__ = ["Course", "CourseError", "counted_points", "find_course_root", "read_json", "with_retry", "write_json_atomic"]
