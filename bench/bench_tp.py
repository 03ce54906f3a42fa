#!/usr/bin/python3
"""Tensor-parallel throughput on 2 ranks: tokens/s for tp=1 and tp=2 (with
and without --sp), and the share of step time spent in TP communication.

usage: bench/bench_tp.py [--loom build/loom] [--steps N] [--layers L] [--embd H]
                         [--heads A] [--seq T] [--batch B] [--no-sp] [--json FILE]

Same model, same global batch, same data and seed on every row:
  tp=1      1 rank,  1 thread  (plain `loom train`, the single-device run)
  tp=2      2 ranks, 1 thread each (scripts/loomrun -np 2 ... --tp 2)
  tp=2 sp   the same with --sp
(dp=2 on 2 ranks is not the comparison: it does not split the model.)
Every run uses OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 and --threads 1.

Figures come from loom's --metrics JSONL (rank 0), median over the steps
after the first WARMUP: tokens/s is "tokens_per_s"; the TP share of a step is
the sum of "comm" -> "tp" -> op -> "ms" over "step_ms" (time inside TP
collectives, including waiting for the slower rank there). Default model:
4 layers, d_model 256, 8 heads, vocab 256 (byte-level), seq 128, batch 8.

Exit 0 if every row ran, 1 otherwise.
"""

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import (WARMUP, BenchError, cpu_model, train_base,  # noqa: E402
                      median_after_warmup, model_parser, train_steps)



def bench_row(loom, ranks, flags, base, env, metrics):
    cmd, steps = train_steps(loom, ranks, flags, base, env, metrics)
    tp_ms = [sum(op["ms"] for op in m["comm"].get("tp", {}).values()) for m in steps]
    tp_bytes = [sum(op["bytes"] for op in m["comm"].get("tp", {}).values()) for m in steps]
    return {
        "tokens_per_s": median_after_warmup([m["tokens_per_s"] for m in steps]),
        "step_ms": median_after_warmup([m["step_ms"] for m in steps]),
        "tp_ms": median_after_warmup(tp_ms),
        "tp_share": median_after_warmup([t / m["step_ms"] for t, m in zip(tp_ms, steps)]),
        "tp_bytes": tp_bytes[-1],
        "activations": steps[-1]["mem"]["activations"],
        "loss": steps[-1]["loss"],
        "cmd": cmd,
    }


def main():
    ap = model_parser(__doc__, steps=12, layers=4, embd=256, heads=8, seq=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--no-sp", action="store_true", help="skip the tp=2 --sp row")
    a = ap.parse_args()

    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    rows = [("tp=1", 1, ["--tp", "1"]), ("tp=2", 2, ["--tp", "2"])]
    if not a.no_sp:
        rows.append(("tp=2 sp", 2, ["--tp", "2", "--sp"]))
    results = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            base = train_base(tmp, a, env, a.batch)
            for label, ranks, flags in rows:
                r = bench_row(a.loom, ranks, flags, base, env, os.path.join(tmp, "m.jsonl"))
                r.update(label=label, ranks=ranks)
                results.append(r)
    except BenchError as e:
        print("bench_tp: %s" % e, file=sys.stderr)
        return 1

    print("loom tensor parallelism, %s (%d cores)" % (cpu_model(), os.cpu_count() or 0))
    print("model: %d layers, d_model %d, %d heads, vocab 256, seq %d, global batch %d; %d steps, "
          "median after %d warm-up; 1 thread per rank" % (a.layers, a.embd, a.heads, a.seq, a.batch,
                                                          a.steps, WARMUP))
    base_rate = results[0]["tokens_per_s"]
    print("%-8s %5s %10s %8s %9s %9s %8s %12s %12s" % ("layout", "ranks", "tokens/s", "vs tp=1", "step ms",
                                                      "TP ms", "TP share", "TP MB/step", "act MB/rank"))
    for r in results:
        print("%-8s %5d %10.0f %7.2fx %9.1f %9.2f %7.1f%% %12.2f %12.2f" % (
            r["label"], r["ranks"], r["tokens_per_s"], r["tokens_per_s"] / base_rate, r["step_ms"],
            r["tp_ms"], 100 * r["tp_share"], r["tp_bytes"] / 1e6, r["activations"] / 1e6))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
