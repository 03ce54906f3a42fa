#!/usr/bin/python3
"""Single-rank training throughput, loom vs PyTorch, same GPT-2 config, same machine.

usage: bench/bench_train.py [--loom build/loom] [--configs small,gpt2s] [--shapes 4x64,8x256]
                            [--threads 1,2] [--runs 3] [--steps N] [--recompute selective,full]
                            [--startup N] [--precision fp32,bf16] [--keep-blas-env] [--torch-only | --loom-only]

Configs: gpt2s = GPT-2 124M (L12 C768 NH12 V50257), small = L4 C256 NH4 V50257
(the issue's two). Shapes B x T. Per config, shape and thread count the two sides
run ALTERNATELY (loom, torch, loom, torch, ...) --runs times each, every run a
fresh process; a run's rate is the median tokens/s of its steps after 2 warm-up
steps; the table gives the median over runs and the range (min-max), the ratio
of the medians, and each side's MFU against loom's measured best sgemm for that
thread count (the best of three `loom calibrate --force` when the bench starts: same kernel, same
thread count) - 6 N FLOP per
token + attention, the formula loom reports.

PyTorch at its best on this machine: the same OpenBLAS (Debian's torch 1.13
links libopenblas) forced to the same kernels loom chose (OPENBLAS_CORETYPE =
the core `loom calibrate` names), torch.set_num_threads(threads) with OpenBLAS
on `threads` threads or on one (the better of the two per run), a step of
forward, backward, clip_grad_norm_(1.0), AdamW, zero_grad (tests/oracle/
torch_gpt2.py), with the GOMP_SPINCOUNT=20000 loom sets for itself (both use
libgomp). loom: --threads N, OMP_NUM_THREADS=N. Both sides train on
byte-level tokens of the same text.

--precision fp32,bf16 runs each table at each precision: loom --precision bf16
against PyTorch with torch.autocast("cpu", dtype=torch.bfloat16) around the
forward (its bf16 matmuls go to oneDNN, which picks its kernels from the CPU
flags), MFU against loom's measured bf16 GEMM peak, and prints loom's bf16 /
fp32 ratio: of the medians, and run by run. The precisions alternate too:
run r of every side at every precision comes before run r+1 of any.
--recompute adds loom rows with those --recompute modes (the throughput cost).
--keep-blas-env: by default the bench removes OPENBLAS_CORETYPE and
OPENBLAS_L2_SIZE from the environment of both sides (some hosts set them
for every process: OPENBLAS_CORETYPE=Haswell would hold loom, which keeps a
user's choice, and PyTorch to AVX2 kernels on an AVX-512 CPU), so that loom
chooses its kernels from the CPU flags and PyTorch gets the core loom
chose; the header says what it removed. --keep-blas-env keeps them.
--startup N: N runs of `loom train --model gpt2-small --steps 1` reading the
start-up line (process start to the first step, parameter init included) with
the default threads; median and range.

Exit 0 if every requested run worked, 1 otherwise.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import WARMUP, BenchError, cpu_model, median_after_warmup, random_batch, run  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FORTUNES = "/usr/share/games/fortunes/fortunes"
LR = 1e-4

# name: (n_layer, n_head, n_embd, vocab_size, n_positions)
CONFIGS = {
    "small": (4, 4, 256, 50257, 1024),
    "gpt2s": (12, 12, 768, 50257, 1024),
}


def flops_per_token(cfg, T):
    """loom_gpt_flops_per_token: 6 x matmul params + 12 L C T."""
    L, _, C, V, _ = cfg
    return 6.0 * (L * 12.0 * C * C + V * C) + 12.0 * L * C * T


# ---- the torch side, in its own process (threads and OPENBLAS_CORETYPE per run)


def torch_worker(args):
    import numpy as np
    import torch
    sys.path.insert(0, os.path.join(ROOT, "tests", "oracle"))
    import torch_gpt2
    L, NH, C, V, P = CONFIGS[args.worker_config]
    cfg = torch_gpt2.Config(n_layer=L, n_head=NH, n_embd=C, vocab_size=V, n_positions=P)
    B, T = args.worker_B, args.worker_T
    torch.set_num_threads(args.worker_threads)
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    with open(args.input, "rb") as f:
        tokens = np.frombuffer(f.read(), dtype=np.uint8)
    params = torch_gpt2.params_from_numpy(torch_gpt2.init_params(cfg, 0), cfg, torch.float32)
    opt = torch_gpt2.make_adamw(params, LR, (0.9, 0.95), 1e-8, 0.1)
    rates = []
    for _ in range(args.steps_run):
        idx, tgt = random_batch(tokens, rng, B, T)
        t0 = time.perf_counter()
        torch_gpt2.train_step(params, cfg, opt, idx, tgt, clip=1.0, autocast_bf16=args.worker_bf16)
        rates.append(B * T / (time.perf_counter() - t0))
    print(json.dumps({"rate": median_after_warmup(rates)}))


def bench_torch(cfg_name, B, T, threads, steps, text, coretype, precision="fp32"):
    """Best over torch's thread settings for `threads`: OpenMP and OpenBLAS both
    on `threads` threads, and (threads > 1) OpenBLAS on one thread - its
    pthreads and torch's OpenMP pool spin against each other on few cores."""
    best = 0.0
    for blas in ([threads, 1] if threads > 1 else [1]):
        # GOMP_SPINCOUNT: the bounded spinning loom sets for itself (docs/performance.md)
        env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(blas))
        env.setdefault("GOMP_SPINCOUNT", "20000")
        if coretype:
            env["OPENBLAS_CORETYPE"] = coretype
        p = run([sys.executable, os.path.abspath(__file__), "--worker-config", cfg_name, "--worker-B", B,
                 "--worker-T", T, "--worker-threads", threads, "--steps-run", steps, "--input", text]
                + (["--worker-bf16"] if precision == "bf16" else []),
                env=env, what="torch run")
        best = max(best, json.loads(p.stdout.strip().splitlines()[-1])["rate"])
    return best


