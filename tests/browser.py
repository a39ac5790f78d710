"""Drive a real JupyterLab in headless Chromium over the DevTools protocol.

``JupyterLab(folder)`` serves a folder on a free local port; ``Chromium()`` starts a
headless browser and talks to one page through the Chrome DevTools Protocol
(websocket-client, a dependency of jupyter_server), so no WebDriver is needed.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import websocket

from course_lib.workspace import lab_command
from nbtools import kernel_env

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_http(url: str, timeout: float = 60.0) -> bytes:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                return response.read()
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"nothing answered at {url} within {timeout:.0f} s")
            time.sleep(0.25)


class JupyterLab:
    """A JupyterLab server on 127.0.0.1 serving ``folder``, with the app exposed as
    ``window.jupyterapp`` so that tests can run its commands."""

    def __init__(self, folder: Path) -> None:
        self.port = free_port()
        self.token = "workbook-test-token"
        self.log = tempfile.TemporaryFile()
        # started the way `make lab` starts it (course_lib.workspace), on this folder
        command, env = lab_command(folder, ["--no-browser", f"--port={self.port}", "--ip=127.0.0.1",
                                            f"--IdentityProvider.token={self.token}",
                                            "--LabApp.expose_app_in_browser=True", "--allow-root"])
        env.update({k: v for k, v in kernel_env().items() if k not in ("JUPYTER_CONFIG_PATH",)})
        env["JUPYTER_CONFIG_DIR"] = tempfile.mkdtemp(prefix="workbook-jupyter-config-")
        self.process = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        wait_for_http(f"http://127.0.0.1:{self.port}/api/status?token={self.token}", timeout=90)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}/lab/tree/{path}?token={self.token}"

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.log.close()


class Chromium:
    """Headless Chromium with one page, controlled through the DevTools protocol."""

    def __init__(self, width: int = 1400, height: int = 1800) -> None:
        if CHROMIUM is None:
            raise RuntimeError("Chromium is not installed (Debian: apt-get install chromium)")
        self.port = free_port()
        self.profile = tempfile.TemporaryDirectory(prefix="workbook-chromium-")
        self.process = subprocess.Popen(
            [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--no-first-run", "--disable-sync", "--disable-quic",
             "--disable-dev-shm-usage", f"--window-size={width},{height}",
             f"--user-data-dir={self.profile.name}", f"--remote-debugging-port={self.port}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for_http(f"http://127.0.0.1:{self.port}/json/version", timeout=30)
        pages = json.loads(wait_for_http(f"http://127.0.0.1:{self.port}/json/list"))
        page = next(p for p in pages if p["type"] == "page")
        self.ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=60,
                                              suppress_origin=True)
        self._id = 0
        self.requests: list[str] = []
        self.send("Network.enable")
        self.send("Page.enable")

    def send(self, method: str, **params) -> dict:
        """Send one DevTools command and return its result (events seen meanwhile are recorded)."""
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv())
            if message.get("method") == "Network.requestWillBeSent":
                self.requests.append(message["params"]["request"]["url"])
            if message.get("id") == self._id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})

    def evaluate(self, expression: str):
        """Evaluate JavaScript (promises awaited) and return its JSON value."""
        result = self.send("Runtime.evaluate", expression=expression, awaitPromise=True, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"JavaScript failed: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 120.0, interval: float = 0.25):
        """Poll a JavaScript expression until it is truthy; return its value."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout:.0f} s waiting for: {expression}")
            time.sleep(interval)

    def navigate(self, url: str) -> None:
        self.send("Page.navigate", url=url)

    def click(self, expression: str) -> None:
        """Click the middle of the element that a JavaScript expression returns, as a mouse does
        (moved there, pressed, released): widgets that listen to mouse events (JupyterLab's
        menus) see a real click."""
        box = self.evaluate(f"(() => {{ const r = ({expression}).getBoundingClientRect(); "
                            "return [r.left + r.width / 2, r.top + r.height / 2]; })()")
        x, y = box
        self.send("Input.dispatchMouseEvent", type="mouseMoved", x=x, y=y)
        self.send("Input.dispatchMouseEvent", type="mousePressed", x=x, y=y, button="left", clickCount=1)
        self.send("Input.dispatchMouseEvent", type="mouseReleased", x=x, y=y, button="left", clickCount=1)

    def open_offline(self, page: Path, ready: str = "true") -> list[str]:
        """Open a local page with the network cut off, wait until it has loaded and
        ``ready`` (JavaScript) holds; return the http(s) requests it tried."""
        self.send("Network.emulateNetworkConditions", offline=True, latency=0, downloadThroughput=-1,
                  uploadThroughput=-1)
        self.navigate(Path(page).as_uri())
        self.wait_for(f"document.readyState === 'complete' && ({ready})", timeout=60)
        return [u for u in self.requests if u.startswith(("http:", "https:"))]

    def screenshot(self, path: Path) -> None:
        import base64

        data = self.send("Page.captureScreenshot", format="png")["data"]
        Path(path).write_bytes(base64.b64decode(data))

    def close(self) -> None:
        try:
            self.ws.close()
        finally:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
            for _ in range(40):  # Chromium's helper processes may still be writing to the profile
                try:
                    self.profile.cleanup()
                    break
                except OSError:
                    time.sleep(0.25)


def copy_for_lab(src: Path, parent: Path) -> Path:
    """A copy of a notebook folder under ``parent``, so that autosave never touches the repo."""
    dest = Path(parent) / src.name
    shutil.copytree(src, dest)
    os.chmod(dest, 0o755)
    return dest
