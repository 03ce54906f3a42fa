"""Minimal safetensors reader/writer (numpy + struct + json only).

File layout: u64 little-endian header length N, then N bytes of UTF-8 JSON,
then the data buffer. The header maps each tensor name to
{"dtype", "shape", "data_offsets": [begin, end]} (offsets relative to the data
buffer), plus an optional "__metadata__" object of string -> string. The header
is padded with spaces so the data buffer starts at a multiple of 8 bytes.

load() raises SafetensorsError with a message naming the problem for any
malformed file; it never returns a partially checked result.
"""

import json
import struct

import numpy as np

# safetensors dtype name -> little-endian numpy dtype
DTYPES = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "U16": np.dtype("<u2"),
    "U8": np.dtype("u1"),
}
_NAMES = {dt: name for name, dt in DTYPES.items()}

# refuse headers larger than this: a corrupt length must not make us allocate GBs
MAX_HEADER = 100 * 1024 * 1024


class SafetensorsError(ValueError):
    pass


def _dtype_name(arr):
    dt = arr.dtype.newbyteorder("<") if arr.dtype.byteorder == ">" else arr.dtype
    for name, want in DTYPES.items():
        if dt == want:
            return name
    raise SafetensorsError("unsupported numpy dtype %s (supported: %s)"
                           % (arr.dtype, ", ".join(sorted(DTYPES))))


def save(path, tensors, metadata=None):
    """Write {name: numpy array} (and optional {str: str} metadata) to path.

    Tensors are laid out in sorted name order. Arrays are converted to
    little-endian C order; their dtype must be one of DTYPES.
    """
    if metadata is not None:
        for k, v in metadata.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise SafetensorsError("metadata must map str to str, got %r: %r" % (k, v))
    header = {}
    blobs = []
    offset = 0
    for name in sorted(tensors):
        if name == "__metadata__":
            raise SafetensorsError("'__metadata__' is reserved and cannot name a tensor")
        arr = np.asarray(tensors[name])
        dname = _dtype_name(arr)
        data = np.ascontiguousarray(arr, dtype=DTYPES[dname]).tobytes()
        header[name] = {"dtype": dname, "shape": [int(d) for d in arr.shape],
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    if metadata:
        header["__metadata__"] = dict(metadata)
    hbytes = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hbytes += b" " * ((8 - len(hbytes) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hbytes)))
        f.write(hbytes)
        for b in blobs:
            f.write(b)


def load(path):
    """Read path; return (tensors {name: numpy array}, metadata {str: str}).

    Raises SafetensorsError (a ValueError) naming the problem if the file is
    truncated, the header is not valid JSON, an entry is malformed, or data
    ranges are out of bounds or overlap. OSError propagates for I/O failures.
    """
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise SafetensorsError("%s: %d bytes, too short for the 8-byte header length" % (path, len(raw)))
    (n,) = struct.unpack("<Q", raw[:8])
    if n > MAX_HEADER or 8 + n > len(raw):
        raise SafetensorsError("%s: header length %d does not fit in a %d-byte file" % (path, n, len(raw)))
    try:
        header = json.loads(raw[8:8 + n].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SafetensorsError("%s: header is not valid JSON: %s" % (path, e))
    if not isinstance(header, dict):
        raise SafetensorsError("%s: header is not a JSON object" % path)
    data = memoryview(raw)[8 + n:]

    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise SafetensorsError("%s: __metadata__ must be an object of strings" % path)

    tensors = {}
    ranges = []
    for name, info in header.items():
        where = "%s: tensor %r" % (path, name)
        if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
            raise SafetensorsError("%s: entry must have exactly dtype, shape, data_offsets" % where)
        dname, shape, offs = info["dtype"], info["shape"], info["data_offsets"]
        if dname not in DTYPES:
            raise SafetensorsError("%s: unsupported dtype %r" % (where, dname))
        if (not isinstance(shape, list)
                or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)):
            raise SafetensorsError("%s: shape %r is not a list of non-negative ints" % (where, shape))
        if (not isinstance(offs, list) or len(offs) != 2
                or not all(isinstance(o, int) and not isinstance(o, bool) for o in offs)):
            raise SafetensorsError("%s: data_offsets %r is not [begin, end]" % (where, offs))
        begin, end = offs
        dt = DTYPES[dname]
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if not 0 <= begin <= end <= len(data):
            raise SafetensorsError("%s: data_offsets [%d, %d] outside the %d-byte data buffer"
                                   % (where, begin, end, len(data)))
        if end - begin != count * dt.itemsize:
            raise SafetensorsError("%s: shape %s of %s needs %d bytes, data_offsets give %d"
                                   % (where, shape, dname, count * dt.itemsize, end - begin))
        ranges.append((begin, end, name))
        arr = np.frombuffer(data[begin:end], dtype=dt).reshape(shape)
        tensors[name] = arr.astype(dt.newbyteorder("="), copy=True)
    ranges.sort()
    for (b0, e0, n0), (b1, e1, n1) in zip(ranges, ranges[1:]):
        if b1 < e0:
            raise SafetensorsError("%s: tensors %r and %r overlap in the data buffer" % (path, n0, n1))
    return tensors, metadata
