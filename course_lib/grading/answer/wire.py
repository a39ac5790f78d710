"""Plain data across a trust boundary: encode values to bytes and back, without pickle.

A grading plan (the inputs of each call) travels from the grader to the student's
sandboxed process, and the answers travel back. Both directions carry only *plain
data*: ``None``, booleans, integers, floats, strings, tuples, lists, dicts, dense
tensors, and a few descriptions of objects the other side builds itself
(:class:`Build`, :class:`GeneratorState`, devices and dtypes). Anything else a
student's code returns becomes an :class:`Opaque` holding only its type's name.

The format is one JSON document (the structure, with tensors replaced by
references) followed by the tensors' raw bytes. :func:`decode` trusts nothing: it
checks sizes, nesting, dtypes and byte counts, and raises :class:`WireError` for
anything malformed, so a hostile peer can at worst make its own answer unreadable.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["Build", "GeneratorState", "Opaque", "WireError", "WireLimits", "encode", "decode",
           "to_plain"]

_DTYPES = {
    "bool": torch.bool, "uint8": torch.uint8, "int8": torch.int8, "int16": torch.int16,
    "int32": torch.int32, "int64": torch.int64, "float16": torch.float16,
    "bfloat16": torch.bfloat16, "float32": torch.float32, "float64": torch.float64,
}
_NAMES = {v: k for k, v in _DTYPES.items()}
_HEADER = struct.Struct("<Q")


class WireError(ValueError):
    """The bytes are not a well-formed message (or exceed a limit)."""


@dataclass(frozen=True)
class WireLimits:
    """Bounds :func:`decode` enforces on a message from an untrusted peer."""

    max_bytes: int = 512 * 2**20
    max_header: int = 64 * 2**20  # the JSON structure (tensors' bytes come after it)
    max_nodes: int = 200_000
    max_depth: int = 24
    max_string: int = 1 * 2**20


@dataclass
class Build:
    """An object for the receiving side to construct: ``target(*args, **kwargs)``.

    ``target`` is ``"package.module:Name"`` and must be importable where the object is
    built (course_lib or torch). ``state`` is loaded with ``load_state_dict``; the
    object is then moved to ``device``/``dtype`` and put in train or eval mode.
    """

    target: str
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    state: dict | None = None
    device: str | None = None
    dtype: str | None = None
    train: bool | None = None


@dataclass
class GeneratorState:
    """A ``torch.Generator`` as data: its device and its state tensor."""

    device: str
    state: torch.Tensor

    @classmethod
    def of(cls, generator: torch.Generator) -> "GeneratorState":
        return cls(str(generator.device), generator.get_state())

    def build(self) -> torch.Generator:
        g = torch.Generator(device=self.device)
        g.set_state(self.state)
        return g


@dataclass(frozen=True)
class Opaque:
    """Something that is not plain data (a module, an array, ...), by type name only."""

    type_name: str

    def __repr__(self) -> str:
        return f"<{self.type_name}>"


# ---------------------------------------------------------------------------
# Encoding
# ---------------------------------------------------------------------------

class _Encoder:
    def __init__(self) -> None:
        self.tensors: list[tuple[str, list[int], bytes]] = []
        self.size = 0

    def tensor(self, t: torch.Tensor) -> dict:
        t = torch.Tensor.as_subclass(t, torch.Tensor) if type(t) is not torch.Tensor else t
        requires_grad = bool(t.requires_grad)
        device = str(t.device)
        t = t.detach()
        if t.layout != torch.strided or t.is_complex() or t.dtype not in _NAMES or t.is_quantized:
            return {"__opaque__": f"tensor of {str(t.dtype).replace('torch.', '')}, layout {t.layout}"}
        cpu = t.to("cpu").contiguous()
        if cpu.dtype == torch.bfloat16:
            raw = cpu.view(torch.int16).numpy().tobytes()
        else:
            raw = cpu.numpy().tobytes()
        self.tensors.append((_NAMES[cpu.dtype], list(cpu.shape), raw))
        self.size += len(raw)
        return {"__tensor__": len(self.tensors) - 1, "device": device, "requires_grad": requires_grad}

    def value(self, x: Any, depth: int = 0) -> Any:
        if depth > 40:
            return {"__opaque__": "structure nested too deeply"}
        if x is None or isinstance(x, (bool, str)):
            return x
        if isinstance(x, int):
            return x if -(2**63) <= x < 2**63 else {"__bigint__": str(x)}
        if isinstance(x, float):
            return x if math.isfinite(x) else {"__float__": repr(x)}
        if isinstance(x, torch.Tensor):
            return self.tensor(x)
        if isinstance(x, tuple):
            return {"__tuple__": [self.value(v, depth + 1) for v in x]}
        if isinstance(x, list):
            return [self.value(v, depth + 1) for v in x]
        if isinstance(x, dict):
            return {"__dict__": [[self.value(k, depth + 1), self.value(v, depth + 1)] for k, v in x.items()]}
        if isinstance(x, Build):
            return {"__build__": {"target": x.target, "args": self.value(tuple(x.args), depth + 1),
                                  "kwargs": self.value(dict(x.kwargs), depth + 1),
                                  "state": self.value(x.state, depth + 1), "device": x.device,
                                  "dtype": x.dtype, "train": x.train}}
        if isinstance(x, GeneratorState):
            return {"__generator__": {"device": x.device, "state": self.tensor(x.state)}}
        if isinstance(x, torch.Generator):
            return self.value(GeneratorState.of(x), depth)
        if isinstance(x, torch.device):
            return {"__device__": str(x)}
        if isinstance(x, torch.dtype):
            return {"__dtype__": str(x).replace("torch.", "")}
        if isinstance(x, Opaque):
            return {"__opaque__": x.type_name}
        return self._other(x)

    @staticmethod
    def _other(x: Any) -> Any:
        # numpy scalars behave like Python numbers for every check; anything else is opaque
        try:
            import numpy as np
            if isinstance(x, np.generic) and type(x).__module__ == "numpy":
                if isinstance(x, np.bool_):
                    return bool(x)
                if isinstance(x, np.integer):
                    return int(x)
                if isinstance(x, np.floating):
                    v = float(x)
                    return v if math.isfinite(v) else {"__float__": repr(v)}
        except Exception:  # numpy missing or a hostile __class__
            pass
        return {"__opaque__": type(x).__name__[:80]}


def to_plain(x: Any) -> Any:
    """``decode(encode(x))``: what the other side of the wire would receive."""
    return decode(encode(x))


def encode(x: Any, kind: str = "value") -> bytes:
    """Bytes for ``x``: the JSON structure, then every tensor's raw bytes."""
    enc = _Encoder()
    body = enc.value(x)
    header = json.dumps({"kind": kind, "body": body,
                         "tensors": [[d, s, len(r)] for d, s, r in enc.tensors]},
                        separators=(",", ":"), allow_nan=False).encode()
    return b"".join([_HEADER.pack(len(header)), header, *(r for _, _, r in enc.tensors)])