# ---- the loom side


def loom_data(loom, text, d):
    data = os.path.join(d, "train.bin")
    run([loom, "data", "--input", text, "--out", data, "--val", ""], what="loom data")
    return data


def bench_loom(loom, cfg_name, B, T, threads, steps, data, d, recompute="none", precision="fp32"):
    L, NH, C, V, P = CONFIGS[cfg_name]
    model = os.path.join(d, cfg_name + ".json")
    with open(model, "w") as f:
        json.dump({"n_layer": L, "n_head": NH, "n_embd": C, "vocab_size": V, "n_positions": P}, f)
    metrics = os.path.join(d, "m.jsonl")
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    run([loom, "train", "--model", model, "--data", data, "--steps", steps, "--batch", B, "--seq", T,
         "--lr", repr(LR), "--threads", threads, "--metrics", metrics, "--peak-flops", "1e12",
         "--recompute", recompute, "--precision", precision, "--no-progress", "--quiet"], env=env,
        what="loom train")
    with open(metrics) as f:
        rows = [r for r in (json.loads(x) for x in f if x.strip()) if "step" in r]
    if len(rows) != steps:
        raise BenchError("loom metrics have %d rows for %d steps" % (len(rows), steps))
    return median_after_warmup([float(r["tokens_per_s"]) for r in rows])


CAL_TRIALS = 3

# OpenBLAS's core and cache-size overrides, which a host may set for every process
BLAS_ENV = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


def calibrate(loom, threads):
    """(sgemm FLOP/s, core name, gemm line, bf16 GEMM FLOP/s or None, bf16 gemm line) from
    `loom calibrate --threads N`."""
    # --force: the peak of this hour (the host's speed drifts; a cached record
    # from a slower moment put 124M B8 T256 at 100.4 % MFU)
    p = run([loom, "calibrate", "--threads", threads, "--force"], what="loom calibrate")
    m = re.search(r"^fp32\s+%d\s+([0-9.]+)\s+([0-9.]+)" % threads, p.stdout, re.M)
    mb = re.search(r"^bf16\s+%d\s+([0-9.]+)\s+([0-9.]+)" % threads, p.stdout, re.M)
    g = re.search(r"^gemm: (.*)$", p.stdout, re.M)
    gb = re.search(r"^bf16 gemm: (.*)$", p.stdout, re.M)
    core = re.search(r"sgemm kernels (\S+)", p.stdout)
    if not m or not g or not core or not gb:
        raise BenchError("cannot read loom calibrate output:\n" + p.stdout)
    return (float(m.group(1)) * 1e9, core.group(1), g.group(1), float(mb.group(1)) * 1e9 if mb else None,
            gb.group(1))


def startup(loom, n):
    """Start-up of GPT-2 124M, one rank: (seconds to the first step, CPU seconds by then) per run."""
    times, cpus = [], []
    for _ in range(n):
        t0 = time.perf_counter()
        p = run([loom, "train", "--model", "gpt2-small", "--steps", 1, "--batch", 1, "--seq", 64,
                 "--peak-flops", "1e12", "--no-progress"], what="loom start-up")
        wall = time.perf_counter() - t0
        m = re.search(r"start-up: ([0-9.]+) s from process start \(parameters initialised on (\d+) "
                      r"thread\(s\)(?:; ([0-9.]+) s of CPU)?", p.stderr)
        if not m:
            raise BenchError("no start-up line:\n" + p.stderr[-2000:])
        times.append(float(m.group(1)))
        cpu = float(m.group(3)) if m.group(3) else float("nan")
        cpus.append(cpu)
        print("  start-up run: %.2f s to the first step (%s threads, %.2f s of CPU), %.2f s for the whole "
              "1-step run; load average %.2f" % (float(m.group(1)), m.group(2), cpu, wall, os.getloadavg()[0]),
              flush=True)
    return times, cpus


