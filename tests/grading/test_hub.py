"""The course on a real JupyterHub on localhost (deploy/jupyterhub), end to end.

JupyterHub and its proxy (configurable-http-proxy, `make hub`) start from the deployment's own
configuration; two students and an instructor are Unix accounts made for the test (as on a
hub: each server runs as its user's account) and sign in through the hub's REST API with
their passwords. setup_course.py makes the exchange and the students' environment from the
student edition. The instructor releases notebook 03 from the course's Formgrader service (a
kernel there, as its terminal would); one student finds it in JupyterLab's Assignments tab in
headless Chromium and fetches it there, the other through the same API; each executes it in a
real kernel on their own server (one correct, one with a wrong causal mask; the course's
grading mode, short training, keeps the test cheap) and submits it through the exchange. The instructor collects (`workbook collect --exchange`), autogrades and
releases the feedback; each student fetches their own page and no one else's. The grades are
the ones the same notebooks earn through `workbook` alone, and neither student can reach
Formgrader, the course's folder or the other's files.

Needs root (it makes Unix accounts; skipped otherwise), the proxy and bubblewrap (`make test`
installs both, and a Python of the virtualenv's version the accounts can run). One hub serves the whole module.
"""

from __future__ import annotations

import csv
import html
import io
import json
import os
import pwd
import shutil
import subprocess
import time
from pathlib import Path

import nbformat
import pytest

from browser import CHROMIUM, Chromium
from hubtools import Accounts, Hub, HubUser, Unreachable, can_act_as_others, make_env, runnable_python, shared_folder
from nbtools import Course, solution_sources

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy" / "jupyterhub"
PROXY = DEPLOY / "node_modules" / ".bin" / "configurable-http-proxy"
A = "03_self_attention"
COURSE_ID = "attention-workbook"
ITEMS = ("scaled_dot_product_attention", "causal_mask", "padding_mask", "SelfAttention")
SOL = solution_sources(A)
WRONG = {"causal_mask": SOL["causal_mask"].replace(".tril()", ".triu()")}  # the future let in
EXPECTED = {"alice": (5, 2, 2, 4), "bob": (5, 0, 2, 4)}  # points per test cell (tests/grading/test_nbgrader_03.py)


def _why_not() -> str:
    why = can_act_as_others()
    if why:
        return why
    if not PROXY.exists():
        return f"configurable-http-proxy is not installed ({PROXY}): run `make hub`"
    if shutil.which("bwrap") is None:
        return "bubblewrap is not installed (make sandbox): the instructor's autograde needs it"
    python, why = runnable_python()
    return why


WHY_NOT = _why_not()


def _copy_checkout(dest: Path) -> None:
    """The course's repository as an instructor clones it (the files git knows, as in this working tree)."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, check=True, timeout=60).stdout.decode().split("\0")
    for rel in filter(None, listed):
        src = REPO / rel
        if src.is_file() and not src.is_symlink():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


def _chown_tree(path: Path, user: str) -> None:
    entry = pwd.getpwnam(user)
    for top, dirs, files in os.walk(path):
        for name in [top, *(os.path.join(top, n) for n in dirs + files)]:
            os.lchown(name, entry.pw_uid, entry.pw_gid)


def _answered(nb, cells: dict[str, str]):
    """The fetched notebook with the student's answers: the solutions, except ``cells``."""
    answers = {**SOL, **cells}
    for cell in nb.cells:
        gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if cell.cell_type == "code" and gid in answers and cell.metadata["nbgrader"].get("solution"):
            cell.source = answers[gid]
    return nb


def _execute_on_server(user: HubUser, path: str, nb) -> None:
    """Run every code cell in a kernel on the user's server (working folder: the notebook's) and
    keep the outputs, as JupyterLab's Run All does; then save the notebook there. The kernel is
    in the course's grading mode (short training: the test's CPU budget), as the grader runs it."""
    kernel = user.kernel(f"/user/{user.name}", path)
    try:
        kernel.run("import os; os.environ['WORKBOOK_GRADING'] = '1'")
        for number, cell in enumerate(c for c in nb.cells if c.cell_type == "code"):
            cell.outputs = kernel.execute(cell.source, timeout=600)
            cell.execution_count = number + 1
    finally:
        kernel.close()
    saved = user.put(f"/user/{user.name}/api/contents/{path}", json={"type": "notebook", "format": "json",
                                                                        "content": json.loads(nbformat.writes(nb))})
    assert saved.status_code == 200, saved.text


