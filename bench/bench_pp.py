#!/usr/bin/python3
"""Pipeline parallelism on 2 ranks (--pp P: P ranks): the measured bubble of
every schedule beside the simulator's prediction for the same run, and tokens/s.

usage: bench/bench_pp.py [--loom build/loom] [--steps N] [--micro-batches M]
                         [--layers L] [--embd H] [--heads A] [--seq T] [--batch B]
                         [--schedules gpipe,1f1b,interleaved,zb] [--no-cma] [--json FILE] [--keep DIR]
                         [--pp P] [--runs R] [--predict]

--runs R runs each schedule R times and adds a table of the measured
bubble's median and range per schedule, with each pipeline rank's idle time
(the JSONL's "pp_idle_ms": the longest rank span less that rank's F/B/W
time, from the executor's timestamps; median over steps and runs). --predict first runs zb once as a
calibration and, before each run, asks loom sim for that schedule's bubble
at the calibration's measured per-stage F, B, W (divided by 2 for the
two-chunk zbv and dualpipev) and message latency: a prediction made before
the run, printed beside the measurement. zbv, dualpipev and interleaved run
with 2 virtual stages. Example (docs/pipeline.md):

  bench/bench_pp.py --pp 4 --schedules 1f1b,zb,zbh2,zbv --runs 3 --predict

For each schedule (interleaved with --virtual-stages 2) it runs, on 2 ranks with
1 thread each (OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 --threads 1):

  scripts/loomrun -np 2 loom train --pp 2 --schedule S --micro-batches M \\
      --trace DIR --metrics FILE ...

then replays that run's schedule with the costs measured in its trace:

  loom sim --pp 2 --schedule S --micro-batches M --from-trace DIR

Columns: "measured" is the median of the JSONL's "pp_bubble" over the steps
after the first WARMUP (the executor's timestamps: 1 - F/B/W time / (pp x the
longest rank span)); "simulated" is `loom sim --from-trace` at each virtual
stage's mean F, B, W and the measured message latency (the trace holds the
last step); |diff| is their distance, target <= 0.05. "traced" is the
measured bubble of the traced step alone and "replayed" the simulator at each
action's own measured duration: together they tell a cost-model error (means
vs. actual durations) from a timing difference between runs. "closed" is the
closed form for uniform stages. tokens/s is the JSONL's median "tokens_per_s".

Messages: by default the runs set OMPI_MCA_btl_vader_single_copy_mechanism=cma
(unless it is set already), so Open MPI's shared-memory transport lets the
receiver copy a message on its own. With --no-cma the runs keep
scripts/loomrun's default (none): a 256 KB activation then moves only while
its sender is inside MPI, the receiver waits for the sender's next action,
and the measured bubble is far above the simulated one (`loom sim
--from-trace` prints a warning naming the late messages).

Model (defaults): 8 layers, d_model 256, 8 heads, vocab 256 (byte-level),
seq 128, global batch 16, 8 micro-batches (2 sequences each); data is
/usr/share/common-licenses/GPL-3 through `loom data`.

Exit 0 if every row ran (whatever the distance), 1 otherwise.
"""

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import WARMUP, BenchError, cpu_model, median_after_warmup, run  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOOM_RUN = os.path.join(ROOT, "scripts", "loomrun")
TEXT = "/usr/share/common-licenses/GPL-3"
TARGET = 0.05


def sim_value(text, label, optional=False):
    """The number after `label` at the start of a line of loom sim's report
    (NaN when optional and absent: the list-scheduled kinds have no closed form)."""
    m = re.search(r"^%s\s+([-+0-9.eE]+)" % re.escape(label), text, re.M)
    if not m and optional:
        return float("nan")
    if not m:
        raise BenchError("loom sim printed no '%s' line:\n%s" % (label, text))
    return float(m.group(1))


