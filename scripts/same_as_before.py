#!/usr/bin/python3
"""same_as_before.py - prove a change left training unchanged: build another
commit of loom beside this tree and run both binaries on the same layouts,
comparing the loss of every step and the bytes of --save-params.

    scripts/same_as_before.py [--base REV] [--new BUILD/loom] [--only NAME,...]
                              [--list] [--keep]

--base REV (default HEAD): the commit to compare with, checked out with
`git worktree` into build-base/src-<sha> and built into build-base/<sha>
(reused while it exists). --new: the binary of this tree (default
build/loom, built first with `make build` unless --no-build). Each layout
runs both binaries, one after the other, on a tiny model and the same data;
a layout passes when every logged loss and gradient norm (the metrics'
figures as printed) and the SHA-256 of the parameter file (every weight bit
for bit) are identical. Any
intentional difference belongs in its own commit, named there: this script
is how a refactor shows it has none.

Exit 0 when every layout is identical, 1 when any differs (each one named
with the first differing step or the two hashes), 2 when a build fails.
"""
import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile

SRC = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
RUN = os.path.join(SRC, "scripts", "loomrun")

# (name, ranks, flags). Tiny shapes: every layout runs in seconds on 2 cores.
# "@tiny4" is a GPT-2 config.json written next to the data: tiny's shape
# with 4 blocks, for the schedules that need more blocks than tiny's 2.
TINY4 = {"model_type": "gpt2", "n_layer": 4, "n_head": 4, "n_embd": 64, "vocab_size": 256,
         "n_positions": 128}
BASE = ["--model", "tiny", "--steps", "4", "--batch", "8", "--seq", "32", "--lr", "1e-3",
        "--threads", "1", "--no-progress", "--quiet"]
MOE = ["--model", "tiny-moe", "--steps", "4", "--batch", "8", "--seq", "32", "--lr", "1e-3",
       "--threads", "1", "--no-progress", "--quiet"]
LAYOUTS = [
    ("one", 1, BASE),
    ("dp2", 2, BASE + ["--dp", "2"]),
    ("dp2-zero1", 2, BASE + ["--dp", "2", "--zero", "1"]),
    ("dp2-zero2", 2, BASE + ["--dp", "2", "--zero", "2"]),
    ("dp2-zero3", 2, BASE + ["--dp", "2", "--zero", "3"]),
    ("dp2-accum2", 2, BASE + ["--dp", "2", "--grad-accum", "2"]),
    ("tp2", 2, BASE + ["--tp", "2"]),
    ("tp2-sp", 2, BASE + ["--tp", "2", "--sp"]),
    ("pp2-gpipe", 2, BASE + ["--pp", "2", "--schedule", "gpipe", "--micro-batches", "4"]),
    ("pp2-1f1b", 2, BASE + ["--pp", "2", "--schedule", "1f1b", "--micro-batches", "4"]),
    ("pp2-interleaved", 2, ["--model", "@tiny4"] + BASE[2:] + ["--pp", "2", "--schedule", "interleaved",
                                                               "--virtual-stages", "2", "--micro-batches", "4"]),
    ("pp2-zb", 2, BASE + ["--pp", "2", "--schedule", "zb", "--micro-batches", "4"]),
    ("cp2-ring", 2, BASE + ["--cp", "2"]),
    ("cp2-ulysses", 2, BASE + ["--cp", "2", "--cp-impl", "ulysses"]),
    ("moe-one", 1, MOE),
    ("moe-ep2", 2, MOE + ["--dp", "2", "--ep", "2"]),
    ("moe-ep2-zero1", 2, MOE + ["--dp", "2", "--ep", "2", "--zero", "1"]),
    ("moe-tp2", 2, MOE + ["--tp", "2"]),
    ("bf16", 1, BASE + ["--precision", "bf16"]),
    ("bf16-dp2-comm", 2, BASE + ["--dp", "2", "--precision", "bf16", "--comm-precision", "bf16"]),
    ("recompute-selective", 1, BASE + ["--recompute", "selective"]),
    ("recompute-full-tp2", 2, BASE + ["--tp", "2", "--recompute", "full"]),
    ("dp2-tp2-pp2", 8, BASE + ["--dp", "2", "--tp", "2", "--pp", "2", "--micro-batches", "2"]),
    ("dp2-cp2-zero3", 4, BASE + ["--dp", "2", "--cp", "2", "--zero", "3"]),
]


def sh(cmd, **kw):
    return subprocess.run(cmd, check=True, **kw)


