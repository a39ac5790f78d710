"""The TF32 policy of grading (course_lib.device.full_precision): float32 computed in float32
wherever a check, a reference or a student's answer runs, on a CPU as on a GPU, and the
settings put back afterwards. The CUDA tests skip cleanly without a GPU."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from torch import nn

from autograder.pipeline.reference_oracle import Oracle
from course_lib.device import full_precision
from course_lib.grading import get_spec, grade
from course_lib.grading.judge.compare import describe_difference
from course_lib.grading.judge.runner import plan_item

NEW_API = hasattr(torch.backends.cuda.matmul, "fp32_precision")  # PyTorch >= 2.9
TREE = ("cuda.matmul", "cudnn", "cudnn.conv", "cudnn.rnn", "mkldnn.matmul")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _node(path: str):
    node = torch.backends
    for part in path.split("."):
        node = getattr(node, part)
    return node


def settings() -> tuple:
    """Every TF32 setting, read without the legacy flags (which raise after a mix of APIs)."""
    tree = tuple(_node(p).fp32_precision for p in TREE) if NEW_API else (
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    return torch.get_float32_matmul_precision(), tree


def flags() -> tuple:
    """What full_precision promises inside its block, read through the legacy flags."""
    return torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.get_float32_matmul_precision()


FULL = (False, False, "highest")


@pytest.fixture
def tf32_on():
    """TF32 switched on everywhere (as a notebook or a GPU's defaults may leave it) for the test,
    and the settings before it put back after, by hand."""
    before = settings()
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.set_float32_matmul_precision("high")
    assert flags() == (True, True, "high")
    yield
    torch.set_float32_matmul_precision(before[0])
    if NEW_API:
        for path, value in zip(TREE, before[1]):
            _node(path).fp32_precision = value
    else:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before[1]


def test_full_precision_switches_tf32_off_inside_and_restores_after(tf32_on):
    before = settings()
    with full_precision():
        assert flags() == FULL
    assert settings() == before and flags() == (True, True, "high")
    with pytest.raises(ZeroDivisionError):
        with full_precision():
            assert flags() == FULL
            1 / 0
    assert settings() == before


def test_full_precision_nests(tf32_on):
    with full_precision():
        with full_precision():
            assert flags() == FULL
        assert flags() == FULL
    assert flags() == (True, True, "high")


@pytest.mark.skipif(not NEW_API, reason="needs PyTorch's fp32_precision settings (2.9 and later)")
def test_full_precision_after_a_mix_of_the_two_apis(tf32_on):
    """Code that set cuDNN's convolutions and RNNs apart through the new API makes PyTorch refuse
    to read the legacy flags: the policy still applies, and that exact state comes back."""
    torch.backends.cudnn.conv.fp32_precision = "tf32"
    torch.backends.cudnn.rnn.fp32_precision = "ieee"
    with pytest.raises(RuntimeError):
        torch.backends.cudnn.allow_tf32
    before = settings()
    with full_precision():
        assert flags() == FULL
    assert settings() == before


def _attention(q, k, v, mask=None):
    """A correct scaled_dot_product_attention, written apart from course_lib's."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return weights @ v, weights


def test_a_students_answers_and_the_references_are_computed_in_full_precision(tf32_on):
    """grade (a notebook's check) runs the student's code in full precision; plan_item (the
    grader's plan, where the reference answers) runs the reference in it; both restore."""
    seen: list[tuple] = []

    def student(q, k, v, mask=None):
        seen.append(flags())
        return _attention(q, k, v, mask)

    spec = get_spec("scaled_dot_product_attention")
    result = grade(spec, student, hidden=True, device="cpu")
    assert result.earned == spec.points and not result.reference_used
    assert seen and set(seen) == {FULL}
    assert flags() == (True, True, "high")

    seen.clear()

    def reference(q, k, v, mask=None):
        seen.append(flags())
        return spec.reference(q, k, v, mask)

    plan = plan_item(dataclasses.replace(spec, reference=reference), device="cpu")
    assert plan.calls and seen and set(seen) == {FULL}
    assert flags() == (True, True, "high")


def _flags_reference():
    return flags()


def test_the_oracle_runs_references_in_full_precision(tf32_on):
    """The oracle's child process (forked from a grader whose settings allow TF32) runs each
    reference with TF32 off."""
    oracle = Oracle({"tests:flags": (_flags_reference, "some_item")}, timeout=60)
    try:
        reply = oracle.ask({"name": "tests:flags", "args": (), "kwargs": {}}, set())
    finally:
        oracle.close()
    assert reply["ok"], reply
    assert tuple(reply["value"]) == FULL
    assert flags() == (True, True, "high")


# ---------------------------------------------------------------------------
# On a GPU: cuBLAS and cuDNN in float32 against float64, at the checks' tolerance
# ---------------------------------------------------------------------------

def _float32_and_float64(build, *shapes):
    """``build(dtype)`` -> a function of the inputs; its float32 result on CUDA and its float64
    one on the same inputs (on CUDA too)."""
    g = torch.Generator().manual_seed(0)
    inputs = [torch.randn(*s, generator=g, dtype=torch.float64) for s in shapes]
    got = build(torch.float32)(*(x.to("cuda", torch.float32) for x in inputs))
    expected = build(torch.float64)(*(x.to("cuda") for x in inputs))
    return got, expected.to(torch.float32)


def _rnn(dtype):
    torch.manual_seed(0)
    layer = nn.RNN(32, 64, batch_first=True).to("cuda", dtype)
    return lambda x: layer(x)[0]


def _conv(dtype):
    torch.manual_seed(0)
    layer = nn.Conv2d(16, 32, 3, padding=1).to("cuda", dtype)
    return layer


def _matmul(dtype):
    return lambda a, b: a @ b / math.sqrt(a.size(-1))


CUDA_WORK = {
    "cuDNN RNN": (_rnn, (8, 50, 32)),
    "cuDNN convolution": (_conv, (4, 16, 32, 32)),
    "cuBLAS matmul": (_matmul, (256, 2048), (2048, 256)),
}


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize("work", sorted(CUDA_WORK))
def test_float32_through_cuda_matches_float64_within_the_checks_tolerance(work, tf32_on):
    """Under the policy, float32 through cuDNN and cuBLAS is as close to float64 as the checks
    demand (describe_difference, float32's tolerance), although the settings around allow TF32."""
    build, *shapes = CUDA_WORK[work]
    with torch.no_grad(), full_precision():
        got, expected = _float32_and_float64(build, *shapes)
    assert got.dtype == torch.float32 and got.device.type == "cuda"
    assert describe_difference(expected.cpu(), got.cpu()) is None, describe_difference(expected.cpu(), got.cpu())


@pytest.mark.cuda
@needs_cuda
@pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability() < (8, 0),
                    reason="TF32 needs an Ampere GPU or later")
def test_the_cuda_comparison_sees_tf32(tf32_on):
    """Without the policy, TF32's error is beyond the checks' tolerance: the test above can fail."""
    with torch.no_grad():
        got, expected = _float32_and_float64(_matmul, (256, 2048), (2048, 256))
    assert describe_difference(expected.cpu(), got.cpu()) is not None
