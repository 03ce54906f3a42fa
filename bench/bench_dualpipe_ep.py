#!/usr/bin/python3
"""DualPipeV beside 1F1B on a MoE model at pp 2 x ep 2 (dp 2: 4 ranks), side by
side: the measured bubble against loom sim's prediction made before the run,
and the fraction of the expert all-to-all's time in flight that the compute
thread spent outside the exchange's MPI calls (hidden).

usage: bench/bench_dualpipe_ep.py [--loom build/loom] [--steps N] [--runs R]
                                  [--micro-batches M] [--batch B] [--seq T]
                                  [--schedules 1f1b,dualpipev] [--json FILE]

Model: 4 layers, d_model 128, 4 heads, vocab 256 (byte level), 4 experts of
width 256, top-2 dropless; seq 64, global batch 16, 4 micro-batches per DP
rank; one thread per rank (OMP_NUM_THREADS=1, --threads 1), 4 ranks:

  scripts/loomrun -np 4 loom train --dp 2 --pp 2 --ep 2 --schedule S \\
      --micro-batches 4 [--virtual-stages 2] --metrics FILE ...

Prediction: right before each measured run, a zb calibration run with
--trace, read by `loom sim --from-trace` (per-stage F, B, W and message
latency); then, still before the measured run, `loom sim` of that schedule
at the mean stage's F, B, W (halved per chunk for dualpipev's two chunks),
the run's split of the blocks, and the LM head's extra cost on the last
stage as loom's partitioner weighs it (2 V C / (24 C^2 + 4 T C) blocks).
Measured: the JSONL's pp_bubble, computed per step from each pipeline
rank's own F/B/W time against the longest rank span (1 - busy / (pp x
span)), median over the steps after the first 2. On a machine shared with
other jobs a rank descheduled inside an action counts as busy and its
peers' wait as idle, so load moves both the calibration and the
measurement: the load average is printed beside each run.

Hidden: bench/probes/mpi_exposed.c (a PMPI shim, LD_PRELOAD, outside loom)
times, on the compute thread, every exchange call (MPI_Alltoall of the row
counts, MPI_Alltoallv, MPI_Ialltoallv, and MPI_Wait / MPI_Test on its
requests: "exposed") and every exchange's time in flight (a blocking call's
duration, a started one's from MPI_Ialltoallv to the wait that completed it).
hidden = 1 - exposed / flight, per step summed over the exchanges, median
over the steps after the first 2, mean over the ranks.

Each schedule runs --runs R times (default 3), interleaved; printed are
every run and, per schedule, the median and range over the runs.
Exit 0 if every run ran, 1 otherwise.
"""
import argparse
import glob
import json
import os
import re
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import LOOM_RUN, ROOT, TEXT, WARMUP, BenchError, cpu_model, median_after_warmup, run  # noqa: E402
from bench_pp import sim_value  # noqa: E402

PROBE = os.path.join(ROOT, "bench", "probes", "mpi_exposed.c")
RANKS = 4
MODEL = {"n_layer": 4, "n_head": 4, "n_embd": 128, "n_positions": 64, "vocab_size": 256, "num_local_experts": 4,
         "num_experts_per_tok": 2, "moe_intermediate_size": 256}


def load():
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def hidden_of(probe_out, steps):
    """1 - exposed / flight of each rank (median over the steps after the
    warm-up), their mean, and the exposed and flight ms per step."""
    ranks = [json.load(open(p)) for p in sorted(glob.glob(probe_out + ".*"))]
    if len(ranks) != RANKS:
        raise BenchError("the probe wrote %d rank files, expected %d (was it preloaded?)" % (len(ranks), RANKS))
    hid, exp, fl = [], [], []
    for r in ranks:
        calls, flights = r["a2a_call_s"], r["a2a_flight_s"]
        if len(calls) % steps or len(flights) % steps or not flights:
            raise BenchError("rank %d: %d exchange calls and %d exchanges over %d steps"
                             % (r["rank"], len(calls), len(flights), steps))
        pc, pf = len(calls) // steps, len(flights) // steps
        e = [sum(calls[i * pc:(i + 1) * pc]) for i in range(steps)]
        f = [sum(flights[i * pf:(i + 1) * pf]) for i in range(steps)]
        hid.append(median_after_warmup([1 - x / y if y > 0 else 0 for x, y in zip(e, f)]))
        exp.append(median_after_warmup(e))
        fl.append(median_after_warmup(f))
    return statistics.mean(hid), 1e3 * statistics.mean(exp), 1e3 * statistics.mean(fl)


