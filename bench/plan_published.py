#!/usr/bin/env python3
"""loom plan against published training runs (bench/plan_runs.py): for every
row, `loom plan --layout ... --json` predicts the run on its system (a
plan/clusters/ preset with what the source says of the network), with what
its stack did as flags; prints each row's predicted and published
throughput (tokens/s/GPU) and error, and for the calibration and the
held-out parts apart: rows predicted, rows rejected (a run that happened
and the planner says cannot), median and 90th percentile |error|, memory
against published peaks, and the rank agreement (groups of rows that
compare layouts or schedules of one model on one cluster: is the planner's
fastest the measured fastest?).

Targets (issue 34), on the held-out part: median |error| <= 15 %, p90 <=
30 %, no run rejected, memory within 15 % of published peaks; rank agreement
>= 80 % of the groups.

An older loom (--loom) that lacks a flag or layout key of a row sees the
nearest thing it has (a kernel other than the materialised scores becomes
--flash-attention, fp8 becomes bf16, op-level and alternate-layer recompute
become selective and full; others are left out), so a base binary's numbers
can be printed for the same table.

usage: bench/plan_published.py [--loom build/loom] [--part cal|held|all]
                               [--match TEXT] [--rows] [--json FILE]
                               [--base OLD/build/loom]  (before/after table)
"""
import argparse
import copy
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import plan_runs  # noqa: E402

CLUSTERS = os.path.join(SRC, "plan", "clusters")


def capabilities(loom):
    """What this loom's `plan` understands (older binaries lack the newer flags)."""
    p = subprocess.run([loom, "plan", "--help"], capture_output=True, text=True)
    h = p.stdout + p.stderr
    return {"attention": "--attention" in h, "grad_reduce": "--grad-reduce" in h, "dropout": "--dropout" in h,
            "fused": "--fused" in h, "elementwise": "--elementwise" in h, "logits": "--logits" in h, "fp8": "fp8" in h, "async_tp": "async_tp" in h, "op": "recompute=op" in h, "fp8_params": "--fp8-params" in h,
            "zero3_live": "--zero3-live" in h, "zero3_per_param": "--zero3-per-param" in h}


def layout_for(layout, caps):
    parts = []
    for kv in layout.split(","):
        k, _, v = kv.partition("=")
        if k == "async_tp" and not caps["async_tp"]:
            continue
        if k == "recompute" and not caps["op"]:
            v = {"op": "selective", "layer2": "full"}.get(v, v)
        parts.append("%s=%s" % (k, v) if v else k)
    return ",".join(parts)


def stack_flags(stack, prec, caps):
    f = []
    att = stack.get("attention", "materialized")
    if caps["attention"]:
        f += ["--attention", att]
    elif att != "materialized":
        f += ["--flash-attention"]
    if stack.get("no_dp_overlap"):
        f += ["--no-dp-overlap"]
    if caps["grad_reduce"] and stack.get("grad_reduce"):
        f += ["--grad-reduce", stack["grad_reduce"]]
    if caps["logits"] and stack.get("logits"):
        f += ["--logits", stack["logits"]]
    if caps["dropout"] and stack.get("dropout"):
        f += ["--dropout"]
    if caps["fused"] and stack.get("fused"):
        f += ["--fused"]
    elif caps["elementwise"] and stack.get("elementwise"):
        f += ["--elementwise", stack["elementwise"]]
    f += ["--precision", prec if (prec != "fp8" or caps["fp8"]) else "bf16"]
    if caps["fp8_params"] and stack.get("fp8_params") and prec == "fp8" and caps["fp8"]:
        f += ["--fp8-params"]
    if caps["zero3_live"] and stack.get("zero3_live"):
        f += ["--zero3-live", "%g" % stack["zero3_live"]]
    if caps["zero3_per_param"] and stack.get("zero3_per_param"):
        f += ["--zero3-per-param"]
    return f


