"""What a student does: `make lab` makes their own copy of a released notebook, which
they open in JupyterLab 4 (headless Chromium, a laptop-sized window), run all cells, use
the attention explorer, edit and save. Everything must work offline: the page may only
talk to the local server. Every figure and widget fits the notebook's width."""

from __future__ import annotations

import json
import shutil

import pytest

from browser import CHROMIUM, Chromium, JupyterLab
from conftest import ROOT
from course_lib.workspace import sync

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (.ci/run installs it)")]

NOTEBOOK = "03_self_attention/03_self_attention.ipynb"
WIDTH = 1280  # a laptop screen; JupyterLab's default layout (file browser open) leaves the notebook ~1000 px
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
    # the course's notebook and the student's work/ folder, as `make lab` makes it;
    # screenshots of the run are left in work/, in pytest's tmp folder
    base = tmp_path_factory.mktemp("lab")
    course, work = base / "notebooks", base / "work"
    shutil.copytree(ROOT / "notebooks" / "03_self_attention", course / "03_self_attention")
    assert sync(course, work) == [f"new: {NOTEBOOK}"]
    lab = JupyterLab(work)
    browser = Chromium(width=WIDTH, height=1800)
    try:
        browser.navigate(lab.url(NOTEBOOK))
        browser.wait_for(KERNEL_READY, timeout=120)
        browser.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")
        browser.wait_for(f"{PANEL}.content.widgets.filter(c => c.model.type === 'code')"
                         ".every(c => c.model.executionCount !== null) && "
                         f"{PANEL}.sessionContext.session.kernel.status === 'idle'", timeout=300)
        yield browser, work, course
    finally:
        browser.close()
        lab.close()


def test_released_notebook_runs_all_cells_in_jupyterlab(lab_page):
    browser, folder, _ = lab_page
    summary = browser.evaluate(CELL_SUMMARY)
    assert summary["not_run"] == 0
    assert summary["errors"] == [], summary["errors"]
    assert summary["stub_reports"] == 4  # one per graded item, each test cell reports its stub
    browser.screenshot(folder / "notebook-03.png")


def test_explorer_renders_and_updates_live(lab_page):
    browser, folder, _ = lab_page
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
    browser, _, _ = lab_page
    remote = [u for u in browser.requests
              if not u.startswith(("http://127.0.0.1", "ws://127.0.0.1", "data:", "blob:", "about:"))]
    assert browser.requests, "no requests were recorded"
    assert remote == [], f"the page tried to reach the network: {remote[:5]}"


def test_students_see_no_instructor_tools(lab_page):
    """`make lab` opens JupyterLab without nbgrader's instructor and validation extensions
    (no Formgrader, no course or assignment lists, no Validate button claiming partial
    credit for untouched stubs), and the server does not serve the Formgrader."""
    browser, folder, _ = lab_page
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


def test_no_news_prompt(lab_page):
    """JupyterLab's "Would you like to receive official Jupyter news?" toast (its announcements
    plugin) is off: a student is not asked, and nothing is fetched."""
    browser, _, _ = lab_page
    assert browser.evaluate("window.jupyterapp.hasPlugin('@jupyterlab/apputils-extension:notification')")
    assert not browser.evaluate("window.jupyterapp.hasPlugin('@jupyterlab/apputils-extension:announcements')")
    toasts = browser.evaluate("Array.from(document.querySelectorAll('.Toastify__toast')).map(t => t.textContent)")
    assert not [t for t in toasts if "news" in t.lower()], toasts


OVERFLOW = f"""(() => {{
  const panel = {PANEL}.content.node.getBoundingClientRect();
  const cut = el => el.scrollWidth > el.clientWidth + 1;
  const name = el => el.className + ': ' + (el.textContent || el.getAttribute('src') || '').slice(0, 40);
  return {{
    images: [...document.querySelectorAll('.jp-OutputArea-output img')].length,
    widgets: [...document.querySelectorAll('.jupyter-widgets.widget-container, .widget-dropdown')].length,
    wider_than_panel: [...document.querySelectorAll('.jp-OutputArea-output img, .jupyter-widgets')]
      .filter(el => el.getBoundingClientRect().right > panel.right + 1).map(name),
    scrolled_outputs: [...document.querySelectorAll('.jp-OutputArea-output')].filter(cut).map(name),
    labels: [...document.querySelectorAll('.widget-label, .widget-label-basic, .widget-inline-hbox label')]
      .filter(el => el.offsetParent !== null && el.textContent.trim()).map(el => el.textContent),
    cut_labels: [...document.querySelectorAll('.widget-label, .widget-label-basic, .widget-inline-hbox label')]
      .filter(el => el.offsetParent !== null && cut(el)).map(el => el.textContent),
  }};
}})()"""


def test_figures_and_widgets_fit_a_laptop_window(lab_page):
    """At a laptop's width every plot and the explorer sit inside the notebook, no output
    scrolls sideways, and no widget label is cut short (the explorer's token labels are
    checked inside the figure by tests/unit/test_widget.py)."""
    browser, folder, _ = lab_page
    layout = browser.evaluate(OVERFLOW)
    assert layout["images"] >= 5 and layout["widgets"] >= 3, layout  # four plots and the explorer
    assert layout["wider_than_panel"] == [], layout["wider_than_panel"]
    assert layout["scrolled_outputs"] == [], layout["scrolled_outputs"]
    assert len(layout["labels"]) >= 3, layout["labels"]  # the explorer's controls are labelled
    assert layout["cut_labels"] == [], layout["cut_labels"]
    browser.screenshot(folder / "laptop-width.png")


def test_the_student_edits_and_saves_their_own_copy(lab_page):
    """Saving writes the student's copy in work/; the course's notebook is untouched, and
    a later course update is offered beside the student's copy, never over it."""
    browser, work, course = lab_page
    mine, original = work / NOTEBOOK, (course / NOTEBOOK).read_bytes()
    browser.evaluate(f"""(() => {{
  const cell = {PANEL}.content.widgets.find(c => c.model.type === 'code');
  cell.model.sharedModel.setSource(cell.model.sharedModel.getSource() + '\\n# my own note');
  return {PANEL}.context.save();
}})()""")
    browser.wait_for(f"(() => {{ const w = {PANEL}; return w.context.model.dirty === false; }})()", timeout=30)
    saved = json.loads(mine.read_text())
    assert any("# my own note" in "".join(c["source"]) for c in saved["cells"])
    assert (course / NOTEBOOK).read_bytes() == original

    update = json.loads(original)
    update["cells"][0]["source"] = "# A corrected introduction\n"
    (course / NOTEBOOK).write_text(json.dumps(update))
    assert sync(course, work) == [f"course update: 03_self_attention/03_self_attention (course update 1).ipynb "
                                  f"(your {NOTEBOOK} is kept as it is)"]
    assert "# my own note" in mine.read_text()
