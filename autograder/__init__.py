"""Instructor tooling: release the student notebooks, collect and autograde
submissions, return feedback and export grades (built on nbgrader)."""
