#!/usr/bin/python3
"""Placement and DP's all-reduce across hosts: dp=2 x tp=2 on 2 emulated hosts (scripts/cluster,
docs/cluster.md), 2 ranks a host, launched with `mpirun --map-by node` (the
launcher alternates hosts: ranks 0 and 2 on host 0), for each link rate:

  tp in host (default)   loom numbers the ranks host by host (its default),
                         order tp,cp,dp,pp: TP inside a host, DP across
  tp across (launcher)   LOOM_PLACEMENT=launcher: the launcher's numbering,
                         so the TP pairs (0,1), (2,3) span the hosts
  tp across (order)      placed by host, --mesh-order dp,tp,cp,pp: DP inside
                         a host, TP across
and dp=4 (2 ranks a host, placed by host) with DP's gradient all-reduce
  dp=4 flat all-reduce   Open MPI's (LOOM_DP_ALLREDUCE=flat, the default)
  dp=4 hier all-reduce   reduce-scatter in a host, all-reduce across,
                         all-gather in a host (LOOM_DP_ALLREDUCE=hier)

Each row runs RUNS times (default 3); a run's step time is the median of
rank 0's "step_ms" (loom's --metrics) after the first WARMUP steps, and the
row reports the median and the range (min..max) over runs, plus the bytes
that crossed host 0's link per step (the kernel's counters on its eth0, not
loom's). The model is chosen so TP moves more bytes than DP (default: 2
layers, d_model 128, 4 heads, seq 64, batch 32: TP ~8 MB and DP ~1.7 MB a
step on each rank).

usage: bench/bench_cluster.py [--loom build/loom] [--links 100mbit,1gbit]
                              [--runs 3] [--steps 8] [--json FILE]
Needs root (it runs `scripts/cluster up 2 --link RATE` and `down` itself).
Exit 0 if every row ran, 1 otherwise.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import ROOT, TEXT, WARMUP, BenchError, cpu_model, median_after_warmup, run  # noqa: E402

CLUSTER = os.path.join(ROOT, "scripts", "cluster")
ROWS = [  # (label, extra mpirun args, extra loom flags); ratios are to the first row of a group
    ("tp in host (default)", ["-x", "LOOM_PLACEMENT=host"], ["--dp", 2, "--tp", 2]),
    ("tp across (launcher)", ["-x", "LOOM_PLACEMENT=launcher"], ["--dp", 2, "--tp", 2]),
    ("tp across (order)", ["-x", "LOOM_PLACEMENT=host"], ["--dp", 2, "--tp", 2, "--mesh-order", "dp,tp,cp,pp"]),
    ("dp=4 flat all-reduce", ["-x", "LOOM_DP_ALLREDUCE=flat"], ["--dp", 4]),
    ("dp=4 hier all-reduce", ["-x", "LOOM_DP_ALLREDUCE=hier"], ["--dp", 4]),
]
GROUPS = [(0, 3), (3, 5)]  # rows compared with each other


def link_bytes():
    p = run(["ip", "-n", "loomc-h0", "-s", "-j", "link", "show", "eth0"], what="ip link")
    st = json.loads(p.stdout)[0]["stats64"]
    return st["tx"]["bytes"] + st["rx"]["bytes"]


def one_run(a, base, mpi_extra, flags, metrics):
    before = link_bytes()
    cmd = [CLUSTER, "run", "-np", 4, "--map-by", "node"] + mpi_extra + [a.loom, "train"] + base + flags + [
        "--metrics", metrics]
    run(cmd, what="cluster run")
    crossed = link_bytes() - before
    with open(metrics) as f:
        steps = [json.loads(line) for line in f if line.strip()]
    return median_after_warmup([m["step_ms"] for m in steps]), crossed / len(steps), " ".join(map(str, cmd))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--loom", default=os.path.join(ROOT, "build", "loom"))
    ap.add_argument("--links", default="100mbit,1gbit")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--embd", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--json")
    a = ap.parse_args()
    if os.geteuid() != 0:
        print("bench_cluster: needs root (network namespaces)", file=sys.stderr)
        return 1
    if a.steps <= WARMUP:
        print("bench_cluster: --steps must exceed the %d warm-up steps" % WARMUP, file=sys.stderr)
        return 1
    out = {"cpu": cpu_model(), "cores": os.cpu_count(), "runs": a.runs, "rows": []}
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o755)
        data = os.path.join(tmp, "train.bin")
        run([a.loom, "data", "--input", TEXT, "--out", data, "--val", ""], what="loom data")
        model = os.path.join(tmp, "config.json")
        with open(model, "w") as f:
            json.dump({"n_layer": a.layers, "n_embd": a.embd, "n_head": a.heads, "vocab_size": 256,
                       "n_positions": a.seq}, f)
        base = ["--model", model, "--data", data, "--steps", a.steps, "--batch", a.batch, "--seq", a.seq,
                "--seed", 1, "--peak-flops", "1e11", "--no-progress", "--threads", 1]
        try:
            for link in a.links.split(","):
                run([CLUSTER, "up", 2, "--link", link], what="cluster up")
                for label, mpi_extra, flags in ROWS:
                    times, crossed = [], []
                    for k in range(a.runs):
                        ms, b, cmd = one_run(a, base, mpi_extra, flags, os.path.join(tmp, "m.jsonl"))
                        times.append(ms)
                        crossed.append(b)
                    row = {"link": link, "row": label, "step_ms_median": statistics.median(times),
                           "step_ms_min": min(times), "step_ms_max": max(times), "step_ms_runs": times,
                           "link_bytes_per_step": statistics.median(crossed), "cmd": cmd}
                    out["rows"].append(row)
                    print("%-8s %-22s step %8.1f ms (range %.1f..%.1f over %d runs)  %6.2f MB/step over host 0's link"
                          % (link, label, row["step_ms_median"], row["step_ms_min"], row["step_ms_max"], a.runs,
                             row["link_bytes_per_step"] / 1e6), flush=True)
                rows = out["rows"][-len(ROWS):]
                for lo, hi in GROUPS:
                    for r in rows[lo + 1:hi]:
                        r["vs_first"] = r["step_ms_median"] / rows[lo]["step_ms_median"]
                        print("%-8s %-22s %.2fx the step time of '%s'" % (link, r["row"], r["vs_first"],
                                                                        rows[lo]["row"]))
        except BenchError as e:
            print("bench_cluster: %s" % e, file=sys.stderr)
            return 1
        finally:
            subprocess.run([CLUSTER, "down"])
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
