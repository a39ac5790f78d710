"""What a student does: open a released notebook in JupyterLab 4 (headless Chromium),
run all cells, and use the attention explorer. Everything must work offline: the page
may only talk to the local server."""

from __future__ import annotations


import pytest

from browser import CHROMIUM, Chromium, JupyterLab, copy_for_lab
from conftest import ROOT

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (.ci/run installs it)")]

NOTEBOOK = "03_self_attention.ipynb"
# the notebook panel (shell.currentWidget is null in a headless window without focus)
PANEL = "[...window.jupyterapp.shell.widgets('main')].find(w => w.content && w.sessionContext)"

KERNEL_READY = f"""(() => {{
  const w = window.jupyterapp && {PANEL};
  const kernel = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;
  return !!(kernel && kernel.status === 'idle' && w.content && w.content.widgets.length > 0);
}})()"""

CELL_SUMMARY = f"""(() => {{
  const cells = {PANEL}.content.widgets.filter(c => c.model.type === 'code');
  const outputs = cells.map(c => c.model.outputs.toJSON());
  return {{
    code_cells: cells.length,
    not_run: cells.filter(c => c.model.executionCount === null).length,
    errors: outputs.flat().filter(o => o.output_type === 'error').map(o => o.ename + ': ' + o.evalue),
    stub_reports: outputs.flat().filter(o => o.output_type === 'stream' && o.text.includes('still contains the stub')).length,
  }};
}})()"""

EXPLORER_IMAGE = """(() => {
  const imgs = [...document.querySelectorAll('.widget-output img')];
  return imgs.length ? imgs[imgs.length - 1].src.length + ':' + imgs[imgs.length - 1].src.slice(-64) : '';
})()"""


def kernel_print(expression: str) -> str:
    return f"""(async () => {{
  const kernel = {PANEL}.sessionContext.session.kernel;
  const future = kernel.requestExecute({{code: "print({expression})"}});
  let out = '';
  future.onIOPub = msg => {{ if (msg.header.msg_type === 'stream') out += msg.content.text; }};
  await future.done;
  return out.trim();
}})()"""


def select(label: str, value: str) -> str:
    """Set the explorer's dropdown (found by its label) the way a click would."""
    return f"""(() => {{
  const boxes = [...document.querySelectorAll('.widget-dropdown')];
  const box = boxes.filter(b => b.textContent.includes('{label}')).pop();
  const sel = box.querySelector('select');
  sel.value = '{value}';
  sel.dispatchEvent(new Event('change', {{bubbles: true}}));
  return sel.value;
}})()"""


@pytest.fixture(scope="module")
def lab_page(tmp_path_factory):
    # screenshots of the run are left beside the copied notebook, in pytest's tmp folder
    folder = copy_for_lab(ROOT / "notebooks" / "03_self_attention", tmp_path_factory.mktemp("lab"))
    lab = JupyterLab(folder)
    browser = Chromium()
    try:
        browser.navigate(lab.url(NOTEBOOK))
        browser.wait_for(KERNEL_READY, timeout=120)
        browser.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")
        browser.wait_for(f"{PANEL}.content.widgets.filter(c => c.model.type === 'code')"
                         ".every(c => c.model.executionCount !== null) && "
                         f"{PANEL}.sessionContext.session.kernel.status === 'idle'", timeout=300)
        yield browser, folder
    finally:
        browser.close()
        lab.close()


def test_released_notebook_runs_all_cells_in_jupyterlab(lab_page):
    browser, folder = lab_page
    summary = browser.evaluate(CELL_SUMMARY)
    assert summary["not_run"] == 0
    assert summary["errors"] == [], summary["errors"]
    assert summary["stub_reports"] == 4  # one per graded item, each test cell reports its stub
    browser.screenshot(folder / "notebook-03.png")


def test_explorer_renders_and_updates_live(lab_page):
    browser, folder = lab_page
    browser.evaluate(f"{PANEL}.content.widgets.filter(c => c.model.type === 'code').pop().node"
                     ".scrollIntoView()")
    before = browser.wait_for(EXPLORER_IMAGE, timeout=60)
    assert int(before.split(":")[0]) > 5000  # a real PNG, drawn by the kernel, shown by the widget

    assert browser.evaluate(select("mask", "sliding window")) == "sliding window"
    after = browser.wait_for(f"(() => {{ const s = {EXPLORER_IMAGE}; return s && s !== {before!r} ? s : ''; }})()",
                             timeout=30)
    assert after != before
    # the kernel-side state followed the browser: 'it' (index 7) cannot reach 'animal' (index 1)
    state = browser.evaluate(kernel_print("explorer.mode.value, float(explorer.weights[7, 1]), "
                                          "int(explorer.weights[7].argmax())"))
    assert state == "sliding window 0.0 5", state
    browser.screenshot(folder / "explorer.png")


def test_page_only_talks_to_the_local_server(lab_page):
    browser, _ = lab_page
    remote = [u for u in browser.requests
              if not u.startswith(("http://127.0.0.1", "ws://127.0.0.1", "data:", "blob:", "about:"))]
    assert browser.requests, "no requests were recorded"
    assert remote == [], f"the page tried to reach the network: {remote[:5]}"


def test_students_see_no_instructor_tools(lab_page):
    """`make lab` opens JupyterLab without nbgrader's instructor and validation extensions
    (no Formgrader, no course or assignment lists, no Validate button claiming partial
    credit for untouched stubs), and the server does not serve the Formgrader."""
    browser, folder = lab_page
    plugins = browser.evaluate("['@jupyter/nbgrader:formgrader', '@jupyter/nbgrader:create-assignment', "
                               "'@jupyter/nbgrader:validate-assignment', '@jupyter/nbgrader:assignment-list']"
                               ".filter(p => window.jupyterapp.hasPlugin(p))")
    assert plugins == []
    menus = browser.evaluate("document.querySelector('.lm-MenuBar').textContent")
    assert "File" in menus and "Nbgrader" not in menus and "Formgrader" not in menus
    toolbar = browser.evaluate(f"{PANEL}.toolbar.node.textContent")
    assert "Validate" not in toolbar
    status = browser.evaluate("fetch('/formgrader').then(r => r.status)")
    assert status == 404
