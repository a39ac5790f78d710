"""Device choice and reproducible seeding."""

from __future__ import annotations

import contextlib
import os
import random
from typing import Iterator, TypeVar

import numpy as np
import torch
from torch import nn

__all__ = ["get_device", "describe_device", "seed_everything", "grading_mode", "full_or_quick", "torch_threads", "threads_for",
           "SMALL_MODEL_PARAMETERS", "full_precision", "training_device", "GPU_MIN_PARAMETERS"]

T = TypeVar("T")

# Below this many parameters a model runs fastest on one CPU thread (see threads_for).
SMALL_MODEL_PARAMETERS = 1_000_000

# Below this many parameters a model trains on the CPU even where CUDA is available (see
# training_device). PROVISIONAL until measured on a GPU: on an NVIDIA H200 every notebook (models
# of 13 to 175 thousand parameters) ran as slow as or slower than on an idle 2-core CPU
# (docs/gpu.md); where the GPU starts to win has not been measured (benchmarks/gpu_check.sh).
GPU_MIN_PARAMETERS = 1_000_000


def get_device(prefer: str | None = None) -> torch.device:
    """Return the best available device: CUDA, then Apple's MPS, then the CPU.

    ``prefer`` (e.g. ``"cpu"``) overrides the choice; so does the environment
    variable ``WORKBOOK_DEVICE``. Asking for a device that is not available raises
    a ``RuntimeError`` that says which devices are.
    """
    choice = prefer or os.environ.get("WORKBOOK_DEVICE")
    if choice:
        device = torch.device(choice)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("CUDA was requested but is not available; use 'cpu'.")
        if device.type == "mps" and not _mps_available():
            raise RuntimeError("MPS was requested but is not available; use 'cpu'.")
        return device
    if torch.cuda.is_available():
        return torch.device("cuda")
    if _mps_available():
        return torch.device("mps")
    return torch.device("cpu")


def training_device(model: nn.Module, prefer: str | None = None) -> torch.device:
    """The device to train ``model`` on: :func:`get_device`'s, except that a model of fewer than
    :data:`GPU_MIN_PARAMETERS` parameters trains on the CPU where the best device is CUDA.

    Such a model's step is hundreds of tiny kernel launches and host syncs: a GPU waits on them
    and is slower than two CPU cores (docs/gpu.md). When the rule moves a model off the GPU it
    says so once, in the calling cell's output. ``prefer`` or ``WORKBOOK_DEVICE`` (e.g.
    ``WORKBOOK_DEVICE=cuda``) overrides the rule, as it overrides :func:`get_device`. On a
    machine without CUDA this is :func:`get_device` (Apple's MPS is not measured yet: kept).
    """
    if prefer or os.environ.get("WORKBOOK_DEVICE"):
        return get_device(prefer)
    best = get_device()
    size = sum(p.numel() for p in model.parameters())
    if best.type != "cuda" or size >= GPU_MIN_PARAMETERS:
        return best
    print(f"This model is small ({size:,} parameters): it trains on the CPU, faster than on "
          f"{torch.cuda.get_device_name(best)}; set WORKBOOK_DEVICE=cuda to override.")
    return torch.device("cpu")


def describe_device(device: torch.device | str) -> str:
    """One line for a notebook's set-up cell: PyTorch's version and the device the notebook
    uses. On a GPU or Apple silicon it adds that the results the text states were measured on
    a CPU (a trained model can land a little differently elsewhere, and times differ) and how
    to get the CPU's: ``WORKBOOK_DEVICE=cpu``."""
    device = torch.device(device)
    line = f"PyTorch {torch.__version__} on {device}"
    if device.type == "cpu":
        return line
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else (
        "Apple silicon" if device.type == "mps" else device.type)
    return (f"{line} ({name}). The results this notebook states were measured on a CPU: here a trained "
            "model can land a little differently and times differ. For the CPU's results, set "
            "WORKBOOK_DEVICE=cpu before starting JupyterLab.")


def _mps_available() -> bool:
    backend = getattr(torch.backends, "mps", None)
    return bool(backend is not None and backend.is_available())


def seed_everything(seed: int = 0) -> torch.Generator:
    """Seed Python, NumPy and PyTorch (all devices); return a CPU generator with that seed.

    Use the returned generator where a function takes ``generator=`` so that a
    cell gives the same numbers however often the cells above it were re-run.
    """
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)
    return torch.Generator().manual_seed(seed)


def grading_mode() -> bool:
    """True while the autograder runs a notebook (environment ``WORKBOOK_GRADING=1``).

    Cells that train a model use it to train for fewer steps: grading needs the
    graded cells, not a well-trained model.
    """
    return os.environ.get("WORKBOOK_GRADING", "") not in ("", "0", "false", "False")