def system_file(tmp, name, gpus):
    """The row's system as a cluster file: the preset, the source's network
    overrides, enough nodes for the run."""
    preset, over = plan_runs.SYSTEMS[name]
    with open(os.path.join(CLUSTERS, preset + ".json")) as f:
        c = json.load(f)
    c = copy.deepcopy(c)
    for k, v in over.items():
        c.setdefault(k, {}).update(v) if isinstance(v, dict) else c.__setitem__(k, v)
    inter = c.get("inter_node", {})
    if "nics_per_node" in inter:  # the per-device share older binaries read
        inter["bandwidth_gbps"] = inter["nics_per_node"] * inter["nic_gbps"] / c["gpus_per_node"]
    c["nodes"] = max(1, -(-gpus // c["gpus_per_node"]))
    path = os.path.join(tmp, "%s-%d.json" % (name, c["nodes"]))
    if not os.path.exists(path):
        with open(path, "w") as f:
            json.dump(c, f)
    return path


def model_file(tmp, key):
    path = os.path.join(tmp, "model-%s.json" % key)
    if not os.path.exists(path):
        with open(path, "w") as f:
            json.dump(plan_runs.MODELS[key], f)
    return path


def plan(loom, cmd):
    p = subprocess.run([loom, "plan"] + cmd + ["--json"], capture_output=True, text=True)
    try:
        return json.loads(p.stdout)
    except json.JSONDecodeError:
        return {"feasible": False, "reason": "loom plan failed: %s" % (p.stderr.strip() or p.stdout.strip())[:200]}


def predict(loom, caps, tmp, row):
    base = ["--model", model_file(tmp, row["model"]), "--cluster", system_file(tmp, row["system"], row["gpus"]),
            "--gpus", str(row["gpus"]), "--batch", str(row["batch"]), "--seq", str(row["seq"])]
    base += stack_flags(row["stack"], row["prec"], caps)
    best = None
    for suffix in row.get("choose") or [""]:
        lay = layout_for(row["layout"] + ("," + suffix if suffix else ""), caps)
        r = plan(loom, base + ["--layout", lay])
        if best is None or (r.get("feasible") and (not best.get("feasible") or
                                                   r["time_s"]["step"] < best["time_s"]["step"])):
            best = r
    return best


def pct(xs, q):
    """The q-quantile (0..1) by linear interpolation between order statistics."""
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * q
    lo, hi = int(math.floor(k)), int(math.ceil(k))
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def summarise(name, rows):
    ok = [r for r in rows if r["pred"] is not None]
    rej = [r for r in rows if r["pred"] is None]
    errs = [abs(r["err"]) for r in ok]
    signed = [r["err"] for r in ok]
    mems = [abs(r["mem_err"]) for r in ok if r.get("mem_err") is not None]
    print("\n%s: %d runs, %d predicted, %d rejected" % (name, len(rows), len(ok), len(rej)))
    if errs:
        print("  |throughput error|: median %.1f%%, p90 %.1f%%, worst %.1f%%; signed median %+.1f%%, "
              "%d of %d predicted too fast" % (100 * statistics.median(errs), 100 * pct(errs, 0.9), 100 * max(errs),
                                               100 * statistics.median(signed), sum(e > 0 for e in signed),
                                               len(signed)))
    if mems:
        print("  memory vs published peak: %d rows, median |error| %.1f%%, worst %.1f%%, %d within 15%%" %
              (len(mems), 100 * statistics.median(mems), 100 * max(mems), sum(m <= 0.15 for m in mems)))
    fam = {}
    for r in ok:
        fam.setdefault((r["family"], r["gpu"]), []).append(abs(r["err"]))
    for k in sorted(fam):
        e = fam[k]
        print("    %-10s %-10s %3d: median %5.1f%%, p90 %5.1f%%" % (k[0], k[1], len(e), 100 * statistics.median(e),
                                                                  100 * pct(e, 0.9)))
    for r in rej:
        print("  rejected: %s: %s" % (r["id"], r["reason"][:160]))


def rank_agreement(name, rows):
    groups = {}
    for r in rows:
        if r.get("group"):
            groups.setdefault(r["group"], []).append(r)
    agree, total, lines = 0, 0, []
    for g, rs in sorted(groups.items()):
        if len(rs) < 2:
            continue
        total += 1
        best_pub = max(rs, key=lambda r: r["tps"])
        feas = [r for r in rs if r["pred"] is not None]
        best_pred = max(feas, key=lambda r: r["pred"]) if feas else None
        hit = best_pred is best_pub
        agree += hit
        lines.append("    %-32s measured best %-30s planner's %-30s %s" % (
            g, best_pub["id"][-30:], best_pred["id"][-30:] if best_pred else "(none feasible)",
            "agree" if hit else "DISAGREE"))
    if total:
        print("\n%s rank agreement: %d of %d groups (%.0f%%)" % (name, agree, total, 100.0 * agree / total))
        for line in lines:
            print(line)
    return agree, total


def predict_all(loom, runs):
    """Every row predicted by this loom: the row plus pred, err, mem_err, reason."""
    caps = capabilities(loom)
    out = []
    with tempfile.TemporaryDirectory(prefix="loom-published-") as tmp:
        for row in runs:
            r = predict(loom, caps, tmp, row)
            d = dict(row, gpu=plan_runs.SYSTEMS[row["system"]][0], pred=None, err=None, mem_err=None,
                     reason=r.get("reason", ""), layout_used=r.get("layout", ""))
            if r.get("feasible"):
                d["pred"] = r["tokens_per_s_per_device"]
                d["err"] = d["pred"] / row["tps"] - 1
                d["mfu"] = r.get("mfu")
                d["mem_pred"] = r["memory_bytes"]["total"] / 1e9
                d["mem_alloc"] = (r["memory_bytes"]["total"] - r["memory_bytes"].get("runtime", 0)) / 1e9
                d["time_s"] = r["time_s"]
                if row.get("mem"):
                    d["mem_err"] = d["mem_alloc"] / row["mem"] - 1
            out.append(d)
    return out


def stats(rows):
    ok = [r for r in rows if r["pred"] is not None]
    errs = [abs(r["err"]) for r in ok]
    mems = [abs(r["mem_err"]) for r in ok if r.get("mem_err") is not None]
    med = lambda xs: 100 * statistics.median(xs) if xs else float("nan")  # noqa: E731
    return (len(rows), len(rows) - len(ok), med(errs), 100 * pct(errs, 0.9) if errs else float("nan"),
            med(mems), len(mems))


def compare(base, before, loom, after):
    """Before (base binary) and after (this one), on the same rows and cluster files."""
    print("\nbefore: %s\nafter:  %s" % (base, loom))
    print("%-22s %5s | %8s %8s %8s %9s | %8s %8s %8s %9s" % ("part", "rows", "rejected", "median", "p90",
                                                              "mem med", "rejected", "median", "p90", "mem med"))
    keys = [("cal", None), ("held", None)] + sorted({("held", (d["family"], d["gpu"])) for d in after})
    for part, fam in keys:
        pick = lambda xs: [d for d in xs if d["part"] == part and (fam is None or (d["family"], d["gpu"]) == fam)]  # noqa
        b, n = stats(pick(before)), stats(pick(after))
        name = part if fam is None else "  %s %s" % fam
        print("%-22s %5d | %8d %7.1f%% %7.1f%% %8.1f%% | %8d %7.1f%% %7.1f%% %8.1f%%" % (
            name, n[0], b[1], b[2], b[3], b[4], n[1], n[2], n[3], n[4]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--loom", default=os.environ.get("LOOM", os.path.join(SRC, "build", "loom")))
    ap.add_argument("--part", default="all", choices=["cal", "held", "all"])
    ap.add_argument("--match", default="", help="only rows whose id contains this")
    ap.add_argument("--rows", action="store_true", help="print every row")
    ap.add_argument("--json", default="", help="write the rows with predictions to this file")
    ap.add_argument("--base", default="", help="also predict with this loom and print before/after")
    a = ap.parse_args()
    runs = [r for r in plan_runs.RUNS if (a.part == "all" or r["part"] == a.part) and a.match in r["id"]]
    out = predict_all(a.loom, runs)
    print("loom plan vs published runs: %s, %d rows" % (a.loom, len(out)))
    if a.rows:
        print("%-44s %-5s %-9s %10s %10s %8s %8s  %s" % ("run", "part", "gpu", "published", "predicted", "error",
                                                         "mem", "layout"))
        for d in out:
            mem = "%+.0f%%" % (100 * d["mem_err"]) if d["mem_err"] is not None else ""
            if d["pred"] is None:
                print("%-44s %-5s %-9s %10.1f %10s %8s %8s  rejected: %s" % (d["id"], d["part"], d["gpu"], d["tps"],
                                                                          "-", "-", mem, d["reason"][:120]))
            else:
                print("%-44s %-5s %-9s %10.1f %10.1f %+7.1f%% %8s  %s" % (d["id"], d["part"], d["gpu"], d["tps"],
                                                                        d["pred"], 100 * d["err"], mem,
                                                                        d["layout_used"]))
    for part, name in (("cal", "calibration part"), ("held", "held-out part")):
        rows = [d for d in out if d["part"] == part]
        if rows:
            summarise(name, rows)
            rank_agreement(name, rows)
    if a.part == "all":
        rank_agreement("all rows", out)
    print("\nsources:")
    for k, v in plan_runs.SOURCES.items():
        print("  %-9s %s" % (k, v))
    if a.base:
        compare(a.base, predict_all(a.base, runs), a.loom, out)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
