"""The check framework: every spec accepts the course's solutions, catches each of its
catalogued mistakes with the right hint, refuses the reference, reports stubs once,
never writes to stderr, and speaks nbgrader's partial-credit language."""

from __future__ import annotations

import copy
import json
import os
import sys
import warnings

import pytest
import torch
from nbformat.v4 import new_code_cell, new_output
from nbgrader.utils import determine_grade

from course_lib import bert, bpe, multihead, positional
from course_lib.grading.items.bert import HAND_MERGES
from course_lib.grading import all_specs, check, get_spec, grade, working_or_reference
from course_lib.grading.judge.compare import describe_difference
from course_lib.grading.judge.results import format_report
from conftest import ROOT
from nbtools import exec_solution_cells

SPECS = all_specs()


def _solution_assignments() -> list[str]:
    return sorted(p.name for p in (ROOT / "solutions").iterdir() if p.is_dir())


def _solution_items():
    for assignment in _solution_assignments():
        nb = json.loads((ROOT / "solutions" / assignment / f"{assignment}.ipynb").read_text())
        for c in nb["cells"]:
            meta = c.get("metadata", {}).get("nbgrader", {})
            if meta.get("solution") and c["cell_type"] == "code":
                yield assignment, meta["grade_id"]


SOLUTION_ITEMS = list(_solution_items())


@pytest.fixture(scope="module")
def namespaces():
    return {a: exec_solution_cells(a) for a in _solution_assignments()}


@pytest.mark.parametrize("assignment,item", SOLUTION_ITEMS)
def test_solution_earns_full_points(namespaces, assignment, item):
    spec = get_spec(item)
    result = grade(spec, namespaces[assignment][item], hidden=True)
    failures = [f"{r.title}: {r.message}" for r in result.results if not r.passed]
    assert not result.reference_used, result.reference_used
    assert result.earned == spec.points, failures


MISTAKES = [(name, m) for name, spec in SPECS.items() for m in spec.mistakes]


@pytest.mark.parametrize("item,mistake", MISTAKES, ids=[f"{n}-{m.name}" for n, m in MISTAKES])
def test_mistake_loses_points_and_is_named(item, mistake):
    spec = get_spec(item)
    result = grade(spec, mistake.impl, hidden=True)
    assert not result.reference_used, f"mistake variant trips the reference watch: {result.reference_used}"
    assert result.earned < spec.points, f"{mistake.name} earned full points"
    messages = "\n".join(r.message for r in result.results)
    assert mistake.hint in messages, f"hint for '{mistake.name}' not shown; messages were:\n{messages}"
    named = {r.mistake for r in result.results}
    if f"Likely cause: {mistake.hint}" in messages:  # (some checks say it in their own words)
        assert any(m.name in named for m in spec.mistakes if m.hint == mistake.hint), \
            f"'{mistake.name}' is given as the likely cause but not carried as it: {sorted(named)}"


def _wrap(reference):
    if isinstance(reference, type):
        class Wrapper(torch.nn.Module):
            def __init__(self, *args, **kwargs):
                super().__init__()
                self.inner = reference(*args, **kwargs)

            def forward(self, *args, **kwargs):
                return self.inner(*args, **kwargs)

        return Wrapper

    def wrapper(*args, **kwargs):
        return reference(*args, **kwargs)

    return wrapper


@pytest.mark.parametrize("item", sorted(SPECS))
def test_reference_and_wrappers_of_it_earn_nothing(item):
    spec = get_spec(item)
    for impl in (spec.reference, _wrap(spec.reference)):
        result = grade(spec, impl, hidden=True)
        assert result.earned == 0 and result.score == 0
        assert "reference" in result.reference_used


def test_stub_is_reported_once_and_scores_zero(capsys):
    def scaled_dot_product_attention(q, k, v, mask=None):
        raise NotImplementedError()

    score = check("scaled_dot_product_attention", scaled_dot_product_attention, hidden=True)
    out = capsys.readouterr().out
    assert score == 0.0
    assert out.count("still contains the stub") == 1
    assert "(not run)" in out


def test_student_exception_names_the_line(capsys):
    def causal_mask(T, device=None):
        m = torch.ones(T, T).trill()  # typo
        return m

    check("causal_mask", causal_mask)
    out = capsys.readouterr().out
    assert "AttributeError" in out and "torch.ones(T, T).trill()" in out