def stats(xs):
    return "%9.1f [%.1f-%.1f]" % (statistics.median(xs), min(xs), max(xs))


def bench_group(a, name, B, T, t, precisions, peak_rec, modes, data, d):
    """One table per precision for a config, shape and thread count. The runs
    alternate over everything the tables compare - run r is loom and torch
    at each precision in turn, before run r+1 - so that a change in the
    host's load over the minutes a group takes falls on every side alike:
    loom against torch, and loom bf16 against loom fp32. MFU against loom's
    measured peak for that precision (bf16: the bf16 GEMM provider's; the
    sgemm's where there is none). Returns False if a run failed."""
    ok = True
    fpt = flops_per_token(CONFIGS[name], T)
    core = peak_rec[1]
    sides = ["loom"] + ["loom --recompute " + m for m in modes] + ["torch"]
    rows = {prec: {side: [] for side in sides} for prec in precisions}
    print("\n[%s B%d T%d, %d thread(s), %s] L=%d C=%d V=%d" %
          (name, B, T, t, " and ".join(precisions), CONFIGS[name][0], CONFIGS[name][2], CONFIGS[name][3]),
          flush=True)
    for r in range(a.runs):
        for prec in precisions:
            try:
                if not a.torch_only:
                    rows[prec]["loom"].append(bench_loom(a.loom, name, B, T, t, a.steps, data, d, precision=prec))
                    for m in modes:
                        rows[prec]["loom --recompute " + m].append(
                            bench_loom(a.loom, name, B, T, t, a.steps, data, d, m, precision=prec))
                if not a.loom_only:
                    rows[prec]["torch"].append(bench_torch(name, B, T, t, a.steps, a.input, core, prec))
            except BenchError as e:
                ok = False
                print("  run %d (%s) FAILED: %s" % (r + 1, prec, e))
    for prec in precisions:
        peak = peak_rec[3] if prec == "bf16" and peak_rec[3] else peak_rec[0]
        rp = rows[prec]
        print("  %s:" % prec)
        for side in sides:
            xs = rp[side]
            if xs:
                mfu = [100 * x * fpt / peak for x in xs]
                print("  %-24s tok/s %s   MFU %5.1f%% [%.1f-%.1f]" %
                      (side, stats(xs), statistics.median(mfu), min(mfu), max(mfu)))
                if statistics.median(mfu) > 100:
                    print("  (MFU over 100 %%: the peak was measured low, the host busy during `loom calibrate`)")
        if rp["loom"] and rp["torch"]:
            print("  %-24s %.2fx (median / median)" % ("loom / torch",
                  statistics.median(rp["loom"]) / statistics.median(rp["torch"])))
        for m in modes:
            k = "loom --recompute " + m
            if rp[k] and rp["loom"]:
                print("  %-24s %.2fx of none" % (m, statistics.median(rp[k]) / statistics.median(rp["loom"])))
    if "fp32" in rows and "bf16" in rows and rows["fp32"]["loom"] and rows["bf16"]["loom"]:
        f32, b16 = rows["fp32"]["loom"], rows["bf16"]["loom"]
        pairs = [b / f for b, f in zip(b16, f32)]
        print("  %-24s %.2fx (median / median); run by run %s" %
              ("loom bf16 / fp32", statistics.median(b16) / statistics.median(f32),
               " ".join("%.2f" % x for x in pairs)))
    return ok


