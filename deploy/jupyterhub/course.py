"""The attention workbook as a course on a JupyterHub: load this into the hub's configuration
(deploy/jupyterhub/jupyterhub_config.py does; on The Littlest JupyterHub, copy it to
/opt/tljh/config/jupyterhub_config.d/). See README.md beside it.

- Students and instructors are hub users: the roster's ids and WORKBOOK_HUB_INSTRUCTORS.
- Students' servers run the single-user environment that setup_course.py made from the
  student edition (no solutions, no hidden tests), with nbgrader's Assignments tab.
- The course's Formgrader is a hub service named after the course (nbgrader's convention),
  run by the grader's account in the grader's checkout (`workbook formgrader --hub`), bound to
  127.0.0.1 and reached only through the hub's proxy; the hub lets in the group
  ``formgrade-attention-workbook`` (the instructors) and nobody else.
- The exchange is shared by everyone's servers (WORKBOOK_EXCHANGE, /srv/nbgrader/exchange).

Every setting comes from the environment, with defaults for one machine:

    WORKBOOK_HUB_COURSE          the grader's checkout of the course  (/home/grader-attention-workbook/attention-workbook)
    WORKBOOK_HUB_GRADER          the grader's Unix account            (grader-attention-workbook)
    WORKBOOK_HUB_GRADER_PYTHON   the checkout's Python                (<course>/.venv/bin/python)
    WORKBOOK_HUB_STUDENT_PYTHON  the students' environment's Python   (/opt/attention-workbook/student/bin/python)
    WORKBOOK_HUB_ROSTER          the students' ids, one a line        (<course>/roster.txt)
    WORKBOOK_HUB_INSTRUCTORS     instructors' hub names, commas       (none)
    WORKBOOK_EXCHANGE            nbgrader's exchange                  (/srv/nbgrader/exchange)
    WORKBOOK_HUB_SERVICE_PORT    Formgrader's port on 127.0.0.1       (10101)
    WORKBOOK_HUB_MEMORY          each user's memory limit             (2G; enforced by SystemdSpawner, KubeSpawner)
"""

import os
from pathlib import Path

c = get_config()  # noqa: F821  (injected by traitlets)

COURSE_ID = "attention-workbook"  # nbgrader_config.py's c.CourseDirectory.course_id
COURSE = Path(os.environ.get("WORKBOOK_HUB_COURSE", f"/home/grader-{COURSE_ID}/{COURSE_ID}"))
GRADER = os.environ.get("WORKBOOK_HUB_GRADER", f"grader-{COURSE_ID}")
GRADER_PYTHON = os.environ.get("WORKBOOK_HUB_GRADER_PYTHON", str(COURSE / ".venv" / "bin" / "python"))
STUDENT_PYTHON = os.environ.get("WORKBOOK_HUB_STUDENT_PYTHON", "/opt/attention-workbook/student/bin/python")
ROSTER = Path(os.environ.get("WORKBOOK_HUB_ROSTER", str(COURSE / "roster.txt")))
INSTRUCTORS = sorted({n.strip() for n in os.environ.get("WORKBOOK_HUB_INSTRUCTORS", "").split(",") if n.strip()})
EXCHANGE = os.environ.get("WORKBOOK_EXCHANGE", "/srv/nbgrader/exchange")
SERVICE_PORT = int(os.environ.get("WORKBOOK_HUB_SERVICE_PORT", "10101"))
MEMORY = os.environ.get("WORKBOOK_HUB_MEMORY", "2G")
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"


def _roster(path: Path) -> list[str]:
    """The ids of a roster as `workbook collect --roster` reads it: one a line, an optional
    header (id), or a CSV whose first column is the id."""
    if not path.is_file():
        return []
    ids = [line.split(",")[0].strip() for line in path.read_text(encoding="utf-8").splitlines()]
    return [i for i in ids if i and not i.startswith("#") and i.lower() not in ("id", "student_id", "student")]


# -- who may sign in -------------------------------------------------------------------------
c.Authenticator.allowed_users = set(_roster(ROSTER)) | set(INSTRUCTORS)

# -- the instructors reach Formgrader; nobody else does ------------------------------------------
GRADERS = f"formgrade-{COURSE_ID}"  # nbgrader's name for the group of a course's graders
c.JupyterHub.load_groups.update({GRADERS: {"users": INSTRUCTORS}})
c.JupyterHub.load_roles.append({
    "name": GRADERS,
    "description": f"grade {COURSE_ID} in its Formgrader",
    "groups": [GRADERS],
    "scopes": [f"access:services!service={COURSE_ID}", f"read:services!service={COURSE_ID}", "list:services"],
})

# -- the course's Formgrader: a service run by the grader's account --------------------------------
# (nbgrader's JupyterHubAuthPlugin is not used: the course id is fixed in the students' and the course's
# nbgrader_config.py, so the grader's account need not be a hub user: nbgrader issue 1872 does not arise)
c.JupyterHub.services.append({
    "name": COURSE_ID,
    "url": f"http://127.0.0.1:{SERVICE_PORT}",
    "command": [GRADER_PYTHON, "-m", "autograder.cli", "--course", str(COURSE), "formgrader", "--hub"],
    "user": GRADER,
    "cwd": str(COURSE),
    "display": True,
    "environment": {
        "WORKBOOK_EXCHANGE": EXCHANGE,  # the course's nbgrader_config.py takes the hub's exchange from it
        "PATH": f"{Path(GRADER_PYTHON).parent}:{SYSTEM_PATH}",  # `workbook`, `nbgrader` in its terminals
        "LANG": "C.UTF-8",
    },
})

# -- students' servers: the student edition, with nbgrader's Assignments tab ------------------------
c.Spawner.cmd = [STUDENT_PYTHON, "-m", "jupyterhub.singleuser"]
c.Spawner.default_url = "/lab"
c.Spawner.disable_user_config = True  # the environment's configuration holds: no ~/.jupyter overrides
c.Spawner.mem_limit = MEMORY
c.Spawner.environment.update({
    "WORKBOOK_EXCHANGE": EXCHANGE,  # read by the environment's nbgrader_config.py (setup_course.py)
    "PATH": f"{Path(STUDENT_PYTHON).parent}:{SYSTEM_PATH}",
    "LANG": "C.UTF-8",
})
