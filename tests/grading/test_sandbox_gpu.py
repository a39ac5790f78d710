"""`workbook autograde --gpu`: the sandbox sees the NVIDIA devices and the checks run on
CUDA (skipped cleanly on a machine without a GPU, such as CI)."""

from __future__ import annotations

import json

import nbformat
import pytest

from autograder.sealing import sandbox
from autograder.sealing.course_copy import build_course_copy
from autograder.pipeline.worker import grade_notebook
from conftest import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.cuda]


def test_gpu_submission_is_graded_on_cuda(cuda, tmp_path):
    released = nbformat.read(str(ROOT / "notebooks" / "03_self_attention" / "03_self_attention.ipynb"), as_version=4)
    cells = {c.get("metadata", {}).get("nbgrader", {}).get("grade_id"): c for c in released.cells}
    solution = nbformat.v4.new_code_cell(
        "def scaled_dot_product_attention(q, k, v, mask=None):\n"
        "    s = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))\n"
        "    if mask is not None:\n"
        "        s = s.masked_fill(~mask, float('-inf'))\n"
        "    w = torch.softmax(s, dim=-1)\n"
        "    return w @ v, w\n")
    solution.metadata["nbgrader"] = {"grade": False, "solution": True, "locked": False,
                                     "grade_id": "scaled_dot_product_attention", "schema_version": 3}
    probe = nbformat.v4.new_code_cell("print('DEVICE', torch.cuda.is_available(), get_device())")
    nb = nbformat.v4.new_notebook(cells=[cells["setup"], solution, probe, cells["test_scaled_dot_product_attention"]])
    copy = build_course_copy(tmp_path / "course", ["scaled_dot_product_attention"])
    limits = sandbox.Limits(cell_timeout=120, notebook_timeout=300, memory_mb=None)
    job = {"notebook": nbformat.writes(nb), "limits": limits.__dict__.copy(), "salts": {}, "extra_files": [],
           "gpu": True, "device": "cuda"}
    result = grade_notebook(job, copy, tmp_path / "job")
    printed = "".join(o.get("text", "") for o in json.loads(result["notebook"])["cells"][2]["outputs"])
    assert "DEVICE True cuda" in printed, printed
    assert result["cells"][0]["score"] == 5.0, result
