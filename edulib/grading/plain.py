"""Plain data between the grader and a submission: numbers, strings, lists, and tensors as raw bytes.

The grader never unpickles anything a submission made: a check's inputs go to the submission's
process and its answers come back as JSON, where a tensor is {"tensor": dtype, "shape", "data"}
(base64 of its bytes). Decoding builds fresh tensors of the grader's own type, so no object of a
student's class, and no method a student wrote, ever runs in the grader.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from typing import Any

import torch

_DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
          "bfloat16": torch.bfloat16, "int64": torch.int64, "int32": torch.int32, "bool": torch.bool}
MAX_TEXT = 16 * 2**20  # the most one answer of a submission may take, as JSON
MAX_DEPTH = 32  # lists and dicts inside each other: far more than any answer holds


class NotPlain(TypeError):
    """A value that cannot travel as plain data (a submission returned an object of its own)."""


def encode(value: Any) -> Any:
    """`value` as JSON-ready data: tensors become raw bytes with a dtype and a shape."""
    if value is None or type(value) in (bool, int, str):
        return value
    if type(value) is float:
        return value if math.isfinite(value) else {"float": repr(value)}
    if isinstance(value, torch.Tensor):
        tensor = torch.Tensor.as_subclass(value, torch.Tensor).detach().cpu().contiguous()
        name = str(tensor.dtype).removeprefix("torch.")
        if name not in _DTYPES:
            tensor, name = tensor.float(), "float32"
        raw = tensor.view(torch.int16) if tensor.dtype == torch.bfloat16 else tensor  # NumPy has no bf16
        return {"tensor": name, "shape": list(tensor.shape),
                "data": base64.b64encode(raw.numpy().tobytes()).decode()}
    if isinstance(value, (list, tuple)):
        return [encode(item) for item in value]
    if isinstance(value, dict) and all(type(key) is str for key in value):
        return {key: encode(item) for key, item in value.items()}
    raise NotPlain(f"a {type(value).__name__}, where a tensor, a number, a string or a list of them "
                   "was expected")


def decode(data: Any, depth: int = 0) -> Any:
    """Encoded data back as Python values, with tensors rebuilt as plain torch Tensors; anything
    nested deeper than any answer is (MAX_DEPTH) is refused."""
    if depth > MAX_DEPTH:
        raise NotPlain(f"an answer nested more than {MAX_DEPTH} deep")
    if isinstance(data, list):
        return [decode(item, depth + 1) for item in data]
    if isinstance(data, dict):
        if set(data) == {"float"} and data["float"] in ("nan", "inf", "-inf"):
            return float(data["float"])
        if set(data) == {"tensor", "shape", "data"}:
            return _tensor(data)
        return {key: decode(item, depth + 1) for key, item in data.items()}
    return data


def _tensor(data: dict) -> torch.Tensor:
    """A tensor from its encoded form, or NotPlain saying what does not add up."""
    dtype, shape = _DTYPES.get(data["tensor"]), data["shape"]
    if (dtype is None or type(data["data"]) is not str or type(shape) is not list or len(shape) > MAX_DEPTH
            or not all(type(s) is int and s >= 0 for s in shape)):
        raise NotPlain(f"a tensor of dtype {data['tensor']!r} and shape {shape!r}")
    size = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    if size > MAX_TEXT:  # checked before anything is allocated
        raise NotPlain(f"a tensor of shape {shape}, larger than any answer may be")
    try:
        raw = base64.b64decode(data["data"], validate=True)
    except binascii.Error:
        raise NotPlain(f"a tensor of shape {shape} whose data is not base64") from None
    if len(raw) != size:
        raise NotPlain(f"a tensor of shape {shape} whose data has {len(raw)} bytes")
    if not raw:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(raw), dtype=dtype).reshape(shape).clone()


def dumps(value: Any) -> str:
    """One line of JSON for `value` (encoded first)."""
    return json.dumps(encode(value), allow_nan=False)


def loads(text: str | bytes) -> Any:
    """Decode one line of JSON that a submission's process sent; refuse anything else."""
    if len(text) > MAX_TEXT:
        raise NotPlain(f"an answer of {len(text)} bytes (at most {MAX_TEXT})")
    return decode(json.loads(text))