def full_or_quick(full: T, quick: T) -> T:
    """``full`` normally, ``quick`` while the autograder runs the notebook
    (:func:`grading_mode`): one call that keeps the switch out of a notebook's cells,
    e.g. ``lengths = full_or_quick([256, 512, 1024], [128])``."""
    return quick if grading_mode() else full


@contextlib.contextmanager
def torch_threads(n: int | str | None, model: nn.Module | None = None) -> Iterator[None]:
    """Run the block with ``n`` PyTorch CPU threads, then restore the previous number.

    Small models (a few hundred thousand parameters) run a long chain of tiny
    operations; one thread avoids the cost of coordinating threads, which is large on a
    busy machine. ``None`` leaves the setting alone; ``"auto"`` is
    :func:`threads_for` ``(model)``.
    """
    if n == "auto":
        if model is None:
            raise ValueError('num_threads="auto" needs the model it is for')
        n = threads_for(model)
    elif n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise ValueError(f"num_threads must be 'auto', None or a whole number >= 1, got {n!r}")
    previous = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def threads_for(model: nn.Module) -> int | None:
    """The CPU threads to run ``model`` with: 1 for a small model on the CPU (fewer than
    :data:`SMALL_MODEL_PARAMETERS` parameters), ``None`` (keep torch's setting) otherwise.

    A small model runs a long chain of tiny matrix products: splitting each over threads
    costs more than it saves, and on a busy machine waiting threads make it many times
    slower. :func:`course_lib.training.train` and the evaluation helpers use this rule.

    The environment variable ``WORKBOOK_THREADS=N`` overrides the rule for every model
    (e.g. to measure a notebook on N threads: ``benchmarks/notebook_times.py --threads N``).
    """
    pinned = os.environ.get("WORKBOOK_THREADS", "")
    if pinned:
        if not pinned.isdigit() or int(pinned) < 1:
            raise ValueError(f"WORKBOOK_THREADS must be a whole number >= 1, got {pinned!r}")
        return int(pinned)
    first = next(model.parameters(), None)
    if first is None or first.device.type != "cpu":
        return None
    return 1 if sum(p.numel() for p in model.parameters()) < SMALL_MODEL_PARAMETERS else None


# PyTorch >= 2.9 keeps its TF32 settings as a tree of ``fp32_precision`` values (parents first:
# setting a parent also sets the children that follow it). Always readable, unlike the legacy
# ``allow_tf32`` flags, which raise once the two APIs have been mixed.
_FP32_PRECISION_PATHS = ("", "cuda", "cuda.matmul", "cudnn", "cudnn.conv", "cudnn.rnn",
                         "mkldnn", "mkldnn.matmul", "mkldnn.conv", "mkldnn.rnn")


def _backend(path: str) -> object | None:
    node: object | None = torch.backends
    for part in filter(None, path.split(".")):
        node = getattr(node, part, None)
    return node if node is not None and hasattr(node, "fp32_precision") else None


def _precision_settings() -> tuple:
    """What :func:`full_precision` changes, to put back afterwards: the matmul precision, the
    legacy flags (None where mixing the APIs made them unreadable) and the ``fp32_precision``
    values (None before PyTorch 2.9)."""
    try:
        legacy = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    except RuntimeError:  # PyTorch refuses to read them after a mix of the two APIs
        legacy = None
    tree = {path: node.fp32_precision for path in _FP32_PRECISION_PATHS if (node := _backend(path)) is not None}
    return torch.get_float32_matmul_precision(), legacy, tree or None


def _restore_precision(settings: tuple) -> None:
    matmul, legacy, tree = settings
    torch.set_float32_matmul_precision(matmul)
    if legacy is not None:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = legacy
    for path, value in (tree or {}).items():
        _backend(path).fp32_precision = value


@contextlib.contextmanager
def full_precision() -> Iterator[None]:
    """Run the block with float32 computed in float32 (IEEE), then restore the settings before.

    On NVIDIA GPUs since Ampere, PyTorch may compute float32 matrix products, convolutions
    and RNNs in TF32 (a 10-bit mantissa): cuDNN's convolutions and RNNs do by default, about
    1e-3 off a float64 result where a float32 computation is about 1e-7 off. Checks compare a
    student's float32 answer with a reference at float32's tolerance (1e-5), so both are
    computed in this block, on the CPU (where it changes nothing by default) as on a GPU: the
    same answers, the same grades. It sets ``torch.backends.cuda.matmul.allow_tf32 = False``,
    ``torch.backends.cudnn.allow_tf32 = False`` and
    ``torch.set_float32_matmul_precision("highest")``; the settings are read back through
    PyTorch's ``fp32_precision`` values where it has them, which stay readable when code
    mixed the two APIs.
    """
    settings = _precision_settings()
    torch.set_float32_matmul_precision("highest")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        _restore_precision(settings)