# ---------------------------------------------------------------------------
# Decoding (untrusted input)
# ---------------------------------------------------------------------------

class _Decoder:
    def __init__(self, tensors: list[torch.Tensor], limits: WireLimits) -> None:
        self.tensors = tensors
        self.limits = limits
        self.nodes = 0

    def tensor(self, ref: Any) -> torch.Tensor:
        if not isinstance(ref, dict) or set(ref) - {"__tensor__", "device", "requires_grad"}:
            raise WireError("malformed tensor reference")
        index = ref.get("__tensor__")
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(self.tensors):
            raise WireError("tensor reference out of range")
        t = self.tensors[index]
        device = ref.get("device", "cpu")
        if not isinstance(device, str) or len(device) > 32:
            raise WireError("malformed device")
        if device != "cpu":
            try:
                t = t.to(device)
            except Exception:  # that device does not exist here: keep the data on the CPU
                pass
        if ref.get("requires_grad") is True and t.is_floating_point():
            t = t.requires_grad_(True)
        return t

    def value(self, x: Any, depth: int = 0) -> Any:
        self.nodes += 1
        if self.nodes > self.limits.max_nodes:
            raise WireError(f"more than {self.limits.max_nodes} values")
        if depth > self.limits.max_depth:
            raise WireError("nested too deeply")
        if x is None or isinstance(x, (bool, int, float)):
            return x
        if isinstance(x, str):
            if len(x) > self.limits.max_string:
                raise WireError("string too long")
            return x
        if isinstance(x, list):
            return [self.value(v, depth + 1) for v in x]
        if not isinstance(x, dict) or len(x) == 0:
            raise WireError("malformed value")
        if "__tensor__" in x:
            return self.tensor(x)
        if len(x) != 1:
            raise WireError("malformed value")
        (tag, inner), = x.items()
        if tag == "__tuple__" and isinstance(inner, list):
            return tuple(self.value(v, depth + 1) for v in inner)
        if tag == "__dict__" and isinstance(inner, list):
            out = {}
            for pair in inner:
                if not isinstance(pair, list) or len(pair) != 2:
                    raise WireError("malformed dict")
                key = self.value(pair[0], depth + 1)
                try:
                    hash(key)
                except TypeError:
                    raise WireError("unhashable dict key") from None
                out[key] = self.value(pair[1], depth + 1)
            return out
        if tag == "__float__" and inner in ("nan", "inf", "-inf"):
            return float(inner)
        if tag == "__bigint__" and isinstance(inner, str) and len(inner) < 4000:
            try:
                return int(inner)
            except ValueError:
                raise WireError("malformed integer") from None
        if tag == "__opaque__" and isinstance(inner, str):
            return Opaque(inner[:200])
        if tag == "__device__" and isinstance(inner, str) and len(inner) <= 32:
            try:
                return torch.device(inner)
            except RuntimeError:
                raise WireError("malformed device") from None
        if tag == "__dtype__" and inner in _DTYPES:
            return _DTYPES[inner]
        if tag == "__generator__" and isinstance(inner, dict):
            state = self.tensor(inner.get("state"))
            device = inner.get("device")
            if not isinstance(device, str) or state.dtype != torch.uint8 or state.dim() != 1:
                raise WireError("malformed generator")
            return GeneratorState(device, state.cpu())
        if tag == "__build__" and isinstance(inner, dict):
            target = inner.get("target")
            if not isinstance(target, str) or ":" not in target or len(target) > 200:
                raise WireError("malformed build target")
            args = self.value(inner.get("args"), depth + 1)
            kwargs = self.value(inner.get("kwargs"), depth + 1)
            state = self.value(inner.get("state"), depth + 1)
            if not isinstance(args, tuple) or not isinstance(kwargs, dict) or not (state is None or isinstance(state, dict)):
                raise WireError("malformed build")
            for key in ("device", "dtype"):
                if inner.get(key) is not None and not isinstance(inner.get(key), str):
                    raise WireError("malformed build")
            if inner.get("train") not in (None, True, False):
                raise WireError("malformed build")
            return Build(target, args, kwargs, state, inner.get("device"), inner.get("dtype"), inner.get("train"))
        raise WireError(f"unknown tag {str(tag)[:40]!r}")


