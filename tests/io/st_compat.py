"""Safetensors compatibility between loom and an independent reader/writer.

The format is parsed and produced here by hand (struct + json + numpy, as
documented by Hugging Face: u64 little-endian header length, JSON header with
dtype / shape / data_offsets and optional __metadata__, then the raw data).
Direction 1: loom writes a file (st_compat write), python checks the layout
and every value byte for byte. Direction 2: python writes a file the way
Hugging Face does (header keys sorted, data in a different order, metadata),
loom reads it (st_compat dump) and python compares names, dtypes, shapes, raw
bytes and loom's float32 conversion of F16/BF16/F64 - every one of the 65536
F16 and BF16 bit patterns - exactly.

usage: st_compat.py PATH/TO/io_st_compat_tool
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

import numpy as np

FAILURES = []


def check(cond, msg):
    if not cond:
        FAILURES.append(msg)
        print("FAIL", msg)


def parse(path):
    """(header dict in file order, data bytes) of a safetensors file."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    text = blob[8:8 + n].decode("utf-8")
    return n, text, json.loads(text), blob[8 + n:]


def expected_loom_file():
    """What st_compat write puts in its file, computed independently."""
    i15 = np.arange(15)
    return {
        "wte": ("F32", [5, 3], ((i15 * 37 % 101 - 50) / 8.0).astype("<f4")),
        "half": ("F16", [4, 2], (np.arange(8) * 0x1357 + 0x0123).astype("<u2")),
        "bhalf": ("BF16", [3], (np.arange(3) * 0x2468 + 0x3f00).astype("<u2")),
        "dbl": ("F64", [2, 2], ((np.arange(4) - 1.5) / 3.0).astype("<f8")),
        "ids": ("I32", [3], np.array([-7, 0, 2147483647], "<i4")),
        "big": ("I64", [2], np.array([-(1 << 40), (1 << 62) + 5], "<i8")),
        "u16": ("U16", [3], np.array([0, 1000, 65535], "<u2")),
        "bytes": ("U8", [5], np.array([0, 1, 128, 254, 255], "u1")),
        "nothing": ("F32", [0], np.zeros(0, "<f4")),
        "scalar": ("F32", [], np.array([2.5], "<f4")),
    }


def check_loom_written(tool, tmp):
    path = os.path.join(tmp, "loom.safetensors")
    r = subprocess.run([tool, "write", path], capture_output=True, text=True)
    check(r.returncode == 0, f"st_compat write failed: {r.stderr}")
    n, text, header, data = parse(path)
    check(n % 8 == 0, f"header length {n} is not a multiple of 8")
    check(text.rstrip(" ").endswith("}") and len(text) - len(text.rstrip(" ")) < 8,
          "header padded with fewer than 8 spaces")
    meta = header.pop("__metadata__", None)
    check(meta == {"format": "pt", "source": 'loom "test"'}, f"metadata {meta}")
    want = expected_loom_file()
    check(list(header) == list(want), f"tensor order {list(header)}")
    end = 0
    for name, (dtype, shape, values) in want.items():
        info = header.get(name, {})
        check(info.get("dtype") == dtype, f"{name}: dtype {info.get('dtype')}")
        check(info.get("shape") == shape, f"{name}: shape {info.get('shape')}")
        b, e = info.get("data_offsets", [-1, -1])
        check(b == end, f"{name}: begins at {b}, expected {end} (tensors in the order added)")
        check(data[b:e] == values.tobytes(), f"{name}: bytes differ")
        end = e
    check(end == len(data), f"data is {len(data)} bytes, tensors cover {end}")


