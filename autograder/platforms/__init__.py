"""The course on other people's systems: Gradescope (``gradescope/``), an LMS's grade import
(``lms``), nbgrader's Formgrader and a hub (``formgrader``), and the repository students
receive (``student_edition``). Imports any folder below it.
"""
