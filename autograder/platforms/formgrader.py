"""``workbook formgrader``: nbgrader's Formgrader on this course, for the written answers.

Written answers (markdown cells worth points) are graded by a person, in nbgrader's
Formgrader. This opens JupyterLab on the course folder with nbgrader's instructor
tools on and the browser at Formgrader's page for the assignment's submissions.

On a hub, ``workbook formgrader --hub`` is the course's service (deploy/jupyterhub): the
same server under JupyterHub's single-user app, which lets in only the users whose role
grants access to the service, opening Formgrader's own pages (JupyterLab's Formgrader
panel is an iframe, which JupyterHub 4.1 and later forbid).

In that session Formgrader's *autograde* and *generate feedback* buttons answer with
what to run instead (this module is a Jupyter server extension, enabled by
``formgrader_config/``): nbgrader would run submissions in ordinary kernels with the
instructor's privileges, and write feedback pages without the workbook's protections
(its ``autograde`` also deletes the autograded notebook before it starts).
``workbook autograde`` grades each submission sealed off; ``workbook feedback`` writes
the pages.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from ..course import Course

__all__ = ["formgrader_url", "formgrader_command", "open_formgrader"]

CONFIG = Path(__file__).resolve().parent / "formgrader_config"  # Formgrader and this extension on, no news
# on a hub: JupyterLab's Formgrader panel off (it shows Formgrader in an iframe, which JupyterHub 4.1 and later
# forbid: frame-ancestors 'none'; nbgrader issue 1870); Formgrader's own pages open instead, as whole pages
HUB_CONFIG = Path(__file__).resolve().parent / "formgrader_hub_config"
REFUSED = {  # Formgrader's API routes that run nbgrader's own steps, and what to run instead
    r"/formgrader/api/submission/([^/]+)/([^/]+)/autograde":
        "Formgrader does not autograde this course: its kernels would run the submission with your "
        "privileges. Run `workbook autograde` (each submission sealed off), then grade the written answers here.",
    r"/formgrader/api/assignment/([^/]+)/generate_feedback":
        "Feedback for this course is written by `workbook feedback` (hidden tests left out, problems on top, "
        "answers not graded yet marked as such).",
    r"/formgrader/api/assignment/([^/]+)/([^/]+)/generate_feedback":
        "Feedback for this course is written by `workbook feedback` (hidden tests left out, problems on top, "
        "answers not graded yet marked as such).",
}


def _jupyter_server_extension_points() -> list[dict]:
    return [{"module": "autograder.platforms.formgrader"}]


# a submission's page, and the files beside it that nbgrader would serve from the autograded folder
SUBMISSION_PAGE = r"/formgrader/submissions/(?!components/)([^/]+)/?"
SUBMISSION_FILE = r"/formgrader/submissions/(?!components/)([^/]+)/(.*\.[^/]*)"


def _safe_handlers() -> list[tuple[str, type]]:
    """Formgrader's submission page rendered by :class:`autograder.doors.outbound.SafeHTMLExporter`
    (the student's markdown and outputs through the sanitiser: the page runs in the
    instructor's Jupyter session), and nothing served from a submission's folder."""
    from nbgrader.server_extensions.formgrader.apihandlers import BaseApiHandler
    from nbgrader.server_extensions.formgrader.handlers import SubmissionHandler
    from tornado import web

    from ..doors.outbound import SafeHTMLExporter

    class SafeSubmission(SubmissionHandler):
        @property
        def exporter(self):
            safe = self.settings.get("workbook_safe_exporter")
            if safe is None:
                safe = SafeHTMLExporter(config=self.settings["nbgrader_exporter"].config)
                self.settings["workbook_safe_exporter"] = safe
            return safe

    class ReleaseFeedback(BaseApiHandler):
        """Formgrader's "release feedback": nbgrader's exchange release for every student who
        handed in through the exchange (it names their page by the secret it gave them); the
        others, collected from an LMS download, are named: their pages go back through the LMS."""

        @web.authenticated
        def post(self, assignment: str) -> None:
            root = Path(self.coursedir.root) / self.coursedir.feedback_directory
            released, lms, failed = [], [], []
            for folder in sorted(root.glob(f"*/{assignment}")):
                student = folder.parent.name
                if not any(folder.glob("*.html")):
                    continue
                if not ((folder / "submission_secret.txt").is_file() and (folder / "timestamp.txt").is_file()):
                    lms.append(student)
                    continue
                result = self.api.release_feedback(assignment, student)
                (released if result.get("success") else failed).append(student)
            words = [f"released the feedback of {len(released)} students to the exchange"]
            if lms:
                words.append(f"{len(lms)} handed in through an LMS download, not the exchange ({', '.join(lms[:10])}"
                             f"{' …' if len(lms) > 10 else ''}): return their pages from grading/feedback/<student>/ "
                             "through the LMS")
            if failed:
                words.append(f"the exchange refused {', '.join(failed)}: see the server's log")
            message = "; ".join(words) + "."
            self.finish(json.dumps({"success": bool(released) and not failed, "log": message,
                                    **({} if released and not failed else {"error": message})}))

    class NoSubmissionFiles(SubmissionHandler):
        @web.authenticated
        def get(self, *args: str) -> None:
            raise web.HTTPError(404, "the workbook's Formgrader serves no files of a submission")

    return [(SUBMISSION_PAGE, SafeSubmission), (SUBMISSION_FILE, NoSubmissionFiles),
            (r"/formgrader/api/assignment/([^/]+)/release_feedback", ReleaseFeedback)]


def _load_jupyter_server_extension(serverapp) -> None:
    """Put the refusals and the safe submission page in front of every other route
    (Formgrader's included)."""
    from jupyter_server.base.handlers import JupyterHandler
    from jupyter_server.utils import url_path_join
    from tornado import web
    from tornado.routing import HostMatches, Rule

    def refusal(message: str) -> type:
        class Refuse(JupyterHandler):
            @web.authenticated
            def post(self, *args: str) -> None:
                self.finish(json.dumps({"success": False, "error": message, "log": message}))
        return Refuse

    app = serverapp.web_app
    base = app.settings["base_url"]
    handlers = [(url_path_join(base, route), refusal(message)) for route, message in REFUSED.items()]
    handlers += [(url_path_join(base, route), handler) for route, handler in _safe_handlers()]
    app.default_router.rules.insert(0, Rule(HostMatches(".*$"), web._ApplicationRouter(app, handlers)))


def formgrader_url(course: Course, assignment: str | None = None) -> str:
    """The path of Formgrader's page: the assignment's submissions, or its overview."""
    if assignment is None:
        return "/formgrader/gradebook"
    from ..course.release import recorded_notebooks
    notebooks = recorded_notebooks(course, assignment)
    notebook = assignment if assignment in notebooks or not notebooks else notebooks[0]
    return f"/formgrader/gradebook/{assignment}/{notebook}"


def formgrader_command(course: Course, assignment: str | None = None, lab_args: list[str] = (),
                       hub: bool = False) -> tuple[list[str], dict[str, str]]:
    """(argv, environment) of JupyterLab on the course folder, opening Formgrader; with ``hub``,
    JupyterHub's single-user server (a hub service: the hub signs its users in and decides who
    may reach it), opening Formgrader's own page."""
    env = dict(os.environ)
    configs = (str(CONFIG), str(HUB_CONFIG) if hub else "", env.get("JUPYTER_CONFIG_PATH"))
    env["JUPYTER_CONFIG_PATH"] = os.pathsep.join(p for p in configs if p)
    if hub:
        env.setdefault("JUPYTERHUB_DEFAULT_URL", formgrader_url(course, assignment))
        return [sys.executable, "-m", "jupyterhub.singleuser", f"--ServerApp.root_dir={course.root}",
                *lab_args], env
    argv = [sys.executable, "-m", "jupyterlab", f"--ServerApp.root_dir={course.root}",
            f"--LabApp.default_url={formgrader_url(course, assignment)}", *lab_args]
    if os.geteuid() == 0 and "--allow-root" not in argv:  # containers, CI machines
        argv.append("--allow-root")
    return argv, env


def open_formgrader(course: Course, assignment: str | None = None, lab_args: list[str] = (),
                    hub: bool = False) -> int:
    """Start Formgrader on ``course`` (this process becomes JupyterLab, or with ``hub`` a
    JupyterHub service), or print the address of the one already running there."""
    from course_lib.workspace import running_server

    if hub:
        if not os.environ.get("JUPYTERHUB_SERVICE_NAME"):
            print("workbook formgrader --hub runs as a JupyterHub service (see deploy/jupyterhub): the hub starts it",
                  file=sys.stderr)
            return 2
        argv, env = formgrader_command(course, assignment, lab_args, hub=True)
        os.chdir(course.root)
        os.execve(sys.executable, argv, env)
    server = running_server(course.root)
    if server is not None:
        token = f"?token={server['token']}" if server.get("token") else ""
        print(f"Formgrader is already open on {course.root}: "
              f"{server['url'].rstrip('/')}{formgrader_url(course, assignment)}{token}")
        return 0
    argv, env = formgrader_command(course, assignment, lab_args)
    os.chdir(course.root)  # nbgrader finds the course's nbgrader_config.py here
    os.execve(sys.executable, argv, env)
    return 0  # not reached