def python_tensors():
    rng = np.random.default_rng(1234)
    all16 = np.arange(65536, dtype="<u2")
    f64 = np.concatenate([
        rng.standard_normal(1000) * 10.0 ** rng.integers(-50, 50, 1000),
        [0.0, -0.0, np.inf, -np.inf, np.nan, 1e300, -1e300, 1e-50, 1e-40, -1e-45,
         3.4028235677973366e38, 1.0 + 2.0 ** -24, 1.0 + 3 * 2.0 ** -24, 5e-324]]).astype("<f8")
    return {
        "f16_all": ("F16", [256, 256], all16.view("<f2")),
        "bf16_all": ("BF16", [65536], all16),
        "f64": ("F64", [len(f64)], f64),
        "f32": ("F32", [3, 7], rng.standard_normal(21).astype("<f4")),
        "i64": ("I64", [2, 2], np.array([-1, 2 ** 63 - 1, -2 ** 63, 7], "<i8")),
        "i32": ("I32", [3], np.array([-5, 0, 99], "<i4")),
        "u16": ("U16", [2], np.array([7, 65535], "<u2")),
        "u8": ("U8", [3, 1], np.array([9, 0, 255], "u1")),
        "empty": ("F32", [0, 4], np.zeros(0, "<f4")),
        "scalar": ("F64", [], np.array([-0.125], "<f8")),
    }


def write_python_file(path, tensors, metadata):
    """Write like Hugging Face: header keys sorted by name, padded to 8 bytes
    with spaces; here the data is laid out in reverse name order, so only the
    offsets say where each tensor is."""
    header, chunks, offset = {"__metadata__": metadata}, [], 0
    for name in sorted(tensors, reverse=True):
        dtype, shape, values = tensors[name]
        raw = values.tobytes()
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    header = {k: header[k] for k in sorted(header)}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(chunks))


def expected_f32(dtype, values):
    if dtype == "F16" or dtype == "F32" or dtype == "F64":
        return values.astype("<f4")
    return (values.astype("<u4") << 16).view("<f4")  # BF16: the top half of a float32


def same_floats(got, want):
    """Bitwise equal, except that any NaN matches a NaN of the same sign."""
    gb, wb = got.view("<u4"), want.view("<u4")
    both_nan = np.isnan(got) & np.isnan(want) & (np.signbit(got) == np.signbit(want))
    return bool(np.all((gb == wb) | both_nan))


def check_python_written(tool, tmp):
    path = os.path.join(tmp, "py.safetensors")
    tensors = python_tensors()
    metadata = {"format": "pt", "note": "written by python"}
    write_python_file(path, tensors, metadata)
    out = os.path.join(tmp, "dump")
    os.makedirs(out)
    r = subprocess.run([tool, "dump", path, out, "format", "note", "absent"], capture_output=True, text=True)
    check(r.returncode == 0, f"st_compat dump failed: {r.stderr}")
    lines = r.stdout.splitlines()
    listed = [l.split(" ") for l in lines if l.startswith("tensor ")]
    names = sorted(tensors)  # loom keeps header order: the sorted keys
    check([t[1] for t in listed] == names, f"tensor names/order {[t[1] for t in listed]}")
    for i, t in enumerate(listed):
        name, dtype, dims = t[1], t[2], t[3] if len(t) > 3 else ""
        wdtype, wshape, values = tensors[name]
        check(dtype == wdtype, f"{name}: dtype {dtype}")
        check(dims == ",".join(map(str, wshape)), f"{name}: shape {dims}")
        with open(os.path.join(out, f"{i}.raw"), "rb") as f:
            check(f.read() == values.tobytes(), f"{name}: raw bytes differ")
        if wdtype in ("F32", "F16", "BF16", "F64"):
            got = np.fromfile(os.path.join(out, f"{i}.f32"), dtype="<f4")
            want = expected_f32(wdtype, values).reshape(-1)
            check(got.shape == want.shape and same_floats(got, want),
                  f"{name}: read_f32 differs from numpy's float32 conversion")
    check("meta format pt" in lines, "metadata format")
    check("meta note written by python" in lines, "metadata note")
    check("meta absent (absent)" in lines, "absent metadata")


def main():
    tool = sys.argv[1]
    with tempfile.TemporaryDirectory(prefix="loom-stpy-") as tmp:
        check_loom_written(tool, tmp)
        check_python_written(tool, tmp)
    print(f"{len(FAILURES)} failed")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