def _assignment_action(user: HubUser, action: str) -> list[dict]:
    """What the Assignments tab's buttons do: nbgrader's assignment_list API on the user's server."""
    response = user.post(f"/user/{user.name}/assignments/{action}",
                         data={"course_id": COURSE_ID, "assignment_id": A})
    assert response.status_code == 200, response.text
    body = response.json()
    assert not (isinstance(body, dict) and body.get("success") is False), body
    return body


def _listing(user: HubUser) -> list[dict]:
    response = user.get(f"/user/{user.name}/assignments", params={"course_id": COURSE_ID})
    assert response.status_code == 200, response.text
    return response.json()["value"]


def _browser_fetch(hub: Hub, user: str, password: str, shots: Path) -> dict:
    """Sign in on the hub's login page in Chromium, open JupyterLab's Assignments tab (Nbgrader
    → Assignment List), find the released assignment there and press its Fetch button."""
    browser = Chromium(width=1400, height=1000)
    try:
        browser.navigate(f"{hub.url}/hub/login")
        browser.wait_for("document.querySelector('#username_input') !== null", timeout=60)
        browser.evaluate(f"document.querySelector('#username_input').value = {json.dumps(user)};"
                         f"document.querySelector('#password_input').value = {json.dumps(password)};"
                         "document.querySelector('form').submit(); true")
        # JupyterLab has started once its launcher is shown (a fresh home)
        browser.wait_for(f"location.pathname.startsWith('/user/{user}/lab') && "
                         "document.querySelector('.jp-Launcher') !== null", timeout=240)
        menu = "Array.from(document.querySelectorAll('.lm-MenuBar-item')).find(e => e.textContent.trim() === 'Nbgrader')"
        item = ("Array.from(document.querySelectorAll('.lm-Menu-item')).find(e => "
                "e.textContent.trim() === 'Assignment List')")
        browser.wait_for(f"{menu} !== undefined", timeout=60)
        for _ in range(4):  # a click while JupyterLab still lays itself out can go unseen (a slow machine: wait
            browser.click(menu)  # long for the menu, so that a second click never closes a menu that was opening)
            try:
                browser.wait_for(f"{item} !== undefined", timeout=20)
                break
            except TimeoutError:
                pass
        else:
            browser.screenshot(shots / "menu.png")
            raise AssertionError(f"the Nbgrader menu did not open, or holds no Assignment List ({shots / 'menu.png'})")
        menu_items = browser.evaluate("Array.from(document.querySelectorAll('.lm-Menu-item'))"
                                      ".filter(e => e.offsetParent !== null).map(e => e.textContent.trim())")
        browser.click(item)
        released = ("Array.from(document.querySelectorAll('#released_assignments_list .list_item'))"
                    f".find(e => e.textContent.includes({json.dumps(A)}))")
        browser.wait_for(f"{released} !== undefined", timeout=120)
        tab = browser.evaluate("Array.from(document.querySelectorAll('.lm-TabBar-tabLabel'))"
                               ".map(e => e.textContent.trim())")
        browser.screenshot(shots / "assignments-released.png")
        browser.evaluate(f"{released}.querySelector('button').click(); true")
        fetched = ("Array.from(document.querySelectorAll('#fetched_assignments_list .list_item'))"
                   f".find(e => e.textContent.includes({json.dumps(A)}))")
        browser.wait_for(f"{fetched} !== undefined", timeout=120)
        browser.screenshot(shots / "assignments-fetched.png")
        outside = [u for u in browser.requests if u.startswith(("http:", "https:", "ws:", "wss:"))
                   and not u.startswith((hub.url, hub.url.replace("http:", "ws:")))]
        return {"menu": menu_items, "tabs": tab, "outside": outside}
    finally:
        browser.close()


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    if WHY_NOT:
        pytest.skip(WHY_NOT)
    python, _ = runnable_python()
    shots = tmp_path_factory.mktemp("hub-screens")
    try:
        top = shared_folder("workbook-hub-")  # what the hub's accounts reach lies here, never in this checkout
    except Unreachable as exc:
        pytest.skip(str(exc))
    (top / "home").mkdir(mode=0o755)
    accounts = Accounts(top / "home")
    hub = None
    out: dict = {"started": time.monotonic(), "top": top, "times": {}}

    def lap(phase: str) -> None:
        out["times"][phase] = round(time.monotonic() - out["started"] - sum(out["times"].values()), 1)
    try:
        alice, bob, prof, grader = (accounts.add(n) for n in ("alice", "bob", "prof", "grader"))
        out.update(alice=alice, bob=bob, prof=prof, grader=grader, accounts=accounts)
        # the grader's checkout and its environment (`make setup` in the checkout, as the grader)
        course = accounts.home(grader) / COURSE_ID
        _copy_checkout(course)
        (course / "roster.txt").write_text(f"id\n{alice}\n{bob}\n")
        grader_python = make_env(top / "grader-env", python, course_code=False)
        done = subprocess.run([str(grader_python), "-m", "pip", "install", "--quiet", "--no-deps",
                               "--no-build-isolation", "-e", str(course)], capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr
        _chown_tree(course, grader)
        lap("accounts, the grader's checkout and environment")
        # the exchange, the student edition and the students' environment (setup_course.py, as root)
        make_env(top / "student-env", python, course_code=False)
        setup = subprocess.run([python, str(DEPLOY / "setup_course.py"), "--course", str(course), "--grader", grader,
                                "--student-env", str(top / "student-env"), "--exchange", str(top / "exchange"),
                                "--grader-python", str(grader_python), "--python", python, "--no-deps"],
                               capture_output=True, text=True, timeout=900)
        assert setup.returncode == 0, setup.stdout + setup.stderr
        out["setup"] = setup.stdout
        lap("setup_course.py")
        env = {"WORKBOOK_HUB_COURSE": str(course), "WORKBOOK_HUB_GRADER": grader,
               "WORKBOOK_HUB_GRADER_PYTHON": str(grader_python),
               "WORKBOOK_HUB_STUDENT_PYTHON": str(top / "student-env" / "bin" / "python"),
               "WORKBOOK_HUB_INSTRUCTORS": prof, "WORKBOOK_EXCHANGE": str(top / "exchange"),
               "WORKBOOK_HUB_SERVICE_PORT": str(_free_port()), "WORKBOOK_HUB_DATA": str(top / "hub")}
        hub = Hub(DEPLOY / "jupyterhub_config.py", top / "hub", env, top / "hub.log",
                  ["--Spawner.http_timeout=180", "--Spawner.start_timeout=240"])
        hub.service_port = int(env["WORKBOOK_HUB_SERVICE_PORT"])
        out["hub"] = hub
        hub.wait()
        lap("the hub and the Formgrader service up")

        # everyone signs in through the hub; a wrong password is refused
        import requests
        wrong = requests.post(f"{hub.url}/hub/api/users/{alice}/tokens", timeout=60,
                              json={"auth": {"username": alice, "password": "not-" + accounts.passwords[alice]}})
        out["wrong_password"] = wrong.status_code
        users = {name: HubUser(hub, name, accounts.passwords[name]) for name in (alice, bob, prof)}
        out["users"] = users
        for name in (alice, bob):  # the instructor works in the Formgrader service, not a server of their own
            users[name].start_server()
        lap("sign-ins, the students' servers up")

        # the instructor releases the assignment from the course's Formgrader service (its terminal's commands)
        out["release"] = _instructor(users[prof], _shell(f"workbook release {A}", f"nbgrader release_assignment {A}"))
        lap("release")

        # students: one in the browser's Assignments tab, one through the same API; both execute and submit
        out["listed"] = {name: _listing(users[name]) for name in (alice, bob)}
        if CHROMIUM is not None:
            out["browser"] = _browser_fetch(hub, bob, accounts.passwords[bob], shots)
            out["shots"] = shots
        else:
            _assignment_action(users[bob], "fetch")
        _assignment_action(users[alice], "fetch")
        lap("fetch (one student in Chromium)")
        path = f"{A}/{A}.ipynb"
        executed = {}
        for name, cells in ((alice, {}), (bob, WRONG)):
            fetched = users[name].get(f"/user/{name}/api/contents/{path}").json()["content"]
            nb = _answered(nbformat.from_dict(fetched), cells)
            _execute_on_server(users[name], path, nb)
            executed[name] = nb
            _assignment_action(users[name], "submit")
        out["executed"] = executed
        lap("execute and submit")

        # the instructor collects from the exchange, autogrades, writes and releases the feedback
        out["graded"] = _instructor(users[prof], _shell(
            f"workbook collect --exchange {A}", f"workbook autograde {A} -j 2 --quiet", f"workbook feedback {A}",
            f"nbgrader release_feedback {A}", "workbook status", "workbook export -o grading/grades.csv"))
        out["grades"] = json.loads(_instructor(users[prof], _GRADES))
        lap("collect, autograde, feedback")
        for name in (alice, bob):
            _assignment_action(users[name], "fetch_feedback")
        out["course"] = course
        # what each student's own kernel sees of the machine (the tests below judge it)
        out["probes"] = {name: _probe(users[name], hub, course, top, accounts, alice, bob) for name in (alice, bob)}
        lap("fetch feedback, probes")
        print("seconds:", json.dumps(out["times"]))
        yield out
    finally:
        if hub is not None:
            hub.stop()
            out["hub_log"] = hub.tail(20000)
        accounts.remove()
        shutil.rmtree(top, ignore_errors=True)


_PROBE = """
import getpass, importlib.util, inspect, json, os, urllib.error, urllib.request
out = {"user": getpass.getuser(), "cwd": os.getcwd(), "files": {}, "writes": {}, "urls": {}}
for key, path in PATHS.items():
    try:
        out["files"][key] = os.listdir(path)
    except PermissionError:
        out["files"][key] = "denied"
for key, path in WRITES.items():
    try:
        with open(path, "x") as f:
            f.write("planted")
        out["writes"][key] = "written"
    except PermissionError:
        out["writes"][key] = "denied"
for key, (url, token) in URLS.items():
    request = urllib.request.Request(url, headers={"Authorization": f"token {token}"} if token else {})
    class Stay(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args):
            return None
    try:
        out["urls"][key] = urllib.request.build_opener(Stay).open(request, timeout=60).status
    except urllib.error.HTTPError as exc:
        out["urls"][key] = exc.code
if FULL:
    import course_lib, course_lib.grading.items.self_attention as items
    out["course_lib"] = course_lib.__file__
    out["stripped"] = "_graded_by_the_course" in inspect.getsource(items)
    out["autograder"] = importlib.util.find_spec("autograder") is not None
print(json.dumps(out))
"""


def _probe(user: HubUser, hub: Hub, course: Path, top: Path, accounts: Accounts, alice: str, bob: str) -> dict:
    """From a kernel on the user's own server (alice's in full): who it runs as; whether it can
    list the course's folder, the other student's home, the exchange's hand-ins and feedback;
    what the Formgrader service's own port (past the hub's proxy) and the proxy's API answer to
    her server's own token and to none; the students' course_lib."""
    other = bob if user.name == alice else alice
    exchange = top / "exchange" / COURSE_ID
    service = f"http://127.0.0.1:{hub.service_port}/services/{COURSE_ID}"
    paths = {"course": str(course / "solutions"), "home": str(accounts.home(other)),
             "inbound": str(exchange / "inbound"), "feedback": str(exchange / "feedback")}
    # what every student fetches, and the course's folder in the exchange (no one may plant a release there)
    writes = {"released": str(exchange / "outbound" / A / "planted.py"), "course's exchange": str(exchange / "planted")}
    urls = {"service, her token": (f"{service}/api/contents", "TOKEN"), "service, no token": (f"{service}/api/contents", ""),
            "formgrader, her token": (f"{service}/formgrader/api/submitted_notebooks/{A}/{A}", "TOKEN"),
            "proxy api, her token": (f"{hub.proxy_api}/api/routes", "TOKEN"),
            "proxy api, no token": (f"{hub.proxy_api}/api/routes", "")}
    code = (f"PATHS = {paths!r}\nWRITES = {writes!r}\nURLS = {urls!r}\nFULL = {user.name == alice}\n"
            "URLS = {k: (u, os.environ['JUPYTERHUB_API_TOKEN'] if t == 'TOKEN' else t) for k, (u, t) in URLS.items()}\n")
    kernel = user.kernel(f"/user/{user.name}")
    try:
        return json.loads(kernel.run("import os\n" + code + _PROBE).strip().splitlines()[-1])
    finally:
        kernel.close()


def _instructor(user: HubUser, code: str) -> str:
    """Run ``code`` in a kernel of the course's Formgrader service (as the grader's account)."""
    kernel = user.kernel(f"/services/{COURSE_ID}")
    try:
        return kernel.run(code, timeout=1200)
    finally:
        kernel.close()


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _shell(*commands: str) -> str:
    """Python for the instructor's kernel: run each command as its terminal would, stop at the first
    that fails (its output shown)."""
    return ("import subprocess, sys\n"
            f"for command in {list(commands)!r}:\n"
            "    done = subprocess.run(command, shell=True, capture_output=True, text=True)\n"
            "    print(f'$ {command}\\n{done.stdout}{done.stderr}')\n"
            "    if done.returncode:\n"
            "        raise SystemExit(f'{command} failed ({done.returncode})')\n")


_GRADES = """
import json
from nbgrader.api import Gradebook
from autograder.course import Course
course = Course('.')
with Gradebook(course.db_url) as gb:
    out = {s.student.id: {g.name: g.score for nb in s.notebooks for g in nb.grades if g.cell_type == 'code'}
           for s in gb.assignment_submissions('03_self_attention')}
print(json.dumps(out))
"""


def _points(grades: dict) -> tuple:
    return tuple(grades[f"test_{item}"] for item in ITEMS)


def test_everyone_signs_in_through_the_hub_and_a_wrong_password_is_refused(run):
    assert run["wrong_password"] == 403
    for name in (run["alice"], run["bob"]):
        model = run["users"][name].get(f"/hub/api/users/{name}").json()
        assert model["servers"][""]["ready"]
        # each server runs as its user's own Unix account, in their home
        assert (run["probes"][name]["user"], run["probes"][name]["cwd"]) == (name, pwd.getpwnam(name).pw_dir)
    assert run["users"][run["prof"]].get(f"/hub/api/users/{run['prof']}").status_code == 200


def test_the_students_environment_is_the_student_edition(run):
    """course_lib in the students' kernels is the student edition's (no hidden check's code), and
    nothing of the grader is importable there."""
    probe = run["probes"][run["alice"]]
    assert probe["course_lib"].startswith(str(run["top"] / "student-env"))
    assert probe["stripped"] and not probe["autograder"]
    # setup_course.py made it and found the students' homes private (it warns otherwise)
    assert "students' environment:" in run["setup"] and "warning" not in run["setup"], run["setup"]


def test_the_released_assignment_is_listed_for_each_student(run):
    for name in (run["alice"], run["bob"]):
        listed = [(a["course_id"], a["assignment_id"], a["status"]) for a in run["listed"][name]]
        assert listed == [(COURSE_ID, A, "released")], listed
    assert "generated notebooks/03_self_attention" in run["release"]


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed")
def test_a_student_sees_the_assignment_in_the_assignments_tab_and_fetches_it_there(run):
    browser = run["browser"]
    assert "Assignments" in browser["tabs"]
    # the student's Nbgrader menu holds the Assignment List only: no Formgrader, Course List or Create Assignment
    assert browser["menu"] == ["Assignment List"], browser["menu"]
    assert not browser["outside"], browser["outside"]  # nothing fetched from outside the hub
    assert (run["shots"] / "assignments-fetched.png").stat().st_size > 10_000


def test_each_student_ran_it_in_a_kernel_on_their_own_server(run):
    """The test cells printed the student edition's reports in the students' kernels: alice's
    pass, bob's causal mask is caught there already."""
    def report(nb, item):
        cell = next(c for c in nb.cells if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == f"test_{item}")
        return "".join(o.get("text", "") for o in cell.outputs if o["output_type"] == "stream")
    alice, bob = run["executed"][run["alice"]], run["executed"][run["bob"]]
    assert all(report(alice, item).startswith("✓") for item in ITEMS), [report(alice, i) for i in ITEMS]
    assert report(bob, "causal_mask").startswith("✗") and "future" in report(bob, "causal_mask")


def test_the_instructor_collects_from_the_exchange_autogrades_and_releases_feedback(run):
    graded = run["graded"]
    assert "imported 2 students; 0 rejected; 0 files ignored; 0 errors" in graded
    assert f"{A}: graded 2 notebooks of 2 students (0 could not be graded, 0 with problems" in graded
    assert "Releasing feedback for student" in graded or "Feedback released" in graded
    for name in (run["alice"], run["bob"]):
        assert f"  {name}: {A} (handed in " in graded  # dated by the exchange's files


def test_the_grades_are_the_ones_the_notebooks_earn_through_workbook_alone(run, tmp_path):
    hub_grades = {name: _points(run["grades"][run[name]]) for name in ("alice", "bob")}
    assert hub_grades == EXPECTED
    # the same submitted notebooks, collected from a folder and graded by `workbook` on its own
    plain = Course([A])
    try:
        plain.workbook("release", A)
        folder = tmp_path / "handed-in"
        for name in ("alice", "bob"):
            (folder / name).mkdir(parents=True)
            shutil.copy(run["course"] / "grading" / "submitted" / run[name] / A / f"{A}.ipynb", folder / name)
        plain.workbook("collect", str(folder), "-a", A)
        plain.workbook("autograde", A, "-j", "2", "--quiet")
        scores = plain.scores(A)
        assert {name: _points(scores[name]) for name in ("alice", "bob")} == hub_grades
    finally:
        plain.close()
    rows = {r["student"]: r for r in csv.DictReader(io.StringIO(
        (run["course"] / "grading" / "grades.csv").read_text()))}
    assert float(rows[run["alice"]]["auto"]) == 13 and float(rows[run["bob"]]["auto"]) == 11


def test_each_student_fetches_exactly_their_own_feedback(run):
    pages = {}
    for name in (run["alice"], run["bob"]):
        user = run["users"][name]
        listing = user.get(f"/user/{name}/api/contents/{A}/feedback").json()["content"]
        assert len(listing) == 1  # one submission's feedback
        stamp = listing[0]["name"]
        files = user.get(f"/user/{name}/api/contents/{A}/feedback/{stamp}").json()["content"]
        assert [f["name"] for f in files] == [f"{A}.html"]
        page = user.get(f"/user/{name}/api/contents/{A}/feedback/{stamp}/{A}.html").json()["content"]
        written = (run["course"] / "grading" / "feedback" / name / A / f"{A}.html").read_text()
        assert page == written  # the page the instructor's `workbook feedback` wrote for them
        pages[name] = html.unescape(page)
    assert "Autograding: 03_self_attention — 13 / 19 points" in pages[run["alice"]]
    assert "Autograding: 03_self_attention — 11 / 19 points" in pages[run["bob"]]
    assert pages[run["alice"]] != pages[run["bob"]]


def test_students_cannot_reach_formgrader_or_anyone_elses_files(run):
    alice, bob, prof = run["alice"], run["bob"], run["prof"]
    users = run["users"]
    service = f"/services/{COURSE_ID}"
    api = f"{service}/formgrader/api/submitted_notebooks/{A}/{A}"
    # the instructor reaches Formgrader through the hub, as a whole page (JupyterHub ≥ 4.1 forbids its iframe)
    submitted = users[prof].get(api)
    assert submitted.status_code == 200 and {s["student"] for s in submitted.json()} == {alice, bob}
    page = users[prof].get(f"{service}/formgrader/gradebook/{A}/{A}")
    assert page.status_code == 200 and "frame-ancestors 'none'" in page.headers.get("Content-Security-Policy", "")
    for student in (alice, bob):
        for path in (api, f"{service}/formgrader/gradebook", f"{service}/api/contents", f"{service}/lab"):
            got = users[student].get(path, allow_redirects=False)
            assert got.status_code == 403, (student, path, got.status_code)
    # nor another student's server
    for path in (f"/user/{bob}/api/contents", f"/user/{bob}/api/contents/{A}/{A}.ipynb", f"/user/{bob}/lab"):
        got = users[alice].get(path, allow_redirects=False)
        assert got.status_code == 403, (path, got.status_code)
    # nor anyone else's account on the hub
    for path in (f"/hub/api/users/{bob}", f"/hub/api/users/{bob}/tokens", f"/hub/api/users/{prof}"):
        got = users[alice].get(path, allow_redirects=False)
        assert got.status_code in (403, 404), (path, got.status_code)
    listed = users[alice].get("/hub/api/users")
    assert listed.status_code == 403 or [u["name"] for u in listed.json()] == [alice], listed.text[:300]
    # nor, from her own kernel: the course's folder, the other's home, the exchange's hand-ins and
    # feedback; plant a file in the released assignment or the course's exchange folder; the Formgrader service's own port past the proxy (her server's token, or none); the
    # proxy's API (which could reroute the hub)
    for name in (alice, bob):
        assert run["probes"][name]["files"] == {key: "denied" for key in ("course", "home", "inbound", "feedback")}, \
            run["probes"][name]["files"]
        assert run["probes"][name]["writes"] == {"released": "denied", "course's exchange": "denied"}, \
            run["probes"][name]["writes"]
        urls = run["probes"][name]["urls"]
        assert urls["service, her token"] == urls["formgrader, her token"] == 403, urls
        assert urls["service, no token"] in (302, 403), urls  # sent to the hub's login, never served
        assert urls["proxy api, her token"] == urls["proxy api, no token"] == 403, urls
    # the released assignment is readable by all (it is what they fetch)
    exchange = run["top"] / "exchange" / COURSE_ID
    assert os.stat(exchange / "outbound" / A / f"{A}.ipynb").st_mode & 0o004
