"""A JupyterHub for the attention workbook on one machine: JupyterHub 6 with its proxy
(configurable-http-proxy from node_modules/, `make hub`), the machine's Unix accounts as
users (PAM: each student and instructor signs in with their own account and password, and
their server runs as that account), and the course from course.py. See README.md.

    sudo WORKBOOK_HUB_INSTRUCTORS=prof .venv/bin/jupyterhub -f deploy/jupyterhub/jupyterhub_config.py

    WORKBOOK_HUB_URL   where the hub listens  (http://:8000; put TLS in front, or set ssl_cert/ssl_key)
    WORKBOOK_HUB_DATA  the hub's own state: its database, cookie secret, proxy pid  (/srv/jupyterhub)

and course.py's settings (WORKBOOK_HUB_COURSE, WORKBOOK_HUB_GRADER, ...).
"""

import os
from pathlib import Path

c = get_config()  # noqa: F821  (injected by traitlets)

HERE = Path(__file__).resolve().parent
DATA = Path(os.environ.get("WORKBOOK_HUB_DATA", "/srv/jupyterhub"))
DATA.mkdir(mode=0o700, parents=True, exist_ok=True)

c.JupyterHub.bind_url = os.environ.get("WORKBOOK_HUB_URL", "http://:8000")
c.JupyterHub.db_url = f"sqlite:///{DATA / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(DATA / "jupyterhub_cookie_secret")
c.ConfigurableHTTPProxy.pid_file = str(DATA / "jupyterhub-proxy.pid")
PROXY = HERE / "node_modules" / ".bin" / "configurable-http-proxy"  # pinned by package-lock.json (make hub)
if PROXY.exists():
    c.ConfigurableHTTPProxy.command = [str(PROXY)]

c.JupyterHub.authenticator_class = "pam"  # the machine's accounts and passwords
c.JupyterHub.spawner_class = "localprocess"  # each server runs as its user's account (the hub runs as root)
c.JupyterHub.cleanup_servers = True  # stopping the hub stops the users' servers

load_subconfig(str(HERE / "course.py"))  # noqa: F821  (injected by traitlets)