def test_checks_never_write_to_stderr(capfd):
    def causal_mask(T, device=None):
        warnings.warn("a harmless warning from student code", UserWarning)
        print("noise", file=sys.stderr)
        os.write(2, b"C-level noise\n")
        return torch.ones(T, T, dtype=torch.bool, device=device).tril()

    score = check("causal_mask", causal_mask, hidden=True)
    out, err = capfd.readouterr()
    assert err == ""
    assert score == 2.0
    assert "a harmless warning from student code" in out  # reported as a note instead


def test_visible_score_is_scaled_to_the_item_points():
    spec = get_spec("scaled_dot_product_attention")

    def no_mask_support(q, k, v, mask=None):  # right without a mask, wrong with one
        w = torch.softmax(q @ k.transpose(-2, -1) / q.size(-1) ** 0.5, dim=-1)
        return w @ v, w

    visible = grade(spec, no_mask_support, hidden=False)
    assert [r.passed for r in visible.results] == [True, False]
    assert visible.score == pytest.approx(spec.points / 2)
    graded = grade(spec, no_mask_support, hidden=True)
    assert graded.score == graded.earned < spec.points


def test_score_is_read_by_nbgrader_as_partial_credit():
    def causal_mask(T, device=None):
        return torch.ones(T, T, dtype=torch.bool, device=device).tril(-1)

    def padding_mask(lengths, T):  # inverted for a batch of one: right on the visible cases only
        mask = (torch.arange(T)[None, :] < lengths[:, None])[:, None, :]
        return ~mask if len(lengths) == 1 else mask

    for item, impl, expected in (("causal_mask", causal_mask, 0.0), ("padding_mask", padding_mask, 1.0)):
        score = grade(get_spec(item), impl, hidden=True).score
        assert score == expected
        cell = new_code_cell("check(...)", metadata={"nbgrader": {"grade": True, "solution": False,
                                                                   "points": get_spec(item).points,
                                                                   "grade_id": f"test_{item}"}})
        cell.outputs = [new_output("stream", name="stdout", text="report\n"),
                        new_output("execute_result", data={"text/plain": repr(check(item, impl, hidden=True))},
                                   execution_count=1)]
        assert determine_grade(cell) == (expected, get_spec(item).points)


def test_unknown_item_lists_known_names():
    with pytest.raises(KeyError, match="causal_mask"):
        get_spec("causal_mask_v2")


def test_working_or_reference(capsys):
    from course_lib.attention import causal_mask as reference

    def good(T, device=None):
        return torch.ones(T, T, dtype=torch.bool, device=device).tril()

    def bad(T, device=None):
        return torch.ones(T, T, dtype=torch.bool, device=device).triu()

    assert working_or_reference("causal_mask", good) is good
    assert capsys.readouterr().out == ""
    assert working_or_reference("causal_mask", bad) is reference
    assert "uses course_lib's reference" in capsys.readouterr().out


@pytest.mark.parametrize("expected,got,fragment", [
    (torch.zeros(2, 3), torch.zeros(3, 2), "has shape (3, 2), expected (2, 3)"),
    (torch.zeros(2, dtype=torch.float64), torch.zeros(2), "dtype float32, expected float64"),
    (torch.zeros(2, dtype=torch.bool), torch.zeros(2), "Masks are boolean"),
    (torch.zeros(2, 2), torch.tensor([[0.0, 0.0], [0.5, float("nan")]]), "first at index (1, 0): expected 0, got 0.5"),
    ((torch.zeros(1), torch.zeros(1)), torch.zeros(1), "should be a tuple of 2"),
    ((torch.zeros(1), torch.zeros(1)), None, "did you forget `return`"),
    (3, torch.tensor(3), "should be a Python int"),
])
def test_difference_messages(expected, got, fragment):
    assert fragment in describe_difference(expected, got)


def test_matching_outputs_have_no_message():
    x = torch.randn(3, 4)
    assert describe_difference((x, 1), (x.clone() + 1e-7, 1)) is None