def predict(a, flags, env, calib):
    """loom sim's bubble for these flags before the run, at the per-stage
    costs measured in an earlier run's traces (calib: a zb run, whose trace
    splits B and W); None without one."""
    if not calib:
        return None
    out = run([a.loom, "sim", "--pp", str(a.pp), "--schedule", "zb", "--micro-batches", str(a.micro_batches),
               "--from-trace", calib], env).stdout
    rows = re.findall(r"^\s+(\d+)\s+\d+\s+\d+\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s*$", out, re.M)
    comm = re.search(r"^\s+comm ([0-9.eE+-]+) ms", out, re.M)
    if len(rows) != a.pp:
        return None
    f, b, w = (sum(float(r[i]) for r in rows) / len(rows) for i in (1, 2, 3))
    v = 2 if "--virtual-stages" in flags else 1
    sim = [a.loom, "sim"] + flags + ["--cost-f", "%.6f" % (f / v), "--cost-b", "%.6f" % (b / v),
                                     "--cost-w", "%.6f" % (w / v), "--cost-comm", comm.group(1) if comm else "0"]
    return sim_value(run(sim, env).stdout, "bubble")


def bench_row(a, sched, v, base, env, tmp, calib=None, rep=0):
    flags = ["--pp", str(a.pp), "--schedule", sched, "--micro-batches", str(a.micro_batches)]
    if v > 1:
        flags += ["--virtual-stages", str(v)]
    predicted = predict(a, flags, env, calib)
    trace = os.path.join(tmp, "trace_%s_%d" % (sched, rep))
    metrics = os.path.join(tmp, "m_%s_%d.jsonl" % (sched, rep))
    cmd = [LOOM_RUN, "-np", str(a.pp), a.loom, "train"] + base + flags + ["--trace", trace, "--metrics", metrics]
    run(cmd, env)
    with open(metrics) as f:
        steps = [r for r in (json.loads(line) for line in f if line.strip()) if "step" in r]
    sim_cmd = [a.loom, "sim"] + flags + ["--from-trace", trace]
    out = run(sim_cmd, env).stdout
    measured = median_after_warmup([m["pp_bubble"] for m in steps])
    simulated = sim_value(out, "bubble")
    return {
        "schedule": sched + (" v=%d" % v if v > 1 else ""),
        "predicted": predicted,
        "trace": trace,
        "measured": measured,
        "simulated": simulated,
        "diff": abs(measured - simulated),
        "traced": sim_value(out, "measured"),
        "replayed": sim_value(out, "replayed"),
        "closed": sim_value(out, "closed", optional=True),
        "tokens_per_s": median_after_warmup([m["tokens_per_s"] for m in steps]),
        "step_ms": median_after_warmup([m["step_ms"] for m in steps]),
        "peak_live": max(m["pp_peak_live"] for m in steps),
        "idle_ms": [median_after_warmup([m["pp_idle_ms"][r] for m in steps]) for r in range(a.pp)]
        if all("pp_idle_ms" in m for m in steps) else [],
        "bubbles": [m["pp_bubble"] for m in steps],
        "late_messages": "warning:" in out,
        "cmd": " ".join(cmd),
        "sim_cmd": " ".join(sim_cmd),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--loom", default=os.environ.get("LOOM", os.path.join(ROOT, "build", "loom")))
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--micro-batches", type=int, default=8)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--embd", type=int, default=256)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--schedules", default="gpipe,1f1b,interleaved,zb")
    ap.add_argument("--pp", type=int, default=2, help="pipeline ranks (default 2)")
    ap.add_argument("--runs", type=int, default=1,
                    help="runs per schedule; with more than 1, also a table of the median and range")
    ap.add_argument("--predict", action="store_true",
                    help="first a zb calibration run; before each run, loom sim's bubble at its measured costs")
    ap.add_argument("--no-cma", action="store_true",
                    help="keep loomrun's shared-memory transport (single copy 'none'): shows the progress problem")
    ap.add_argument("--json", help="also write the rows as JSON to this file")
    ap.add_argument("--keep", metavar="DIR",
                    help="keep the data, config, traces and metrics in DIR (created; default: a temporary one)")
    a = ap.parse_args()

    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    if not a.no_cma:
        env.setdefault("OMPI_MCA_btl_vader_single_copy_mechanism", "cma")
    transport = env.get("OMPI_MCA_btl_vader_single_copy_mechanism", "none (loomrun's default)")
    results = []
    try:
        if not os.access(a.loom, os.X_OK):
            raise BenchError("%s: not an executable loom binary (build it, or pass --loom)" % a.loom)
        with tempfile.TemporaryDirectory() as scratch:
            tmp = a.keep or scratch
            os.makedirs(tmp, exist_ok=True)
            data = os.path.join(tmp, "train.bin")
            run([a.loom, "data", "--input", TEXT, "--out", data, "--val", ""], env)
            model = os.path.join(tmp, "config.json")
            with open(model, "w") as f:
                json.dump({"n_layer": a.layers, "n_head": a.heads, "n_embd": a.embd, "vocab_size": 256,
                           "n_positions": a.seq}, f)
            base = ["--model", model, "--data", data, "--steps", str(a.steps), "--batch", str(a.batch),
                    "--seq", str(a.seq), "--seed", "1", "--threads", "1", "--peak-flops", "1e11",
                    "--no-progress", "--quiet"]
            calib = bench_row(a, "zb", 1, base, env, tmp, rep=-1)["trace"] if a.predict else None
            for sched in a.schedules.split(","):
                v = 2 if sched in ("interleaved", "zbv", "dualpipev") else 1
                for rep in range(a.runs):
                    results.append(bench_row(a, sched, v, base, env, tmp, calib, rep))
    except BenchError as e:
        print("bench_pp: %s" % e, file=sys.stderr)
        return 1

    print("loom pipeline parallelism, pp=%d on %d ranks, %s (%d cores)" % (a.pp, a.pp, cpu_model(),
                                                                           os.cpu_count() or 0))
    print("model: %d layers, d_model %d, %d heads, vocab 256, seq %d, global batch %d, %d micro-batches; "
          "%d steps, median after %d warm-up; 1 thread per rank; vader single copy: %s"
          % (a.layers, a.embd, a.heads, a.seq, a.batch, a.micro_batches, a.steps, WARMUP, transport))
    print("%-15s %9s %9s %7s %7s %8s %8s %8s %9s %8s %5s" % (
        "schedule", "measured", "simulated", "|diff|", "target", "traced", "replayed", "closed", "tokens/s",
        "step ms", "peak"))
    for r in results:
        print("%-15s %9.4f %9.4f %7.4f %7s %8.4f %8.4f %8.4f %9.0f %8.1f %5d%s" % (
            r["schedule"], r["measured"], r["simulated"], r["diff"], "ok" if r["diff"] <= TARGET else "MISS",
            r["traced"], r["replayed"], r["closed"], r["tokens_per_s"], r["step_ms"], r["peak_live"],
            "  (late messages: see loom sim's warning)" if r["late_messages"] else ""))
    if a.runs > 1 or a.predict:
        print("per schedule over %d runs: measured bubble median [min, max], loom sim's prediction made "
              "before the run (costs from a zb calibration run), median |measured - predicted|" % a.runs)
        for name in dict.fromkeys(r["schedule"] for r in results):
            rows = [r for r in results if r["schedule"] == name]
            ms = sorted(r["measured"] for r in rows)
            pred = [r["predicted"] for r in rows if r["predicted"] is not None]
            line = "%-15s %.4f [%.4f, %.4f]" % (name, statistics.median(ms), ms[0], ms[-1])
            if pred:
                line += "  predicted %.4f  |diff| %.4f" % (
                    statistics.median(pred), statistics.median(abs(r["measured"] - r["predicted"]) for r in rows))
            idle = [statistics.median(r["idle_ms"][q] for r in rows) for q in range(a.pp) if rows[0]["idle_ms"]]
            if idle:
                line += "  idle ms per rank " + " ".join("%.1f" % x for x in idle)
            print(line)
    print("commands (per schedule%s):" % ("" if a.keep else "; the data, config and trace paths are temporary"))
    for r in results:
        print("  " + r["cmd"])
        print("  " + r["sim_cmd"])
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
