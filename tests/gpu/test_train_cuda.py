"""loom-cuda train --device cuda against loom train (CPU) on one rank (issue 14).

Trains a tiny GPT for 20 steps on the GPU (fp32, TF32 off: the CUDA
backend's default) and on the CPU from the same initial parameters and data,
and asserts every step's loss within 1e-5 relative and the final parameters
within 1e-4 relative (max abs diff / max abs value). Exits 77 (ctest: skipped)
only when loom-cuda reports that no CUDA device is visible.
Needs LOOM, LOOM_SRC (ctest sets them); loom-cuda sits beside LOOM.
"""
import os
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import loomtest as lt  # noqa: E402

LOOM = os.environ["LOOM"]
LOOM_CUDA = os.path.join(os.path.dirname(LOOM), "loom-cuda")


def params(path):
    """name -> list of floats of a safetensors file (fp32)."""
    import json
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        head = json.loads(f.read(n))
        data = f.read()
    out = {}
    for k, v in head.items():
        if k == "__metadata__":
            continue
        a, b = v["data_offsets"]
        out[k] = struct.unpack("<%df" % ((b - a) // 4), data[a:b])
    return out


with tempfile.TemporaryDirectory() as tmp:
    data = lt.make_text_data(tmp)
    common = ["train", "--model", "tiny", "--data", data, "--steps", "20", "--batch", "4", "--seq", "32",
              "--threads", "1", "--peak-flops", "1e11", "--no-progress"]
    runs = {}
    for name, exe, dev in (("cpu", LOOM, "cpu"), ("cuda", LOOM_CUDA, "cuda")):
        m, p = os.path.join(tmp, name + ".jsonl"), os.path.join(tmp, name + ".safetensors")
        r = subprocess.run([exe] + common + ["--device", dev, "--metrics", m, "--save-params", p],
                           capture_output=True, text=True)
        if r.returncode == 64 and "no CUDA device is visible" in r.stderr:
            print("no CUDA device visible: skipped (%s)" % r.stderr.strip().splitlines()[-1])
            sys.exit(77)
        lt.check(r.returncode == 0, "%s run: exit %d: %s" % (name, r.returncode, r.stderr[-800:]))
        runs[name] = ([row["loss"] for row in lt.read_metrics(m)], params(p))
    (lc, pc), (lg, pg) = runs["cpu"], runs["cuda"]
    lt.check(len(lc) == len(lg) == 20, "steps: cpu %d, cuda %d" % (len(lc), len(lg)))
    for i, (a, b) in enumerate(zip(lc, lg)):
        lt.check(abs(a - b) <= 1e-5 * abs(a), "step %d: cpu loss %.9g, cuda %.9g" % (i + 1, a, b))
    for k in pc:
        diff = max(abs(x - y) for x, y in zip(pc[k], pg[k]))
        scale = max(max(abs(x) for x in pc[k]), 1e-12)
        lt.check(diff <= 1e-4 * scale, "%s: max |cpu - cuda| %.3g (scale %.3g)" % (k, diff, scale))
    print("20 steps: worst loss rel diff %.3g" % max(abs(a - b) / abs(a) for a, b in zip(lc, lg)))
lt.done()
