#!/usr/bin/python3
"""Context parallelism at long sequences: tokens/s for cp = 1, 2, 4 (ring and
Ulysses), the fraction of CP communication hidden behind compute, CP bytes per
step; and loom's single-rank attention kernel against PyTorch's on the same
shape (forward + backward) as a ratio.

usage: bench/bench_cp.py [--loom build/loom] [--steps N] [--layers L] [--embd H]
                         [--heads A] [--seq T] [--kernel-seq T] [--json FILE]

Same model, data, seed and global batch (1 sequence) on every row; 1 thread
per rank (OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 --threads 1). Figures come
from loom's --metrics JSONL (rank 0), median over the steps after the first
WARMUP: tokens/s is "tokens_per_s"; hidden is "cp" -> "hidden" (1 - the
compute thread's time inside CP communicator calls / the transfers' time);
CP MB is the bytes rank 0 sent in the "cp" group. The kernel comparison runs
build/tests/kernels/bench_kernels and bench/kernels/bench_kernels_torch.py
(masked-softmax attention as the oracle writes it) at B=1, --kernel-seq,
--embd, --heads, one thread, and prints loom's time over PyTorch's.

Exit 0 if every row ran, 1 otherwise.
"""

import json
import os
import re
import sys
import tempfile
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import (ROOT, WARMUP, BenchError, cpu_model, train_base,  # noqa: E402
                      median_after_warmup, model_parser, run, train_steps)



def bench_row(loom, ranks, flags, base, env, metrics):
    cmd, steps = train_steps(loom, ranks, flags, base, env, metrics)
    cp = [m["comm"].get("cp", {}) for m in steps]
    return {
        "tokens_per_s": median_after_warmup([m["tokens_per_s"] for m in steps]),
        "step_ms": median_after_warmup([m["step_ms"] for m in steps]),
        "hidden": median_after_warmup([m["cp"]["hidden"] for m in steps]) if "cp" in steps[0] else None,
        "cp_bytes": sum(v["bytes"] for k, v in cp[-1].items() if k != "recv"),  # sent
        "activations": steps[-1]["mem"]["activations"],
        "cmd": cmd,
    }


def attention_ms(cmd, env):
    """fwd + bwd milliseconds of the 'attention' lines a kernel bench prints."""
    out = run(cmd, env).stdout
    ms = [float(x) for x in re.findall(r"attention (?:fwd|bwd)\s+([0-9.]+) ms", out)]
    if len(ms) != 2:
        raise BenchError("no attention timings in the output of %s" % " ".join(map(str, cmd)))
    return ms[0] + ms[1]


def main():
    ap = model_parser(__doc__, steps=5, layers=2, embd=64, heads=4, seq=4096)
    ap.add_argument("--kernel-seq", type=int, default=2048)
    a = ap.parse_args()

    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    rows = [("cp=1", 1, ["--cp", "1"]), ("cp=2 ring", 2, ["--cp", "2"]),
            ("cp=2 ulysses", 2, ["--cp", "2", "--cp-impl", "ulysses"]),
            ("cp=4 ring", 4, ["--cp", "4"]), ("cp=4 ulysses", 4, ["--cp", "4", "--cp-impl", "ulysses"])]
    results = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            base = train_base(tmp, a, env, 1)
            for label, ranks, flags in rows:
                r = bench_row(a.loom, ranks, flags, base, env, os.path.join(tmp, "m.jsonl"))
                r.update(label=label, ranks=ranks)
                results.append(r)
        shape = ["1", str(a.kernel_seq), str(a.embd), str(a.heads), "256", "1"]
        loom_ms = attention_ms([os.path.join(os.path.dirname(a.loom), "tests", "kernels", "bench_kernels")]
                               + shape + ["1"], env)
        torch_ms = attention_ms(["/usr/bin/python3", os.path.join(ROOT, "bench", "kernels",
                                                                 "bench_kernels_torch.py")] + shape, env)
    except BenchError as e:
        print("bench_cp: %s" % e, file=sys.stderr)
        return 1

    print("loom context parallelism, %s (%d cores)" % (cpu_model(), os.cpu_count() or 0))
    print("model: %d layers, d_model %d, %d heads, vocab 256, seq %d, batch 1; %d steps, median "
          "after %d warm-up; 1 thread per rank" % (a.layers, a.embd, a.heads, a.seq, a.steps, WARMUP))
    base_rate = results[0]["tokens_per_s"]
    print("%-13s %5s %10s %8s %9s %8s %12s %12s" % ("layout", "ranks", "tokens/s", "vs cp=1", "step ms",
                                                   "hidden", "CP MB/step", "act MB/rank"))
    for r in results:
        hidden = "-" if r["hidden"] is None else "%.0f%%" % (100 * r["hidden"])
        print("%-13s %5d %10.0f %7.2fx %9.1f %8s %12.2f %12.2f" % (
            r["label"], r["ranks"], r["tokens_per_s"], r["tokens_per_s"] / base_rate, r["step_ms"],
            hidden, r["cp_bytes"] / 1e6, r["activations"] / 1e6))
    print("attention fwd+bwd, B=1 T=%d C=%d heads=%d, 1 thread: loom %.1f ms, PyTorch %.1f ms, "
          "loom/PyTorch time %.2f" % (a.kernel_seq, a.embd, a.heads, loom_ms, torch_ms, loom_ms / torch_ms))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": results, "attention_ms": {"loom": loom_ms, "torch": torch_ms}}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