def test_specs_run_in_a_separate_process_without_a_kernel(tmp_path):
    """A grader process can import a student's code from a file and run the same spec."""
    import subprocess

    (tmp_path / "student.py").write_text(
        "import torch\n"
        "def causal_mask(T, device=None):\n"
        "    return torch.ones(T, T, dtype=torch.bool, device=device).triu()\n"
    )
    program = (
        "import json, student\n"
        "from course_lib.grading import get_spec, grade\n"
        "r = grade(get_spec('causal_mask'), student.causal_mask, hidden=True)\n"
        "print(json.dumps({'earned': r.earned, 'messages': [x.message for x in r.results]}))\n"
    )
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    proc = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    report = json.loads(proc.stdout)
    assert report["earned"] == 0.0
    assert "use torch.tril" in report["messages"][0]


# ---------------------------------------------------------------------------
# Points decided outside the student's process: plan, answers, judgement
# ---------------------------------------------------------------------------

def _answers(spec, impl, plan, poisoned=()):
    """What the student's side would answer (here, with ``poisoned`` references raising)."""
    from course_lib.grading.answer.calls import Call
    from course_lib.grading.answer.perform import perform
    from course_lib.grading.answer.wire import decode, to_plain

    saved = []
    for ref in poisoned:
        if isinstance(ref, type):
            saved.append((ref, "__init__", ref.__dict__.get("__init__")))
            ref.__init__ = _unavailable
        elif not ref.__code__.co_freevars:
            saved.append((ref, "__code__", ref.__code__))
            ref.__code__ = _unavailable.__code__
    try:
        return [[to_plain(perform(spec, impl, Call.from_data(decode(c, kind="call")))) for c in seg]
                for seg in plan.segments]
    finally:
        for obj, attr, value in saved:
            delattr(obj, attr) if value is None else setattr(obj, attr, value)


def _unavailable(*args, **kwargs):
    raise RuntimeError("a reference of this notebook was used on the student's side")


ITEM_ASSIGNMENT = {item: assignment for assignment, item in SOLUTION_ITEMS}


@pytest.mark.slow
@pytest.mark.parametrize("item", sorted(SPECS))
def test_judged_answers_give_the_local_grade(namespaces, item):
    """For the solution and every catalogued mistake, grading from answers produced on
    the student's side (with every reference of the notebook unavailable there, as in
    the sandbox) gives exactly the in-process grade, with salted inputs; a spec's calls
    never depend on the answers."""
    from course_lib.grading.judge.runner import judge_item, plan_item

    spec = get_spec(item)
    salt = 424_242
    notebook_refs = [get_spec(i).reference for a, i in SOLUTION_ITEMS if a == ITEM_ASSIGNMENT[item]]
    plan = plan_item(spec, hidden=True, salt=salt)
    impls = [namespaces[ITEM_ASSIGNMENT[item]][item]] + [m.impl for m in spec.mistakes]
    for k, impl in enumerate(impls):
        local = grade(spec, impl, hidden=True, salt=salt)
        judged = judge_item(spec, plan, _answers(spec, impl, plan, poisoned=notebook_refs if k else ()), salt=salt)
        assert [(r.earned, r.message, r.mistake) for r in judged.results] == \
            [(r.earned, r.message, r.mistake) for r in local.results]
        if k == 0:
            assert local.earned == spec.points, [r.message for r in local.results if not r.passed]
        else:
            assert local.earned < spec.points and spec.mistakes[k - 1].hint in "\n".join(r.message for r in local.results)


def test_every_item_travels_as_data():
    """Each spec's invoke is data, so the student's side needs no spec code."""
    from course_lib.grading.answer.calls import Invoke, Subject

    for name, spec in SPECS.items():
        assert isinstance(spec.invoke, Invoke), name
        data = Subject.of(spec).as_data()
        back = Subject.from_data(data)
        assert back.invoke == spec.invoke and back.reference is spec.reference, name


def test_grading_inputs_change_with_the_salt_but_not_the_visible_ones():
    from course_lib.grading.judge.runner import plan_item

    spec = get_spec("scaled_dot_product_attention")
    a, b, again = (plan_item(spec, salt=s) for s in (1, 2, 1))
    assert a.segments == again.segments  # grading twice gives the same inputs
    assert a.segments[0][0] == b.segments[0][0]  # the hand example is the hand example
    assert a.segments[0] != b.segments[0]  # and its check also runs an input drawn for this grading
    assert a.segments[2] != b.segments[2]  # hidden random inputs depend on the salt
    notebook = plan_item(spec, salt=0)
    assert notebook.segments[1] != a.segments[1]  # and differ from what the notebook shows


