#!/usr/bin/python3
"""Placement, DP's all-reduce and the planner's predictions across hosts: dp=2 x tp=2 on 2 emulated
hosts (scripts/cluster, docs/cluster.md), 2 ranks a host, launched with `mpirun --map-by node`
(the launcher alternates hosts: ranks 0 and 2 on host 0), for each link rate:

  tp in host (default)   loom numbers the ranks host by host (its default),
                         no --mesh-order: TP inside a host, DP across
  order tp,cp,dp,pp      the same with --mesh-order tp,cp,dp,pp given
  order dp,tp,cp,pp      placed by host, --mesh-order dp,tp,cp,pp: DP inside
                         a host, TP across (the other order that places a
                         group differently; the best order is the faster of
                         these two)
  tp across (naive)      LOOM_PLACEMENT=launcher: the launcher's numbering,
                         so the TP pairs (0,1), (2,3) span the hosts
and dp=4 (2 ranks a host, placed by host) with DP's gradient all-reduce
  dp=4 flat all-reduce   Open MPI's (LOOM_DP_ALLREDUCE=flat, the default)
  dp=4 hier all-reduce   reduce-scatter in a host, all-reduce across,
                         all-gather in a host (LOOM_DP_ALLREDUCE=hier)

Before the rows of a link, `loom calibrate --out` under the same 4 ranks
measures the cluster (hosts, ranks a host, the links inside and between
hosts, GEMM rates); `loom plan --layout` with that file predicts each row's
step time (the planner has one DP all-reduce model: both dp=4 rows get the
same prediction).

Each row runs RUNS times (default 3), the rows of a link interleaved run by
run; a run's step time is the median of rank 0's "step_ms" (loom's
--metrics) after the first WARMUP steps, and the row reports the median and
the range (min..max) over runs, plus the bytes that crossed host 0's link
per step (the kernel's counters on its eth0, not loom's). The model is
chosen so TP moves more bytes than DP (default: 2 layers, d_model 128, 4
heads, seq 64, batch 32: TP ~8 MB and DP ~1.7 MB a step on each rank).
The summary checks: default within 10 % of the best order; naive >= 1.5x
the default at the slowest link; each prediction within 20 %; the
predicted order of the dp=2 x tp=2 rows the measured one.

usage: bench/bench_cluster.py [--loom build/loom] [--links 100mbit,1gbit]
                              [--runs 3] [--steps 8] [--json FILE]
Needs root (it runs `scripts/cluster up 2 --link RATE` and `down` itself).
Exit 0 if every row ran, 1 otherwise (the checks are reported, not the exit code).
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
ROWS = [  # (label, extra mpirun args, extra loom flags, planner layout); ratios are to the first row of a group
    ("tp in host (default)", ["-x", "LOOM_PLACEMENT=host"], ["--dp", 2, "--tp", 2], "dp=2,tp=2,order=tp.cp.dp.pp"),
    ("order tp,cp,dp,pp", ["-x", "LOOM_PLACEMENT=host"], ["--dp", 2, "--tp", 2, "--mesh-order", "tp,cp,dp,pp"],
     "dp=2,tp=2,order=tp.cp.dp.pp"),
    ("order dp,tp,cp,pp", ["-x", "LOOM_PLACEMENT=host"], ["--dp", 2, "--tp", 2, "--mesh-order", "dp,tp,cp,pp"],
     "dp=2,tp=2,order=dp.tp.cp.pp"),
    ("tp across (naive)", ["-x", "LOOM_PLACEMENT=launcher"], ["--dp", 2, "--tp", 2], "dp=2,tp=2,order=dp.tp.cp.pp"),
    ("dp=4 flat all-reduce", ["-x", "LOOM_DP_ALLREDUCE=flat"], ["--dp", 4], "dp=4"),
    ("dp=4 hier all-reduce", ["-x", "LOOM_DP_ALLREDUCE=hier"], ["--dp", 4], "dp=4"),
]
GROUPS = [(0, 4), (4, 6)]  # rows compared with each other


def predict(a, model, cluster_file, layout):
    """loom plan's step time (s) for this layout on the measured cluster."""
    p = run([a.loom, "plan", "--model", model, "--cluster", cluster_file, "--gpus", 4, "--batch", a.batch,
             "--seq", a.seq, "--precision", "fp32", "--layout", layout, "--json"], what="loom plan")
    return json.loads(p.stdout)["time_s"]["step"]


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
        steps = [m for m in (json.loads(line) for line in f if line.strip()) if "step_ms" in m]  # no header
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
                cfile = os.path.join(tmp, "cluster-%s.json" % link)
                run([CLUSTER, "run", "-np", 4, "--map-by", "node", a.loom, "calibrate", "--out", cfile, "--quiet"],
                    what="loom calibrate")
                with open(cfile) as f:
                    out.setdefault("clusters", {})[link] = json.load(f)
                res = [([], []) for _ in ROWS]
                cmds = [None] * len(ROWS)
                for k in range(a.runs):  # interleaved: a disturbance hits every row alike
                    for i, (label, mpi_extra, flags, _) in enumerate(ROWS):
                        ms, b, cmds[i] = one_run(a, base, mpi_extra, flags, os.path.join(tmp, "m.jsonl"))
                        res[i][0].append(ms)
                        res[i][1].append(b)
                for i, (label, _, _, layout) in enumerate(ROWS):
                    times, crossed = res[i]
                    pred = 1e3 * predict(a, model, cfile, layout)
                    row = {"link": link, "row": label, "step_ms_median": statistics.median(times),
                           "step_ms_min": min(times), "step_ms_max": max(times), "step_ms_runs": times,
                           "link_bytes_per_step": statistics.median(crossed), "cmd": cmds[i],
                           "plan_layout": layout, "plan_step_ms": pred}
                    row["plan_error"] = pred / row["step_ms_median"] - 1
                    out["rows"].append(row)
                    print("%-8s %-22s step %8.1f ms (range %.1f..%.1f over %d runs)  %6.2f MB/step over host 0's "
                          "link; plan %.1f ms (%+.0f%%)" % (link, label, row["step_ms_median"], row["step_ms_min"],
                                                            row["step_ms_max"], a.runs,
                                                            row["link_bytes_per_step"] / 1e6, pred,
                                                            100 * row["plan_error"]), flush=True)
                rows = out["rows"][-len(ROWS):]
                for lo, hi in GROUPS:
                    for r in rows[lo + 1:hi]:
                        r["vs_first"] = r["step_ms_median"] / rows[lo]["step_ms_median"]
                        print("%-8s %-22s %.2fx the step time of '%s'" % (link, r["row"], r["vs_first"],
                                                                        rows[lo]["row"]))
                best = min(rows[1:3], key=lambda r: r["step_ms_median"])
                c = {"link": link, "default_vs_best_order": rows[0]["step_ms_median"] / best["step_ms_median"],
                     "best_order": best["row"], "naive_vs_default": rows[3]["vs_first"],
                     "hier_vs_flat": rows[5]["vs_first"],
                     "plan_within_20pct": all(abs(r["plan_error"]) <= 0.2 for r in rows),
                     "plan_orders_as_measured":
                         sorted(rows[:4], key=lambda r: r["step_ms_median"])[0]["plan_layout"] ==
                         sorted(rows[:4], key=lambda r: r["plan_step_ms"])[0]["plan_layout"] and
                         (rows[0]["plan_step_ms"] < rows[3]["plan_step_ms"]) ==
                         (rows[0]["step_ms_median"] < rows[3]["step_ms_median"])}
                out.setdefault("checks", []).append(c)
                print("%-8s default / best order (%s) %.2f (within 10%%: %s); naive / default %.2fx; hier / flat "
                      "%.2f; plan within 20%% on every row: %s; plan orders the layouts as measured: %s" % (
                          link, c["best_order"], c["default_vs_best_order"], c["default_vs_best_order"] <= 1.1,
                          c["naive_vs_default"], c["hier_vs_flat"], c["plan_within_20pct"],
                          c["plan_orders_as_measured"]), flush=True)
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