def build_base(rev):
    sha = subprocess.check_output(["git", "-C", SRC, "rev-parse", rev], text=True).strip()
    root = os.path.join(SRC, "build-base")
    src, bld = os.path.join(root, "src-" + sha[:12]), os.path.join(root, sha[:12])
    binary = os.path.join(bld, "loom")
    if os.path.exists(binary):
        return sha, binary
    os.makedirs(root, exist_ok=True)
    if not os.path.isdir(src):
        sh(["git", "-C", SRC, "worktree", "add", "--detach", "-f", src, sha], stdout=subprocess.DEVNULL)
    print("building %s into %s" % (sha[:12], bld), flush=True)
    sh(["cmake", "-S", src, "-B", bld, "-DCMAKE_BUILD_TYPE=Release", "-DLOOM_CUDA=OFF",
        "-DLOOM_TESTS=OFF"], stdout=subprocess.DEVNULL)
    sh(["cmake", "--build", bld, "-j%d" % os.cpu_count(), "--target", "loom"], stdout=subprocess.DEVNULL)
    return sha, binary


def run_one(binary, ranks, flags, data, out):
    flags = [os.path.join(os.path.dirname(data), "tiny4.json") if f == "@tiny4" else f for f in flags]
    metrics, params = os.path.join(out, "m.jsonl"), os.path.join(out, "p.st")
    cmd = ([RUN, "-np", str(ranks)] if ranks > 1 else []) + [binary, "train"] + flags + [
        "--data", data, "--metrics", metrics, "--save-params", params]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        lines = (p.stderr + p.stdout).splitlines()
        why = [l for l in lines if "error" in l] or lines[-3:]
        return None, "exit %d: %s" % (p.returncode, " / ".join(why)[:400])
    with open(metrics) as f:
        rows = [json.loads(line) for line in f if line.strip().startswith("{")]
    losses = [(r.get("loss"), r.get("grad_norm")) for r in rows if "loss" in r]
    with open(params, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    return (losses, digest), None


def compare(name, a, b):
    (la, ha), (lb, hb) = a, b
    if len(la) != len(lb):
        return "%d vs %d steps logged" % (len(lb), len(la))
    for i, (x, y) in enumerate(zip(la, lb)):
        if repr(x) != repr(y):
            return "step %d: loss, grad norm %r (new) vs %r (base)" % (i + 1, y, x)
    if ha != hb:
        return "parameters differ: %s (new) vs %s (base)" % (hb[:16], ha[:16])
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default="HEAD", help="commit to compare with (default HEAD)")
    ap.add_argument("--new", default=os.path.join(SRC, "build", "loom"), help="this tree's binary")
    ap.add_argument("--no-build", action="store_true", help="do not run `make build` first")
    ap.add_argument("--only", default="", help="comma-separated layout names")
    ap.add_argument("--list", action="store_true", help="print the layouts and exit")
    ap.add_argument("--keep", action="store_true", help="keep the run folders")
    a = ap.parse_args()
    if a.list:
        for name, ranks, flags in LAYOUTS:
            print("%-22s %d rank(s)  %s" % (name, ranks, " ".join(flags)))
        return 0
    layouts = LAYOUTS
    if a.only:
        want = set(a.only.split(","))
        unknown = want - {n for n, _, _ in LAYOUTS}
        if unknown:
            print("same_as_before: unknown layout(s): %s (see --list)" % ", ".join(sorted(unknown)))
            return 2
        layouts = [l for l in LAYOUTS if l[0] in want]
    try:
        if not a.no_build:
            sh(["make", "-C", SRC, "build"], stdout=subprocess.DEVNULL)
        sha, base = build_base(a.base)
    except subprocess.CalledProcessError as e:
        print("same_as_before: build failed: %s" % e)
        return 2
    tmp = tempfile.mkdtemp(prefix="loom-same-")
    data = os.path.join(tmp, "train.bin")
    with open(os.path.join(tmp, "tiny4.json"), "w") as f:
        json.dump(TINY4, f)
    sh([a.new, "data", "--input", "/usr/share/common-licenses/GPL-3", "--out", data, "--val", ""],
       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    bad = 0
    print("base %s (%s) vs new %s" % (sha[:12], base, a.new), flush=True)
    for name, ranks, flags in layouts:
        res = {}
        for side, binary in (("base", base), ("new", a.new)):
            out = os.path.join(tmp, name, side)
            os.makedirs(out)
            res[side], err = run_one(binary, ranks, flags, data, out)
            if err:
                res[side] = None
                print("%-22s %s FAILED: %s" % (name, side, err), flush=True)
        if res["base"] is None or res["new"] is None:
            bad += 1
            continue
        why = compare(name, res["base"], res["new"])
        bad += why is not None
        print("%-22s %s" % (name, "identical (%d losses, params %s)" % (len(res["new"][0]), res["new"][1][:12])
                                  if why is None else "DIFFERS: " + why), flush=True)
    if not a.keep:
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        print("runs kept in " + tmp)
    print("%d of %d layouts identical" % (len(layouts) - bad, len(layouts)))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