def main():
    ap = argparse.ArgumentParser(description="training throughput, loom vs PyTorch, alternating runs")
    ap.add_argument("--loom", default=os.environ.get("LOOM", os.path.join(ROOT, "build", "loom")))
    ap.add_argument("--configs", default="small,gpt2s", help="comma list of: " + ", ".join(CONFIGS))
    ap.add_argument("--shapes", default="4x64,8x256", help="B x T list (default 4x64,8x256)")
    ap.add_argument("--threads", default="1,2", help="thread counts (default 1,2)")
    ap.add_argument("--runs", type=int, default=3, help="runs per side (default 3)")
    ap.add_argument("--steps", type=int, default=6, help="steps per run, > %d (default 6)" % WARMUP)
    ap.add_argument("--recompute", default="", help="extra loom rows: comma list of selective,full")
    ap.add_argument("--precision", default="fp32", help="comma list of fp32, bf16 (default fp32)")
    ap.add_argument("--startup", type=int, default=0, help="start-up runs of GPT-2 124M (default 0)")
    ap.add_argument("--input", default=FORTUNES, help="text file for byte-level tokens")
    ap.add_argument("--keep-blas-env", action="store_true",
                    help="keep OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE from the environment (default: removed "
                         "for both sides, so each runs its best kernels)")
    side = ap.add_mutually_exclusive_group()
    side.add_argument("--torch-only", action="store_true")
    side.add_argument("--loom-only", action="store_true")
    # the torch worker (internal)
    ap.add_argument("--worker-config", help=argparse.SUPPRESS)
    ap.add_argument("--worker-B", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--worker-T", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--worker-threads", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--steps-run", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--worker-bf16", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker_config:
        return torch_worker(a)

    names = [c for c in a.configs.split(",") if c]
    for c in names:
        if c not in CONFIGS:
            ap.error("unknown config %r (known: %s)" % (c, ", ".join(CONFIGS)))
    if a.steps <= WARMUP:
        ap.error("--steps %d must exceed the %d warm-up steps" % (a.steps, WARMUP))
    shapes = [tuple(int(x) for x in s.split("x")) for s in a.shapes.split(",") if s]
    thread_list = [int(t) for t in a.threads.split(",") if t]
    modes = [m for m in a.recompute.split(",") if m]
    precisions = [p for p in a.precision.split(",") if p]
    for p in precisions:
        if p not in ("fp32", "bf16"):
            ap.error("unknown precision %r (fp32, bf16)" % p)
    if not (os.path.isfile(a.loom) and os.access(a.loom, os.X_OK)):
        sys.exit("bench_train: no loom binary at %s (build it, or pass --loom)" % a.loom)

    print("machine: %s, %d logical CPUs; load average at start %s" %
          (cpu_model(), os.cpu_count() or 0, " ".join("%.2f" % x for x in os.getloadavg())))
    blas_env = ["%s=%s" % (k, os.environ[k]) for k in BLAS_ENV if k in os.environ]
    if blas_env and not a.keep_blas_env:
        for k in BLAS_ENV:
            os.environ.pop(k, None)  # every run below inherits os.environ
        print("environment: removed %s for both sides (--keep-blas-env keeps them)" % " ".join(blas_env))
    elif blas_env:
        print("environment: kept %s (--keep-blas-env): both sides run the core it names" % " ".join(blas_env))
    peaks = {}
    for t in thread_list:
        # best of CAL_TRIALS calibrations: one taken while another tenant of
        # the host held a core read the 2-thread bf16 peak at half (210 of
        # 414-441 GFLOP/s, 2026-11-25) and put a row at 133 % MFU
        trials = [calibrate(a.loom, t) for _ in range(CAL_TRIALS)]
        best = max(trials, key=lambda c: c[0])
        bf16_best = max((c[3] for c in trials if c[3]), default=None)
        peaks[t] = (best[0], best[1], best[2], bf16_best, best[4])
    print("loom gemm: %s" % peaks[thread_list[0]][2])
    if "bf16" in precisions:
        print("loom bf16 gemm: %s" % peaks[thread_list[0]][4])
        print("torch bf16: torch.autocast('cpu', torch.bfloat16) around the forward (its matmuls on oneDNN)")
    print("torch: same OpenBLAS with OPENBLAS_CORETYPE=%s (the core loom runs)" % peaks[thread_list[0]][1])
    for t in thread_list:
        print("measured best sgemm, %d thread(s): %.1f GFLOP/s (loom calibrate)" % (t, peaks[t][0] / 1e9))
        if "bf16" in precisions and peaks[t][3]:
            print("measured best bf16 GEMM, %d thread(s): %.1f GFLOP/s (loom calibrate)" % (t, peaks[t][3] / 1e9))
    print("step = fwd + bwd + clip(1.0) + AdamW; a run's tok/s = median after %d warm-up steps; "
          "%d alternating runs per side; median [min-max] over runs" % (WARMUP, a.runs))

    ok = True
    if a.startup:
        print("\n[start-up] GPT-2 124M, 1 rank, process start to first step")
        try:
            times, cpus = startup(a.loom, a.startup)
            print("  start-up s %s   CPU s %s" % (stats(times), stats(cpus)))
        except BenchError as e:
            ok = False
            print("  FAILED: %s" % e)

    with tempfile.TemporaryDirectory(prefix="loom_bench_") as d:
        data = loom_data(a.loom, a.input, d)
        for name in names:
            for (B, T) in shapes:
                for t in thread_list:
                    ok &= bench_group(a, name, B, T, t, precisions, peaks[t], modes, data, d)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
