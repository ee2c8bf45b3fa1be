"""Minimal, dependency-free (torch + numpy only) reader/writer for the safetensors format.

File layout (https://github.com/huggingface/safetensors, "format" section):

    [8 bytes]  N = little-endian u64, length of the JSON header
    [N bytes]  UTF-8 JSON: {"<name>": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]},
                            ..., "__metadata__": {"<str>": "<str>", ...}}   (metadata optional)
    [rest]     the data buffer; offsets are relative to its start, tensors are row-major,
               little-endian, and together cover the buffer exactly (no holes, no overlap).

The writer pads the header with spaces to a multiple of 8 bytes, as the reference
implementation does. The reader validates everything it can and raises SafetensorsError
(a ValueError) with a message naming the file and the offending entry.
"""
from __future__ import annotations

import json
import os
import struct
import sys
from typing import Dict, Mapping, Optional, Tuple

import torch

# safetensors dtype tag -> (torch dtype, bytes per element)
_DTYPES = {
    "F64": (torch.float64, 8),
    "F32": (torch.float32, 4),
    "F16": (torch.float16, 2),
    "BF16": (torch.bfloat16, 2),
    "I64": (torch.int64, 8),
    "I32": (torch.int32, 4),
    "I16": (torch.int16, 2),
    "I8": (torch.int8, 1),
    "U8": (torch.uint8, 1),
    "BOOL": (torch.bool, 1),
}
_TAG_OF = {dt: tag for tag, (dt, _) in _DTYPES.items()}

# Refuse absurd headers rather than trying to allocate them (the reference uses 100 MB).
_MAX_HEADER = 100 * 1024 * 1024

if sys.byteorder != "little":  # pragma: no cover - every machine we run on is little-endian
    raise ImportError("safetensors_io assumes a little-endian host")


class SafetensorsError(ValueError):
    """A file that is not valid safetensors (or not what the caller asked for)."""


def dtype_tag(dtype: torch.dtype) -> str:
    if dtype not in _TAG_OF:
        raise SafetensorsError(f"torch dtype {dtype} has no safetensors tag")
    return _TAG_OF[dtype]


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def read_header(path: str) -> Tuple[dict, Dict[str, str], int]:
    """Returns (entries, metadata, data_start) without reading the data."""
    if not os.path.isfile(path):
        raise SafetensorsError(f"{path}: no such file")
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            raise SafetensorsError(f"{path}: {size} bytes, too short for a safetensors header")
        (n,) = struct.unpack("<Q", raw)
        if n > _MAX_HEADER or 8 + n > size:
            raise SafetensorsError(f"{path}: header length {n} is invalid for a {size}-byte file")
        text = f.read(n)
    try:
        header = json.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SafetensorsError(f"{path}: header is not valid UTF-8 JSON ({e})") from None
    if not isinstance(header, dict):
        raise SafetensorsError(f"{path}: header is not a JSON object")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict):
        raise SafetensorsError(f"{path}: __metadata__ is not an object")
    return header, metadata, 8 + n


def read(path: str) -> Tuple[Dict[str, torch.Tensor], Dict[str, str]]:
    """Reads every tensor of a safetensors file. Returns ({name: tensor}, metadata)."""
    entries, metadata, start = read_header(path)
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read()
    spans = []
    out: Dict[str, torch.Tensor] = {}
    for name, info in entries.items():
        where = f"{path}: tensor '{name}'"
        if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= info.keys():
            raise SafetensorsError(f"{where}: entry needs dtype, shape and data_offsets")
        tag, shape, offs = info["dtype"], info["shape"], info["data_offsets"]
        if tag not in _DTYPES:
            raise SafetensorsError(f"{where}: unsupported dtype {tag!r} (known: {sorted(_DTYPES)})")
        if not isinstance(shape, list) or not all(isinstance(s, int) and s >= 0 for s in shape):
            raise SafetensorsError(f"{where}: bad shape {shape!r}")
        if (not isinstance(offs, list) or len(offs) != 2
                or not all(isinstance(o, int) for o in offs) or not 0 <= offs[0] <= offs[1] <= len(data)):
            raise SafetensorsError(f"{where}: bad data_offsets {offs!r} (data buffer is {len(data)} bytes)")
        dtype, itemsize = _DTYPES[tag]
        nbytes = _numel(shape) * itemsize
        if offs[1] - offs[0] != nbytes:
            raise SafetensorsError(
                f"{where}: {tag}{shape} needs {nbytes} bytes but data_offsets span {offs[1] - offs[0]}")
        spans.append((offs[0], offs[1], name))
        if nbytes == 0:
            out[name] = torch.empty(shape, dtype=dtype)
            continue
        buf = bytearray(data[offs[0]:offs[1]])  # private, writable copy
        if dtype == torch.bfloat16:
            t = torch.frombuffer(buf, dtype=torch.int16).view(torch.bfloat16)
        else:
            t = torch.frombuffer(buf, dtype=dtype)
        out[name] = t.reshape(shape)
    # The data buffer must be covered exactly, without overlap.
    pos = 0
    for b, e, name in sorted(spans):
        if b != pos:
            raise SafetensorsError(
                f"{path}: tensor '{name}' starts at byte {b}, expected {pos} (hole or overlap in data)")
        pos = e
    if pos != len(data):
        raise SafetensorsError(f"{path}: {len(data) - pos} trailing bytes after the last tensor")
    return out, {str(k): v for k, v in metadata.items()}


def write(path: str, tensors: Mapping[str, torch.Tensor],
          metadata: Optional[Mapping[str, str]] = None) -> None:
    """Writes tensors (any supported dtype, any device) to `path`, names in sorted order."""
    header: Dict[str, object] = {}
    if metadata:
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
            raise SafetensorsError("__metadata__ must map str -> str")
        header["__metadata__"] = dict(metadata)
    blobs = []
    pos = 0
    for name in sorted(tensors):
        if name == "__metadata__":
            raise SafetensorsError("'__metadata__' is reserved")
        t = tensors[name].detach().to("cpu").contiguous()
        tag = dtype_tag(t.dtype)
        if t.dtype == torch.bfloat16:
            blob = t.view(torch.int16).numpy().tobytes()
        else:
            blob = t.numpy().tobytes()
        header[name] = {"dtype": tag, "shape": list(t.shape), "data_offsets": [pos, pos + len(blob)]}
        blobs.append(blob)
        pos += len(blob)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)
    os.replace(tmp, path)