def test_a_function_that_reads_notebook_globals_fails_a_visible_check():
    """The visible checks of the small-input items include fresh inputs: code that uses
    the notebook's globals instead of its arguments passes the fixed example, not these."""
    seq_lengths, n = torch.tensor([2, 4]), 4  # what the notebook's own example cells hold

    def padding_mask(lengths, T):
        return (torch.arange(n)[None, :] < seq_lengths[:, None])[:, None, :]

    def causal_mask(T, device=None):
        return torch.ones(n, n, dtype=torch.bool, device=device).tril()

    for item, impl in (("padding_mask", padding_mask), ("causal_mask", causal_mask)):
        visible = grade(get_spec(item), impl, hidden=False)
        assert visible.results[0].earned == 0, item
        assert "has shape" in visible.results[0].message and "expected" in visible.results[0].message


@pytest.mark.parametrize("item, example, hand_case", [
    ("pe_shift_matrix", lambda: positional.pe_shift_matrix(1, 4), "k = 1, d_model = 4"),
    ("relative_position_index", lambda: positional.relative_position_index(5, 5, 2), "T_q = 5, T_k = 5,"),
    ("mha_parameter_count", lambda: multihead.mha_parameter_count(512, 8), "d_model = 512"),
    ("make_nsp_input", lambda: bert.make_nsp_input([10, 11], [12, 13, 14], 2, 3), "tokens_a = [10, 11]"),
    ("bpe_encode", lambda: bpe.bpe_encode("unrelated", HAND_MERGES), "word = 'unrelated'"),
])
def test_an_answer_fixed_to_the_notebook_example_fails_the_visible_check(item, example, hand_case):
    """Every small-input item's visible check has a case the notebook never shows: the
    hand example alone (what a function reading notebook globals computes) is not enough."""
    answer = example()  # the notebook example's answer, returned whatever the function is asked
    first = grade(get_spec(item), lambda *args, **kwargs: copy.deepcopy(answer), hidden=False).results[0]
    assert first.earned == 0, f"{item}: {first.message}"
    # the hand example is answered right; the report names the fresh case that is not
    assert first.message.startswith("On ") and hand_case not in first.message, first.message


def _public_calls(spec) -> list:
    """The calls of an item's visible checks as a notebook makes them (salt 0): public, as
    the checks' code is in the student edition."""
    from course_lib.grading.answer.calls import Call
    from course_lib.grading.judge.runner import plan_item
    from course_lib.grading.answer.wire import decode
    plan = plan_item(spec, hidden=False, device="cpu", salt=0)
    return [[Call.from_data(decode(data, kind="call")) for data in segment] for segment in plan.segments]


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
                and a.shape == b.shape and torch.equal(a.cpu(), b.cpu()))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def _memorised(spec, calls, constant: bool = False):
    """A function that knows the reference's answers to ``calls`` by heart and gives the
    first of them to anything else (a plausible answer of the right kind, and wrong); with
    ``constant``, the first answer to everything. None when no call has an answer a table
    could hold."""
    from course_lib.grading.answer.perform import perform
    table = []
    for call in calls:
        answer = perform(spec, spec.reference, call, watch=False)
        if call.probe.name == "invoke" and answer["ok"]:
            table.append((call.inputs, answer["value"]))
    if not table:
        return None

    def memorised(**inputs):
        for known, value in ([] if constant else table):
            if _same(known, inputs):
                return copy.deepcopy(value)
        return copy.deepcopy(table[0][1])

    return memorised


FUNCTION_ITEMS = sorted(name for name, spec in SPECS.items() if not spec.invoke.module)
HAND_EXAMPLES = sorted((name, i) for name, spec in SPECS.items() for i, sub in enumerate(spec.subchecks)
                       if "hand example" in sub.title and not sub.hidden)


