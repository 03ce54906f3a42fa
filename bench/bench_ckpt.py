#!/usr/bin/env python3
"""Checkpoint save/load throughput: loom's sharded checkpoint of a
GPT-2-small-shaped model (124M parameters + AdamW m and v, float32) against
torch.save / torch.load of the same state (three float32 tensors per
parameter, the same bytes) on the same disk, in the same script.

loom: `loom train --model gpt2-small --steps 1 --save-dir D` prints the
save's wall time (shards written and fsynced, SHA-256 of each file read
back, manifest, rename, latest); `--resume D` prints the load's (manifest,
hash verification of every file, reading the shards). torch: the same
state dict saved with torch.save then fsync, and loaded with torch.load.
GB/s = state bytes / seconds, per rank for loom (each rank writes its
shards). Prints the ratio loom / torch. Noisy on a shared machine.

usage: /usr/bin/python3 bench/bench_ckpt.py [--ranks 1 2] [--dir /tmp]"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)
LOOM = os.environ.get("LOOM", os.path.join(SRC, "build", "loom"))
LOOM_RUN = os.path.join(SRC, "scripts", "loomrun")


def loom_times(tmp, ranks, data):
    ck = os.path.join(tmp, "ck%d" % ranks)
    common = ["train", "--model", "gpt2-small", "--data", data, "--steps", 2, "--batch", ranks, "--seq", 32,
              "--peak-flops", "1e11", "--no-progress", "--dp", ranks, "--zero", 1 if ranks > 1 else 0]
    pre = [LOOM_RUN, "-np", str(ranks), LOOM] if ranks > 1 else [LOOM]
    p = subprocess.run(pre + [str(a) for a in common + ["--save-dir", ck, "--save-every", 1]],
                       capture_output=True, text=True)
    if p.returncode:
        sys.exit(p.stderr[-2000:])
    save = float(re.search(r"checkpoint step 1 written to \S+ \(([\d.]+) s\)", p.stderr).group(1))
    step1 = os.path.join(ck, "step_1")
    nbytes = sum(os.path.getsize(os.path.join(step1, f)) for f in os.listdir(step1))
    os.remove(os.path.join(ck, "latest"))
    shutil.rmtree(os.path.join(ck, "step_2"))
    subprocess.run(["sync"])
    p = subprocess.run(pre + [str(a) for a in common + ["--resume", step1]], capture_output=True, text=True)
    if p.returncode:
        sys.exit(p.stderr[-2000:])
    load = float(re.search(r"resumed from \S+ at step 1 \(([\d.]+) s\)", p.stderr).group(1))
    return nbytes, save, load


def torch_times(tmp):
    import torch
    torch.manual_seed(0)
    shapes = [(50257, 768), (1024, 768)] + [(768, 2304), (2304,), (768, 768), (768,), (768, 3072),
                                            (3072,), (3072, 768), (768,), (768,), (768,), (768,), (768,)] * 12 + [(768,), (768,)]
    sd = {}
    for i, s in enumerate(shapes):
        for kind in ("param", "exp_avg", "exp_avg_sq"):
            sd["%d.%s" % (i, kind)] = torch.randn(*s)
    nbytes = sum(t.numel() * 4 for t in sd.values())
    path = os.path.join(tmp, "state.pt")
    t0 = time.time()
    with open(path, "wb") as f:
        torch.save(sd, f)
        f.flush()
        os.fsync(f.fileno())
    save = time.time() - t0
    del sd
    subprocess.run(["sync"])
    t0 = time.time()
    sd = torch.load(path)
    load = time.time() - t0
    del sd
    os.remove(path)
    return nbytes, save, load


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--dir", default=None)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(dir=a.dir) as tmp:
        data = os.path.join(tmp, "train.bin")
        subprocess.run([LOOM, "data", "--input", "/usr/share/common-licenses/GPL-3", "--out", data, "--val", ""],
                       check=True, capture_output=True)
        tb, ts, tl = torch_times(tmp)
        print("torch.save: %.2f GB in %.2f s = %.3f GB/s; torch.load: %.2f s = %.3f GB/s"
              % (tb / 1e9, ts, tb / ts / 1e9, tl, tb / tl / 1e9))
        for r in a.ranks:
            lb, ls_, ll = loom_times(tmp, r, data)
            print("loom %d rank(s): %.2f GB in all; save %.2f s = %.3f GB/s per rank (%.3f GB/s total), "
                  "ratio vs torch.save %.2f; load %.2f s = %.3f GB/s per rank, ratio vs torch.load %.2f"
                  % (r, lb / 1e9, ls_, lb / r / ls_ / 1e9, lb / ls_ / 1e9, (lb / ls_) / (tb / ts),
                     ll, lb / r / ll / 1e9, (lb / ll) / (tb / tl)))


if __name__ == "__main__":
    main()
