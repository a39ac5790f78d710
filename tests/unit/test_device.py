"""Device choice, seeding and the grading-mode switch."""

import random

import numpy as np
import pytest
import torch

from course_lib.device import get_device, grading_mode, seed_everything


def test_device_order(monkeypatch):
    monkeypatch.delenv("WORKBOOK_DEVICE", raising=False)
    expected = "cuda" if torch.cuda.is_available() else (
        "mps" if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available() else "cpu")
    assert get_device().type == expected


def test_device_override(monkeypatch):
    monkeypatch.setenv("WORKBOOK_DEVICE", "cpu")
    assert get_device() == torch.device("cpu")
    assert get_device("cpu") == torch.device("cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_unavailable_device_is_a_clear_error():
    with pytest.raises(RuntimeError, match="CUDA was requested but is not available"):
        get_device("cuda")


def test_seed_everything_is_reproducible():
    def draw():
        g = seed_everything(123)
        return (random.random(), np.random.rand(), torch.rand(2).tolist(), torch.rand(1, generator=g).item())

    assert draw() == draw()
    assert seed_everything(1).initial_seed() == 1


def test_grading_mode(monkeypatch):
    monkeypatch.delenv("WORKBOOK_GRADING", raising=False)
    assert not grading_mode()
    monkeypatch.setenv("WORKBOOK_GRADING", "1")
    assert grading_mode()
    monkeypatch.setenv("WORKBOOK_GRADING", "0")
    assert not grading_mode()


def test_full_or_quick(monkeypatch):
    from course_lib.device import full_or_quick

    monkeypatch.delenv("WORKBOOK_GRADING", raising=False)
    assert full_or_quick([256, 512], [128]) == [256, 512]
    monkeypatch.setenv("WORKBOOK_GRADING", "1")
    assert full_or_quick([256, 512], [128]) == [128]


def test_workbook_threads_pins_every_model(monkeypatch):
    from torch import nn

    from course_lib.device import SMALL_MODEL_PARAMETERS, threads_for, torch_threads

    monkeypatch.delenv("WORKBOOK_THREADS", raising=False)
    big = nn.Embedding(SMALL_MODEL_PARAMETERS // 8, 8)
    assert threads_for(nn.Linear(4, 4)) == 1 and threads_for(big) is None
    monkeypatch.setenv("WORKBOOK_THREADS", "3")
    assert threads_for(nn.Linear(4, 4)) == 3 and threads_for(big) == 3
    with torch_threads("auto", nn.Linear(4, 4)):
        assert torch.get_num_threads() == 3
    for wrong in ("0", "two", "-1"):
        monkeypatch.setenv("WORKBOOK_THREADS", wrong)
        with pytest.raises(ValueError, match="WORKBOOK_THREADS"):
            threads_for(nn.Linear(4, 4))


def test_the_set_up_line_names_the_device_and_where_the_stated_results_come_from():
    from course_lib.device import describe_device

    assert describe_device("cpu") == f"PyTorch {torch.__version__} on cpu"
    assert describe_device(torch.device("cpu")) == describe_device("cpu")
    other = describe_device("meta")  # any device but the CPU says how to get the CPU's results
    assert other.startswith(f"PyTorch {torch.__version__} on meta (meta).")
    assert "measured on a CPU" in other and "WORKBOOK_DEVICE=cpu" in other
    if torch.cuda.is_available():
        assert torch.cuda.get_device_name(0) in describe_device("cuda:0")


# training_device: the device policy per model. torch.cuda.is_available (and the GPU's name) are
# replaced in these tests of the rule's logic only; the training itself is never faked.

def _pretend_cuda(monkeypatch, available: bool = True) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: available)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Pretend GPU")
    monkeypatch.delenv("WORKBOOK_DEVICE", raising=False)


def _model(parameters: int) -> torch.nn.Module:
    return torch.nn.Linear(parameters - 1, 1)  # (parameters - 1) weights and one bias


def test_a_small_model_trains_on_the_cpu_where_cuda_is_available_and_says_so(monkeypatch, capsys):
    from course_lib.device import GPU_MIN_PARAMETERS, training_device
    _pretend_cuda(monkeypatch)
    assert get_device().type == "cuda"
    assert training_device(_model(GPU_MIN_PARAMETERS - 1)) == torch.device("cpu")
    said = capsys.readouterr().out
    assert said.count("\n") == 1 and f"{GPU_MIN_PARAMETERS - 1:,} parameters" in said
    assert "trains on the CPU, faster than on Pretend GPU" in said and "WORKBOOK_DEVICE=cuda" in said
    assert training_device(_model(GPU_MIN_PARAMETERS)).type == "cuda"  # at the threshold: the GPU
    assert capsys.readouterr().out == ""


def test_workbook_device_and_prefer_override_the_rule(monkeypatch, capsys):
    from course_lib.device import training_device
    _pretend_cuda(monkeypatch)
    small = _model(10)
    assert training_device(small, prefer="cuda").type == "cuda"
    monkeypatch.setenv("WORKBOOK_DEVICE", "cuda")
    assert training_device(small).type == "cuda"
    monkeypatch.setenv("WORKBOOK_DEVICE", "cpu")
    assert training_device(_model(5_000_000)) == torch.device("cpu")
    assert capsys.readouterr().out == ""


def test_without_cuda_the_rule_is_get_device(monkeypatch, capsys):
    from course_lib.device import training_device
    _pretend_cuda(monkeypatch, available=False)
    for size in (10, 5_000_000):
        assert training_device(_model(size)) == get_device()
    assert capsys.readouterr().out == ""
