"""nbgrader in the students' environment on the hub: the course, and the exchange that the
Assignments tab fetches from and submits to (the hub passes WORKBOOK_EXCHANGE to every server)."""
import os

c = get_config()  # noqa: F821  (injected by traitlets)

c.CourseDirectory.course_id = "attention-workbook"
c.Exchange.root = os.environ.get("WORKBOOK_EXCHANGE", "/srv/nbgrader/exchange")