def calibrate(a, calib, env):
    """From the zb calibration run's traces (loom sim --from-trace): the mean
    per-stage F, B, W (ms) and the message latency."""
    out = run([a.loom, "sim", "--pp", "2", "--schedule", "zb", "--micro-batches", str(a.micro_batches),
               "--from-trace", calib], env).stdout
    rows = re.findall(r"^\s+(\d+)\s+\d+\s+\d+\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s*$", out, re.M)
    comm = re.search(r"^\s+comm ([0-9.eE+-]+) ms", out, re.M)
    if len(rows) != 2:
        raise BenchError("loom sim --from-trace printed %d stage rows, expected 2:\n%s" % (len(rows), out))
    return {k: statistics.mean(float(r[i]) for r in rows) for k, i in (("f", 1), ("b", 2), ("w", 3))} | {
        "comm": comm.group(1) if comm else "0"}


def head_blocks(seq):
    """The LM head's cost in blocks, as loom's partitioner weighs it
    (docs/pipeline.md): 2 V C / (24 C^2 + 4 T C)."""
    v, c = MODEL["vocab_size"], MODEL["n_embd"]
    return 2 * v * c / (24 * c * c + 4 * seq * c)


def predict(a, sched, env, cal):
    """loom sim's bubble for this schedule at the calibration's costs, made
    before the run: the mean stage's F, B, W (per chunk: halved for the two
    chunks of dualpipev), the stages as the run splits them, the head's
    extra cost on the last stage."""
    v = 2 if sched == "dualpipev" else 1
    split = ",".join([str(MODEL["n_layer"] // (2 * v))] * (2 * v))
    out = run([a.loom, "sim"] + sched_flags(a, sched) + [
        "--layers", str(MODEL["n_layer"]), "--stage-layers", split, "--cost-head", "%.4f" % head_blocks(a.seq),
        "--cost-f", "%.6f" % (cal["f"] / v), "--cost-b", "%.6f" % (cal["b"] / v), "--cost-w", "%.6f" % (cal["w"] / v),
        "--cost-comm", cal["comm"]], env).stdout
    return sim_value(out, "bubble")


def sched_flags(a, sched):
    f = ["--pp", "2", "--schedule", sched, "--micro-batches", str(a.micro_batches)]
    return f + (["--virtual-stages", "2"] if sched == "dualpipev" else [])


def one_run(a, tmp, base, env, sched, rep, cal):
    flags = sched_flags(a, sched)
    predicted = predict(a, sched, env, cal)  # before the run
    metrics = os.path.join(tmp, "m-%s-%d.jsonl" % (sched, rep))
    out = os.path.join(tmp, "probe-%s-%d" % (sched, rep))
    e = dict(env, LD_PRELOAD=os.path.join(tmp, "mpi_exposed.so"), MPI_EXPOSED_OUT=out)
    l0 = load()
    run([LOOM_RUN, "-np", str(RANKS), a.loom, "train"] + base + flags + ["--metrics", metrics], e,
        "loom train --schedule %s" % sched)
    l1 = load()
    with open(metrics) as f:
        steps = [r for r in (json.loads(line) for line in f if line.strip()) if "step" in r]
    if len(steps) != a.steps:
        raise BenchError("%s: %d steps logged, expected %d" % (sched, len(steps), a.steps))
    hidden, exposed, flight = hidden_of(out, a.steps)
    measured = median_after_warmup([m["pp_bubble"] for m in steps])
    return {"schedule": sched, "rep": rep, "predicted": predicted, "measured": measured,
            "diff": abs(measured - predicted) if predicted is not None else None, "hidden": hidden,
            "exposed_ms": exposed, "flight_ms": flight, "step_ms": median_after_warmup([m["step_ms"] for m in steps]),
            "load": [l0, l1], "peak_live": max(m["pp_peak_live"] for m in steps)}


def summary(xs):
    return "%.4f [%.4f, %.4f]" % (statistics.median(xs), min(xs), max(xs))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--loom", default=os.environ.get("LOOM", os.path.join(ROOT, "build", "loom")))
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--micro-batches", type=int, default=4)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--schedules", default="1f1b,dualpipev")
    ap.add_argument("--json")
    a = ap.parse_args()
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    env.setdefault("OMPI_MCA_btl_vader_single_copy_mechanism", "cma")
    rows = []
    try:
        if not os.access(a.loom, os.X_OK):
            raise BenchError("%s: not an executable loom binary (build it, or pass --loom)" % a.loom)
        with tempfile.TemporaryDirectory() as tmp:
            run(["mpicc", "-O2", "-shared", "-fPIC", "-o", os.path.join(tmp, "mpi_exposed.so"), PROBE], env,
                "building the PMPI probe")
            data = os.path.join(tmp, "train.bin")
            run([a.loom, "data", "--input", TEXT, "--out", data, "--val", ""], env, "loom data")
            model = os.path.join(tmp, "moe.json")
            with open(model, "w") as f:
                json.dump(dict(MODEL, n_positions=a.seq), f)
            base = ["--model", model, "--data", data, "--steps", str(a.steps), "--batch", str(a.batch), "--seq",
                    str(a.seq), "--dp", "2", "--ep", "2", "--threads", "1", "--seed", "1", "--peak-flops", "1e11",
                    "--no-progress", "--quiet"]
            for rep in range(a.runs):
                for sched in a.schedules.split(","):
                    # a calibration right before each run: the machine's load drifts
                    calib = os.path.join(tmp, "calib-%s-%d" % (sched, rep))
                    run([LOOM_RUN, "-np", str(RANKS), a.loom, "train"] + base + sched_flags(a, "zb")
                        + ["--trace", calib], env, "the zb calibration run")
                    cal = calibrate(a, calib, env)
                    print("calibration (zb, ms per stage): f %.3f b %.3f w %.3f, comm %s"
                          % (cal["f"], cal["b"], cal["w"], cal["comm"]), flush=True)
                    r = one_run(a, tmp, base, env, sched, rep, cal)
                    r["calibration"] = cal
                    rows.append(r)
                    print("run %d %-9s predicted %.4f measured %.4f |diff| %.4f  hidden %.1f%% (exposed %.1f of "
                          "%.1f ms/step in flight)  step %.0f ms  load %.1f -> %.1f" % (
                              rep + 1, sched, r["predicted"], r["measured"], r["diff"], 100 * r["hidden"],
                              r["exposed_ms"], r["flight_ms"], r["step_ms"], r["load"][0], r["load"][1]),
                          flush=True)
    except BenchError as e:
        print("bench_dualpipe_ep: %s" % e, file=sys.stderr)
        return 1
    print("MoE (4 layers, d 128, 4 experts top-2) at dp 2 x pp 2 x ep 2 on %d ranks, %s, %s cores; %d steps, "
          "median after %d; %d runs per schedule" % (RANKS, cpu_model(), os.cpu_count(), a.steps, WARMUP, a.runs))
    print("%-10s %-26s %-26s %-26s %-26s %s" % ("schedule", "predicted", "measured bubble", "|diff| (target 0.03)",
                                                 "hidden a2a fraction", "load avg"))
    for s in a.schedules.split(","):
        rs = [r for r in rows if r["schedule"] == s]
        print("%-10s %-26s %-26s %-26s %-26s %.1f-%.1f" % (
            s, summary([r["predicted"] for r in rs]), summary([r["measured"] for r in rs]),
            summary([r["diff"] for r in rs]), summary([r["hidden"] for r in rs]),
            min(min(r["load"]) for r in rs), max(max(r["load"]) for r in rs)))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