def decode(data: bytes, limits: WireLimits = WireLimits(), kind: str | None = None) -> Any:
    """The value encoded in ``data``; :class:`WireError` if it is malformed or too big."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise WireError("not bytes")
    data = memoryview(data)
    if len(data) > limits.max_bytes:
        raise WireError(f"message of {len(data)} bytes is over the {limits.max_bytes} byte limit")
    if len(data) < _HEADER.size:
        raise WireError("truncated message")
    (n,) = _HEADER.unpack(data[:_HEADER.size])
    if n > len(data) - _HEADER.size:
        raise WireError("truncated header")
    if n > limits.max_header:
        raise WireError(f"a structure of {n} bytes is over the {limits.max_header} byte limit")
    try:
        header = json.loads(bytes(data[_HEADER.size:_HEADER.size + n]))
    except (ValueError, RecursionError):
        raise WireError("header is not JSON") from None
    if not isinstance(header, dict) or not isinstance(header.get("tensors"), list):
        raise WireError("malformed header")
    if kind is not None and header.get("kind") != kind:
        raise WireError(f"expected a {kind!r} message")
    offset = _HEADER.size + n
    tensors = []
    for spec in header["tensors"]:
        if not (isinstance(spec, list) and len(spec) == 3 and spec[0] in _DTYPES
                and isinstance(spec[1], list) and len(spec[1]) <= 16
                and all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 2**40 for d in spec[1])
                and isinstance(spec[2], int) and spec[2] >= 0):
            raise WireError("malformed tensor")
        dtype = _DTYPES[spec[0]]
        numel = math.prod(spec[1])
        itemsize = torch.empty((), dtype=dtype).element_size()
        if numel * itemsize != spec[2] or offset + spec[2] > len(data):
            raise WireError("tensor size does not match its bytes")
        raw = bytearray(data[offset:offset + spec[2]])
        offset += spec[2]
        if not raw:
            t = torch.empty(0, dtype=dtype)
        elif dtype == torch.bfloat16:
            t = torch.frombuffer(raw, dtype=torch.int16).view(torch.bfloat16)
        elif dtype == torch.bool:  # any byte other than 0 or 1 would make an invalid bool
            t = torch.frombuffer(raw, dtype=torch.uint8) != 0
        else:
            t = torch.frombuffer(raw, dtype=dtype)
        tensors.append(t.reshape(spec[1]))
    if offset != len(data):
        raise WireError("trailing bytes")
    return _Decoder(tensors, limits).value(header.get("body"))