def test_every_visible_point_asks_for_an_answer_the_student_has_not_seen():
    """A visible sub-check worth points that asks for the student's answers (not only the
    parameters a module declares) runs at least one input drawn from the grading's salt:
    its fixed inputs (a hand example, the notebook's sizes) are public, and their answers
    could be typed in."""
    from course_lib.grading.judge.runner import plan_item
    fixed = []
    for name, spec in SPECS.items():
        plans = [plan_item(spec, hidden=False, device="cpu", salt=salt) for salt in (11, 2**40 + 7, 987_654_321)]
        for index, sub in enumerate(spec.visible()):
            probes = _probe_names(plans[0].segments[index])
            if sub.points > 0 and probes != {"layout"} and all(p.segments[index] == plans[0].segments[index]
                                                               for p in plans):
                fixed.append(f"{name}: {sub.title}")
    assert not fixed, fixed


def _probe_names(segment) -> set[str]:
    from course_lib.grading.answer.calls import Call
    from course_lib.grading.answer.wire import decode
    return {Call.from_data(decode(data, kind="call")).probe.name for data in segment}


@pytest.mark.parametrize("item, index", HAND_EXAMPLES)
def test_the_hand_example_alone_earns_nothing_in_the_notebook(item, index):
    """A function that returns the reference's answer on exactly the hand example (and
    garbage otherwise) fails the hand example's check, as check() runs it in a notebook."""
    spec = get_spec(item)
    hand = _public_calls(spec)[index][:1]  # (the check's first call: the hand example itself)
    result = grade(spec, _memorised(spec, hand), hidden=False)
    assert result.results[index].earned == 0, result.results[index]
    assert "hand example" not in result.results[index].message.split("\n")[0]  # it failed on the other input


@pytest.mark.parametrize("item", FUNCTION_ITEMS)
def test_answers_known_by_heart_earn_no_more_than_knowing_nothing_when_graded(item):
    """A function that knows the reference's answer to every call the visible checks make in
    a notebook (all public: a hand example, its random twin, the notebook's sizes) and gives
    one of those answers to anything else earns, when graded as workbook autograde and
    Gradescope judge it (inputs from the submission's secret salt), no visible point more
    than a function that gives that one answer to everything (which may still pass a check
    of the answer's type)."""
    spec = get_spec(item)
    calls = [call for segment in _public_calls(spec) for call in segment]
    memorised = _memorised(spec, calls)
    if memorised is None:
        pytest.skip(f"{item}'s visible checks ask for no answer a table could hold (an object's "
                    "behaviour, a random draw's statistics)")
    constant = _memorised(spec, calls[:1], constant=True)

    def gains(salt: int) -> list:
        known, nothing = (grade(spec, f, hidden=False, salt=salt).results for f in (memorised, constant))
        return [(k.title, k.earned) for k, n in zip(known, nothing) if k.earned > n.earned]

    if not gains(0):  # (in a notebook, the answers by heart pass the checks that compare answers)
        pytest.skip(f"{item}: answers by heart earn no more than one constant answer even on the notebook's "
                    "own inputs (its inputs are all drawn from the salt: see the test above)")
    assert not gains(918_273_645)


def test_pass_or_fail_only_skips_the_mistake_search():
    """working_or_reference and the sandbox's verdict only need pass or fail: the same
    results, without the catalogue search (seconds for a wrong module)."""
    from course_lib.grading.items.self_attention import CAUSAL_MISTAKES

    spec = get_spec("causal_mask")
    wrong = CAUSAL_MISTAKES[0].impl
    named = grade(spec, wrong, hidden=False)
    plain = grade(spec, wrong, hidden=False, name_mistakes=False)
    assert [r.earned for r in named.results] == [r.earned for r in plain.results] == [0]
    assert "Likely cause" in named.results[0].message and "Likely cause" not in plain.results[0].message
    assert named.results[0].message.split("\n")[0] == plain.results[0].message.split("\n")[0]


def test_a_seed_outside_a_running_check_is_an_error():
    """An input seeded when a spec is built (at import) would be the same for every grading,
    salt or not: seed() is an error outside a running check, and per-grading inside one."""
    from course_lib.grading.judge.properties import seed
    from course_lib.grading.judge.runner import salted

    with pytest.raises(RuntimeError, match="outside a running check"):
        seed(901)
    with salted(0):
        assert seed(901) == 901  # a notebook's own inputs
    with salted(7):
        first = seed(901)
    with salted(31337):
        assert seed(901) != first


