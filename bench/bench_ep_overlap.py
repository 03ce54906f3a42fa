#!/usr/bin/python3
"""The expert all-to-all hidden behind the local experts: mini-moe (4 layers,
d_model 256, 8 experts, top-2) at dp 2 x ep 2 on 2 ranks of this machine,
with the overlapped dispatch on (loom's default) and off (LOOM_EP_OVERLAP=0:
one blocking dispatch, then the experts).

usage: bench/bench_ep_overlap.py [--loom build/loom] [--steps N] [--batch B]
                                 [--seq T] [--repeat R] [--json FILE]

The instrument is outside loom: bench/probes/mpi_exposed.c, a PMPI shim
(LD_PRELOAD, built here with mpicc) that sums the wall time the compute
thread (the thread that initialised MPI) spends inside the expert exchange's
MPI calls - MPI_Alltoall (the row counts), MPI_Alltoallv (blocking rows),
MPI_Ialltoallv and every MPI_Wait / MPI_Test on a request it returned (so
polling counts as exposed). The communicator's watch thread, which drives
MPI's progress while a request flies, is not counted. Per run: that time
per step (every step makes the same calls), the median over the steps
after the first 2 (the first ones also wait for the slower rank's
start-up), the mean over the two ranks ("exposed a2a ms/step"); next to it loom's own step time (median after the
first 2 steps) and the JSONL's a2a_overlapped (which path ran). Each mode
runs --repeat R times (default 3), interleaved; printed are the median and
the range over the runs, and hidden = 1 - exposed(on) / exposed(off) of the
medians.

Exit 0 if every run ran and each mode took its path, 1 otherwise.
"""
import argparse
import glob
import json
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import LOOM_RUN, ROOT, TEXT, WARMUP, BenchError, cpu_model, median_after_warmup, run  # noqa: E402

PROBE = os.path.join(ROOT, "bench", "probes", "mpi_exposed.c")


def one_run(a, tmp, base, env, mode, rep):
    out = os.path.join(tmp, "exp-%s-%d" % (mode, rep))
    metrics = os.path.join(tmp, "m-%s-%d.jsonl" % (mode, rep))
    e = dict(env, LD_PRELOAD=os.path.join(tmp, "mpi_exposed.so"), MPI_EXPOSED_OUT=out, LOOM_EP_OVERLAP=mode)
    run([LOOM_RUN, "-np", 2, a.loom, "train"] + base + ["--metrics", metrics], e,
        "loom train (LOOM_EP_OVERLAP=%s)" % mode)
    ranks = [json.load(open(p)) for p in sorted(glob.glob(out + ".*"))]
    if len(ranks) != 2:
        raise BenchError("the probe wrote %d rank files, expected 2 (was it preloaded?)" % len(ranks))
    with open(metrics) as f:
        steps = [r for r in (json.loads(line) for line in f if line.strip()) if "step" in r]
    if len(steps) != a.steps:
        raise BenchError("%d steps logged, expected %d" % (len(steps), a.steps))
    ov = sum(b["a2a_overlapped"] for m in steps for b in m["moe"])
    if (ov > 0) != (mode == "1"):
        raise BenchError("LOOM_EP_OVERLAP=%s: %d dispatches overlapped" % (mode, ov))
    # every step makes the same exchange calls: per step their sum, the
    # median over the steps after the first WARMUP (start-up: the first
    # exchange waits for the slower rank's set-up; a rank descheduled for
    # seconds on a loaded machine moves the median little)
    exposed = []
    for r in ranks:
        per, left = divmod(r["a2a_calls"], a.steps)
        if left or per == 0:
            raise BenchError("rank %d: %d exchange calls over %d steps" % (r["rank"], r["a2a_calls"], a.steps))
        calls = r["a2a_call_s"]
        exposed.append(median_after_warmup([sum(calls[i * per:(i + 1) * per]) for i in range(a.steps)]))
    return {"exposed_ms": 1e3 * statistics.mean(exposed),
            "a2a_calls": statistics.mean(r["a2a_calls"] for r in ranks) / a.steps,
            "other_mpi_ms": 1e3 * statistics.mean(r["other_s"] for r in ranks) / a.steps,
            "step_ms": median_after_warmup([m["step_ms"] for m in steps]), "overlapped": ov}


def summary(xs):
    return statistics.median(xs), min(xs), max(xs)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--loom", default=os.environ.get("LOOM", os.path.join(ROOT, "build", "loom")))
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json")
    a = ap.parse_args()
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    res = {"cpu": cpu_model(), "cores": os.cpu_count(), "steps": a.steps, "batch": a.batch, "seq": a.seq,
           "runs": {"1": [], "0": []}}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            run(["mpicc", "-O2", "-shared", "-fPIC", "-o", os.path.join(tmp, "mpi_exposed.so"), PROBE], env,
                "building the PMPI probe")
            data = os.path.join(tmp, "train.bin")
            run([a.loom, "data", "--input", TEXT, "--out", data, "--val", ""], env, "loom data")
            base = ["--model", "mini-moe", "--data", data, "--steps", a.steps, "--batch", a.batch, "--seq",
                    a.seq, "--dp", 2, "--ep", 2, "--threads", 1, "--seed", 1, "--peak-flops", "1e11",
                    "--no-progress", "--quiet"]
            for rep in range(a.repeat):
                for mode in ("1", "0"):
                    r = one_run(a, tmp, base, env, mode, rep)
                    res["runs"][mode].append(r)
                    print("run %d overlap %s: exposed a2a %.2f ms/step (%.0f calls), other MPI %.2f ms/step, "
                          "step %.1f ms, %d dispatches overlapped" % (rep + 1, "on " if mode == "1" else "off",
                          r["exposed_ms"], r["a2a_calls"], r["other_mpi_ms"], r["step_ms"], r["overlapped"]))
    except BenchError as e:
        print("bench_ep_overlap: %s" % e, file=sys.stderr)
        return 1
    print("mini-moe dp 2 x ep 2, %d steps of %d x %d tokens, %s, %s cores, %d runs each:" % (
        a.steps, a.batch, a.seq, res["cpu"], res["cores"], a.repeat))
    med = {}
    for mode, name in (("1", "overlap on "), ("0", "overlap off")):
        rs = res["runs"][mode]
        ex, st = summary([r["exposed_ms"] for r in rs]), summary([r["step_ms"] for r in rs])
        med[mode] = ex[0]
        res[mode] = {"exposed_ms": ex, "step_ms": st}
        print("  %s: exposed a2a %.2f ms/step (range %.2f-%.2f), step %.1f ms (range %.1f-%.1f)" % (
            name, ex[0], ex[1], ex[2], st[0], st[1], st[2]))
    res["hidden"] = 1 - med["1"] / med["0"] if med["0"] > 0 else 0.0
    print("  hidden: %.1f%% of the exposed expert all-to-all time (1 - on / off, medians)" % (100 * res["hidden"]))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
