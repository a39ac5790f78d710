"""The tests' notebook runner (course_lib/notebook_client.py) never waits out a cell's timeout.

nbclient waits for a cell's reply with one poll of the shell socket, as long as the cell's
timeout, and sends on that socket while it waits when a cell displays into an ipywidgets
Output widget (course_lib's explorers do); a reply that arrived just before such a send
woke nothing, and the cell ended only at its timeout (600 s in the tests), the kernel idle.
Here a notebook of such cells, with cells that flood their output as fast as they can
(prints, progress lines, display updates: past the IOPub high-water mark), runs with the
runner; every wait for a reply must end by the reply, never by the wait's own timeout."""

from __future__ import annotations

import time

import nbformat
import pytest
from nbclient.exceptions import CellTimeoutError

from course_lib.notebook_client import NotebookClient
from nbtools import kernel_env

pytestmark = pytest.mark.slow

TIMEOUT = 120  # a cell's timeout: what a stalled wait lasts (the cells themselves take milliseconds)
OUTPUT = ("import io\nimport ipywidgets as widgets\nimport numpy as np\nimport PIL.Image\n"
          "from IPython.display import Image, clear_output, display\n"
          "buffer = io.BytesIO()\n"
          "PIL.Image.fromarray((np.random.rand(32, 32, 3) * 255).astype('uint8')).save(buffer, format='png')\n"
          "PNG = buffer.getvalue()\nout = widgets.Output()\ndisplay(out)\n")
SHOW = "with out:\n    clear_output(wait=True)\n    display(Image(data=PNG, format='png'))\n    print('shown')\n"
FLOODS = (
    "for i in range(100_000):\n    print(i)\n",
    "import sys\nfor i in range(50_000):\n    sys.stderr.write(f'\\rstep {i}')\n",
    "h = display('0', display_id=True)\nfor i in range(3_000):\n    h.update(str(i))\n",
)


class _Watched(NotebookClient):
    """The runner, with every wait for a message on the shell channel recorded:
    ``(the wait's timeout, seconds it lasted, whether a message came)``."""

    waits: list

    def create_kernel_manager(self):
        km = super().create_kernel_manager()
        client, waits = km.client, []
        self.waits = waits

        def watched_client(**kwargs):
            kc = client(**kwargs)
            channel = kc.shell_channel
            get_msg = channel.get_msg

            async def timed(timeout=None):
                start = time.monotonic()
                try:
                    msg = await get_msg(timeout=timeout)
                except Exception:
                    waits.append((timeout, time.monotonic() - start, False))
                    raise
                waits.append((timeout, time.monotonic() - start, True))
                return msg

            channel.get_msg = timed
            return kc

        km.client = watched_client
        return km


def test_no_wait_for_a_reply_outlasts_the_reply_with_output_widgets_and_floods(tmp_path, monkeypatch):
    cells = [OUTPUT]
    for round_ in range(40):
        cells += [SHOW, "x = 1\n", SHOW.replace("'shown'", "x"), FLOODS[round_ % len(FLOODS)] if round_ % 8 == 0 else "x\n"]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    for key in ("PYTHONPATH", "MPLBACKEND", "PATH"):
        monkeypatch.setenv(key, kernel_env()[key])
    client = _Watched(nb, timeout=TIMEOUT, kernel_name="python3", allow_errors=False,
                      resources={"metadata": {"path": str(tmp_path)}})
    try:
        client.execute()
    except CellTimeoutError as exc:  # (the stall without the fix ends this way when a reply is really lost)
        pytest.fail(f"a cell timed out: {exc}")
    replies = [w for w in client.waits if w[2]]
    assert len(replies) >= len(cells)  # (every cell's reply came through the watched waits)
    # a reply that woke nothing is found when the wait's own timer ends it (the cells' waits: the
    # start-up's five-second waits for the kernel's first reply are left out)
    late = [w for w in replies if w[0] is not None and w[0] > 10 and w[1] >= w[0]]
    assert not late, f"{len(late)} cells waited out their {TIMEOUT} s timeout for a reply already there"
    shown = [o for c in nb.cells[1:] for o in c.get("outputs", []) if o.get("output_type") == "stream"]
    assert shown  # (the floods' output reached the notebook)
    captured = [o for state in client.widget_state.values() for o in state.get("outputs", [])]
    assert any("image/png" in o.get("data", {}) for o in captured)  # (the Output widget's own, as a front end has it)