# ---------------------------------------------------------------------------
# One mistake costs points once, in the item where it is
# ---------------------------------------------------------------------------

CHARGED_ONCE = r'''
import torch
from torch import nn

def scaled_dot_product_attention(q, k, v, mask=None):
    scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-2)  # the mistake: over the queries
    return weights @ v, weights

class SelfAttention(nn.Module):
    def __init__(self, d_model, d_k, d_v):
        super().__init__()
        self.w_q = nn.Linear(d_model, d_k, bias=False)
        self.w_k = nn.Linear(d_model, d_k, bias=False)
        self.w_v = nn.Linear(d_model, d_v, bias=False)

    def forward(self, x, mask=None):
        return scaled_dot_product_attention(self.w_q(x), self.w_k(x), self.w_v(x), mask)
'''


def test_an_item_that_builds_on_a_wrong_earlier_item_is_judged_on_its_own():
    """Notebook 03 invites SelfAttention to call the student's own scaled_dot_product_attention:
    with the softmax over the wrong axis there, scaled_dot_product_attention loses its points,
    SelfAttention (right in itself) keeps all of its own: while it is judged, the name means
    course_lib's reference (``Invoke.names``), and the notebook's own function is put back."""
    space: dict = {}
    exec(compile(CHARGED_ONCE, "<notebook>", "exec"), space)
    wrong = grade(get_spec("scaled_dot_product_attention"), space["scaled_dot_product_attention"], hidden=True)
    assert wrong.earned < wrong.total_points
    result = grade(get_spec("SelfAttention"), space["SelfAttention"], hidden=True)
    assert result.earned == result.total_points, format_report(result)
    assert space["scaled_dot_product_attention"].__module__ != "course_lib.attention"  # put back


def test_every_name_an_item_is_judged_without_is_an_earlier_item_of_its_notebook():
    """``Invoke.names`` binds only course_lib's references of items graded before the item in
    its notebook (the sandbox's stand-ins for those answer only once they are graded)."""
    import nbformat

    from course_lib.grading.answer.calls import resolve
    specs = all_specs()
    order = {}
    for path in sorted((ROOT / "solutions").glob("*/*.ipynb")):
        nb = nbformat.read(str(path), as_version=4)
        gids = [c.metadata.get("nbgrader", {}).get("grade_id") for c in nb.cells]
        order.update({g: (path.parent.name, i) for i, g in enumerate(gids) if g in specs})
    for name, spec in specs.items():
        for bound, target in getattr(spec.invoke, "names", ()):
            if target.startswith("course_lib.grading."):
                continue  # a fixture of the grader's own (cached_generate's cache, apply_rope's angles)
            earlier = [n for n, s in specs.items() if f"{s.reference.__module__}:{s.reference.__qualname__}" == target]
            assert earlier and resolve(target) is specs[earlier[0]].reference, (name, bound, target)
            assert order[earlier[0]][0] == order[name][0] and order[earlier[0]][1] < order[name][1], (name, earlier)


# ---------------------------------------------------------------------------
# Every rule a check enforces is stated in the notebook
# ---------------------------------------------------------------------------

# a family of sub-check titles -> what the notebook must say (the item's own text: its section
# and its solution cell; for the conventions every function follows, the notebook's conventions
# paragraph before its first graded item may say it instead)
RULES = [
    ("inputs left unchanged", r"(x|mask|alphas|inputs?) (is |are )?left unchanged|left as (they|it) w|no parameter change",
     r"unchanged|not changed|in place|in-place|left as (it|they) (is|are)|does not (modify|change) (its|the)", True),
    ("a ValueError", r"ValueError", r"ValueError", False),
    ("float64", r"float64", r"float64", True),
    ("the device argument", r"device argument", r"\bdevice\b", True),
    ("the generator's reproducibility", r"generator makes", r"generator", False),
    ("eval mode", r"eval mode|train mode", r"\beval\b|eval\(\)|evaluation mode", False),
    ("gradients", r"gradients reach", r"gradient|differentiab|backprop", True),
]


