"""The course on other people's systems: Gradescope (``gradescope/``), an LMS (``lms_roster``
reads its export, ``lms`` writes its grade import), nbgrader's Formgrader, also as a hub's
service (``formgrader``), and the repository students receive (``student_edition``).
Imports any folder below it.
"""
