"""nbgrader configuration for the workbook.

Instructors edit notebooks in ``solutions/`` (the nbgrader source), ``make release``
generates the student notebooks in ``notebooks/``, and everything produced while
grading (submissions, autograded copies, feedback, the gradebook) lives in the
git-ignored ``grading/`` folder.
"""
import os

c = get_config()  # noqa: F821  (injected by traitlets)

here = os.path.dirname(os.path.abspath(__file__))

c.CourseDirectory.root = here
c.CourseDirectory.course_id = "attention-workbook"
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "notebooks"
c.CourseDirectory.submitted_directory = os.path.join("grading", "submitted")
c.CourseDirectory.autograded_directory = os.path.join("grading", "autograded")
c.CourseDirectory.feedback_directory = os.path.join("grading", "feedback")
c.CourseDirectory.solution_directory = os.path.join("grading", "solution")
c.CourseDirectory.source_with_tests_directory = os.path.join("grading", "source_with_tests")
c.CourseDirectory.db_url = "sqlite:///" + os.path.join(here, "grading", "gradebook.db")
os.makedirs(os.path.join(here, "grading"), exist_ok=True)  # sqlite does not create folders
# nbgrader's exchange (Formgrader's "release feedback", students' "fetch feedback"): the
# course's own folder unless a hub shares one (c.Exchange.root = "/srv/nbgrader/exchange")
c.Exchange.root = os.path.join(here, "grading", "exchange")
os.makedirs(c.Exchange.root, exist_ok=True)

# The course_lib checks never write to stderr, but a student's own code may make
# PyTorch or NumPy emit a harmless warning; nbgrader would score such a cell 0.
c.IgnorePattern.enabled = True
c.IgnorePattern.pattern = (
    r"(UserWarning|DeprecationWarning|FutureWarning|RuntimeWarning)"
    r"|TqdmWarning|it/s\]|%\|"
)

# Per-cell time limit while autograding (nbgrader's default of 30 s is too short for
# the cells that train a model).
c.Execute.timeout = 300
# Starting a kernel and importing torch can take a while on a busy machine.
c.Execute.startup_timeout = 180
