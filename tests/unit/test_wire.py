"""Plain data across the sandbox boundary: what goes in comes out, and what a hostile peer
sends is either plain data or refused (never pickle, never an object of its choosing)."""

from __future__ import annotations

import json
import struct

import pytest
import torch

from course_lib.grading.answer.wire import Build, GeneratorState, WireLimits, Opaque, WireError, decode, encode, to_plain


def test_values_round_trip_exactly():
    g = torch.Generator().manual_seed(3)
    value = {
        "none": None, "bool": True, "int": -7, "big": 2**80, "float": 0.25, "nan": float("nan"), "str": "αβ",
        "tuple": (1, [2, 3], {"k": (4,)}), 5: "int key",
        "f32": torch.randn(2, 3), "f64": torch.randn(4, dtype=torch.float64), "long": torch.arange(5),
        "bool_t": torch.tensor([True, False]), "half": torch.ones(2, dtype=torch.float16),
        "bf16": torch.ones(2, dtype=torch.bfloat16), "empty": torch.zeros(0, 3), "scalar": torch.tensor(1.5),
        "device": torch.device("cpu"), "dtype": torch.float64, "gen": g,
        "build": Build("course_lib.grading.answer.fixtures.gpt:ContextSumModel", (11, 4), {}, None, "cpu", None, False),
    }
    out = to_plain(value)
    assert out["none"] is None and out["bool"] is True and out["int"] == -7 and out["big"] == 2**80
    assert out["str"] == "αβ" and out["nan"] != out["nan"]
    assert out["tuple"] == (1, [2, 3], {"k": (4,)}) and isinstance(out["tuple"], tuple)
    assert out[5] == "int key"
    for key in ("f32", "f64", "long", "bool_t", "half", "bf16", "empty", "scalar"):
        assert out[key].dtype == value[key].dtype and torch.equal(out[key], value[key]), key
    assert out["device"] == torch.device("cpu") and out["dtype"] is torch.float64
    assert isinstance(out["gen"], GeneratorState)
    assert torch.equal(torch.rand(3, generator=out["gen"].build()), torch.rand(3, generator=g))
    assert out["build"].target.endswith(":ContextSumModel") and out["build"].args == (11, 4)


def test_objects_and_tensor_subclasses_arrive_as_plain_data():
    class Liar(torch.Tensor):
        pass

    import numpy as np
    out = to_plain([torch.nn.Linear(2, 2), np.zeros(3), lambda x: x, torch.ones(2).as_subclass(Liar),
                    np.float32(0.5), torch.ones(2, requires_grad=True)])
    assert out[0] == Opaque("Linear") and out[1] == Opaque("ndarray") and out[2] == Opaque("function")
    assert type(out[3]) is torch.Tensor and torch.equal(out[3], torch.ones(2))
    assert out[4] == 0.5 and type(out[4]) is float
    assert out[5].requires_grad


def _frame(header: dict, payload: bytes = b"") -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + payload


@pytest.mark.parametrize("data,why", [
    (b"", "truncated"),
    (b"\xff" * 8, "truncated header"),
    (_frame({"kind": "value", "body": 1}), "malformed header"),
    (_frame({"kind": "value", "body": {"__tensor__": 0}, "tensors": [["float32", [2], 8]]}, b"\0" * 4),
     "does not match"),
    (_frame({"kind": "value", "body": {"__tensor__": 3}, "tensors": [["float32", [1], 4]]}, b"\0" * 4),
     "out of range"),
    (_frame({"kind": "value", "body": 1, "tensors": [["object", [1], 8]]}, b"\0" * 8), "malformed tensor"),
    (_frame({"kind": "value", "body": {"__pickle__": "gASVAA=="}, "tensors": []}), "unknown tag"),
    (_frame({"kind": "value", "body": 1, "tensors": []}, b"junk"), "trailing"),
    (_frame({"kind": "value", "body": {"__tensor__": 0}, "tensors": [["float32", [2**39, 2**39], 0]]}),
     "does not match"),
])
def test_malformed_messages_are_refused(data, why):
    with pytest.raises(WireError, match=why):
        decode(data)


def test_limits_bound_what_a_peer_can_make_us_build():
    deep: object = 1
    for _ in range(50):
        deep = [deep]
    with pytest.raises(WireError, match="nested too deeply"):
        decode(_frame({"kind": "value", "body": deep, "tensors": []}))
    with pytest.raises(WireError, match="values"):
        decode(encode(list(range(300_000))))
    with pytest.raises(WireError, match="over the"):
        decode(encode(torch.zeros(1000)), WireLimits(max_bytes=1000))


def test_bool_tensors_with_odd_bytes_become_valid_bools():
    t = decode(_frame({"kind": "value", "body": {"__tensor__": 0}, "tensors": [["bool", [3], 3]]}, b"\x00\x02\xff"))
    assert t.dtype == torch.bool and t.tolist() == [False, True, True]
    assert (~t).tolist() == [True, False, False]