def _item_texts() -> dict[str, tuple[str, str]]:
    """item -> (its own text: the markdown since the previous test cell and its solution cell,
    the notebook's conventions: the markdown before its first graded item), in notebooks/."""
    import nbformat

    out = {}
    for path in sorted((ROOT / "notebooks").glob("*/*.ipynb")):
        nb = nbformat.read(str(path), as_version=4)
        own, conventions, seen_item = [], [], False
        for c in nb.cells:
            meta = c.get("metadata", {}).get("nbgrader", {})
            gid = meta.get("grade_id", "")
            if meta.get("solution") and gid in SPECS:
                own.append(c.source)
                out[gid] = ("\n".join(own), "\n".join(conventions))
                seen_item = True
            elif meta.get("grade") and not meta.get("solution") and gid.startswith("test_"):
                own = []
            elif c.cell_type == "markdown":
                own.append(c.source)
                if not seen_item:
                    conventions.append(c.source)
    return out


def test_every_rule_a_check_enforces_is_stated_where_the_student_reads():
    """A check may only ask what the contract and the notebook state: an input left unchanged, a
    ValueError, float64, the device, a generator's reproducibility, eval mode, gradients. Each
    sub-check title that enforces one of these has its rule in the item's text (or, for the
    conventions every function follows, the notebook's conventions paragraph)."""
    import re

    texts = _item_texts()
    unstated = []
    for name, spec in SPECS.items():
        own, conventions = texts[name]
        for sub in spec.subchecks:
            for rule, title, said, general in RULES:
                if re.search(title, sub.title) and not re.search(said, own, re.I) and not (
                        general and re.search(said, conventions, re.I)):
                    unstated.append(f"{name}: {rule} ({sub.title!r})")
    assert not unstated, "\n".join(sorted(set(unstated)))


def test_an_error_a_catalogued_mistake_raises_too_is_named():
    """`k.T` on a batched k raises a RuntimeError (shapes that cannot be multiplied): the report
    names the cause, because the catalogued mistake raises the same error on the same input."""
    import math

    def attention(q, k, v, mask=None):
        s = q @ k.T / math.sqrt(q.size(-1))
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
        w = torch.softmax(s, dim=-1)
        return w @ v, w

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = format_report(grade(get_spec("scaled_dot_product_attention"), attention))
    assert "raised RuntimeError" in report and "Likely cause: `k.T` reverses every axis" in report, report


def test_a_forbidden_call_is_explained_once():
    import torch.nn.functional as F

    def attention(q, k, v, mask=None):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask), None

    report = format_report(grade(get_spec("scaled_dot_product_attention"), attention))
    assert report.count("yourself") == 1, report


def test_a_cause_written_into_an_answer_by_the_student_names_no_mistake():
    """The class report counts the causes the judge named: a sealed run that answers every call
    with a failure whose text quotes a catalogued hint ("Likely cause: ...") shows that text but
    names no mistake (the cause travels on the failure, never read back from a message)."""
    from course_lib.grading.judge.runner import judge_item, plan_item

    spec = get_spec("scaled_dot_product_attention")
    plan = plan_item(spec, hidden=True)
    quoted = {"ok": False, "kind": "check", "text": f"wrong.\nLikely cause: {spec.mistakes[0].hint}"}
    judged = judge_item(spec, plan, [[quoted] * len(segment) for segment in plan.segments])
    assert judged.earned == 0 and any(spec.mistakes[0].hint in r.message for r in judged.results)
    assert [r.mistake for r in judged.results] == [""] * len(judged.results)


def test_a_failure_names_its_cause_as_the_catalogue_does():
    """A check's own hint that is a catalogued mistake's is carried as that mistake (the longest
    hint it quotes); any other hint as its first clause; none as no cause."""
    from course_lib.grading.judge.spec import Mistake
    from course_lib.grading.judge.trial import LocalAnswers, Trial

    spec = get_spec("scaled_dot_product_attention")
    trial = Trial(spec, LocalAnswers(spec, None), torch.device("cpu"))
    first = spec.mistakes[0]
    assert trial.failed("off.", first.hint).cause is first
    other = trial.failed("off.", "Use the last axis: softmax over dim=-1. Then normalise.", sep=" ")
    assert other.cause == Mistake("Use the last axis", None, "Use the last axis: softmax over dim=-1. Then normalise.")
    assert str(other) == "off. Likely cause: Use the last axis: softmax over dim=-1. Then normalise."
    assert trial.failed("off.").cause is None and str(trial.failed("off.", None)) == "off."
