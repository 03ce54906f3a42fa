#!/usr/bin/python3
"""Single-rank training throughput: loom vs PyTorch, same GPT-2 config, same machine.

usage: bench/bench_train.py [--loom build/loom] [--steps N] [--configs small,gpt2s]
                            [--torch-only | --loom-only]

Both sides run on one thread: torch.set_num_threads(1) here; loom with
OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 and --threads 1. A step is forward,
backward, clip_grad_norm_(1.0), AdamW step, zero_grad, with byte-level tokens
from the same text file. Throughput is the median per-step tokens/s over the
steps after the first 2 (warm-up). loom's number comes from its --metrics JSONL
(key tokens_per_s), torch's from timing each step here.

Exit 0 if every requested half ran, 1 if any failed (e.g. build/loom missing).
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import WARMUP, BenchError, cpu_model, median_after_warmup, run  # noqa: E402

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch is imported
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "oracle"))
import torch_gpt2  # noqa: E402

FORTUNES = "/usr/share/games/fortunes/fortunes"
LR = 1e-4

# name: (model config, batch B, sequence T, default steps)
CONFIGS = {
    "small": (torch_gpt2.Config(n_layer=4, n_head=4, n_embd=256, vocab_size=256, n_positions=256), 8, 256, 12),
    "gpt2s": (torch_gpt2.Config(n_layer=12, n_head=12, n_embd=768, vocab_size=50257, n_positions=1024), 1, 256, 6),
}


def bench_torch(cfg, B, T, steps, tokens, seed=0):
    """Median tokens/s of float32 torch_gpt2 + AdamW; also returns (first, last) loss."""
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    params = torch_gpt2.params_from_numpy(torch_gpt2.init_params(cfg, seed), cfg, torch.float32)
    opt = torch_gpt2.make_adamw(params, LR, (0.9, 0.95), 1e-8, 0.1)
    rates, losses = [], []
    for _ in range(steps):
        starts = rng.integers(0, len(tokens) - T - 1, size=B)
        chunk = np.stack([tokens[s:s + T + 1] for s in starts]).astype(np.int64)
        idx, tgt = torch.from_numpy(chunk[:, :T].copy()), torch.from_numpy(chunk[:, 1:].copy())
        t0 = time.perf_counter()
        loss, _ = torch_gpt2.train_step(params, cfg, opt, idx, tgt, clip=1.0)
        dt = time.perf_counter() - t0
        rates.append(B * T / dt)
        losses.append(loss)
    return median_after_warmup(rates), losses[0], losses[-1]


def _run(cmd, env, what):
    try:
        p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           universal_newlines=True)
    except OSError as e:
        raise BenchError("%s: cannot run %s: %s" % (what, cmd[0], e))
    if p.returncode != 0:
        tail = "\n".join(p.stdout.strip().splitlines()[-15:])
        raise BenchError("%s failed (exit %d): %s\n%s" % (what, p.returncode, " ".join(cmd), tail))


def bench_loom(loom, cfg, B, T, steps, text):
    """Median tokens/s from `loom train --metrics`; also returns (first, last) loss."""
    if not (os.path.isfile(loom) and os.access(loom, os.X_OK)):
        raise BenchError("loom binary not found or not executable at %s "
                         "(build it: cmake -S . -B build && cmake --build build, or pass --loom)" % loom)
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    with tempfile.TemporaryDirectory(prefix="loom_bench_") as d:
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump({"n_layer": cfg.n_layer, "n_head": cfg.n_head, "n_embd": cfg.n_embd,
                       "vocab_size": cfg.vocab_size, "n_positions": cfg.n_positions}, f)
        data, metrics = os.path.join(d, "train.bin"), os.path.join(d, "m.jsonl")
        _run([loom, "data", "--input", text, "--out", data], env, "loom data")
        _run([loom, "train", "--model", os.path.join(d, "config.json"), "--data", data,
              "--steps", str(steps), "--batch", str(B), "--seq", str(T), "--lr", repr(LR),
              "--threads", "1", "--metrics", metrics], env, "loom train")
        rows = []
        try:
            with open(metrics) as f:
                for line in f:
                    if line.strip():
                        rows.append(json.loads(line))
        except (OSError, ValueError) as e:
            raise BenchError("cannot read loom metrics %s: %s" % (metrics, e))
    try:
        rows.sort(key=lambda r: r["step"])
        rates = [float(r["tokens_per_s"]) for r in rows]
        losses = [float(r["loss"]) for r in rows]
    except (KeyError, TypeError, ValueError) as e:
        raise BenchError("loom metrics lack step/loss/tokens_per_s: %s" % e)
    if len(rows) != steps:
        raise BenchError("loom metrics have %d rows for %d steps" % (len(rows), steps))
    return median_after_warmup(rates), losses[0], losses[-1]


def fmt_rate(r):
    return "%10.1f" % r if isinstance(r, float) else "%10s" % r


def main():
    ap = argparse.ArgumentParser(description="single-rank training throughput, loom vs PyTorch")
    ap.add_argument("--loom", default=os.environ.get("LOOM", os.path.join(ROOT, "build", "loom")),
                    help="loom binary (default $LOOM or <repo>/build/loom)")
    ap.add_argument("--steps", type=int, help="steps per run, > %d (default: small 12, gpt2s 6)" % WARMUP)
    ap.add_argument("--configs", default="small,gpt2s", help="comma list of: " + ", ".join(CONFIGS))
    ap.add_argument("--input", default=FORTUNES, help="text file for byte-level tokens")
    side = ap.add_mutually_exclusive_group()
    side.add_argument("--torch-only", action="store_true")
    side.add_argument("--loom-only", action="store_true")
    a = ap.parse_args()

    names = [c for c in a.configs.split(",") if c]
    for c in names:
        if c not in CONFIGS:
            ap.error("unknown config %r (known: %s)" % (c, ", ".join(CONFIGS)))
    if a.steps is not None and a.steps <= WARMUP:
        ap.error("--steps %d must exceed the %d warm-up steps" % (a.steps, WARMUP))
    try:
        with open(a.input, "rb") as f:
            tokens = np.frombuffer(f.read(), dtype=np.uint8)
    except OSError as e:
        sys.exit("bench_train: cannot read %s: %s" % (a.input, e))
    if len(tokens) < 2 * 256 + 2:
        sys.exit("bench_train: %s has %d bytes, too few for T=256" % (a.input, len(tokens)))

    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    print("machine: %s, %d logical CPUs; threads per side: 1 (torch %s, numpy %s, python %s)"
          % (cpu_model(), os.cpu_count() or 0, torch.__version__, np.__version__, platform.python_version()))
    print("step = fwd + bwd + clip_grad_norm(1.0) + AdamW(lr=%g); tok/s = median over steps after %d warm-up"
          % (LR, WARMUP))

    ok = True
    for name in names:
        cfg, B, T, default_steps = CONFIGS[name]
        steps = a.steps or default_steps
        print("\n[%s] L=%d C=%d NH=%d V=%d n_positions=%d  B=%d T=%d steps=%d"
              % (name, cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.vocab_size, cfg.n_positions, B, T, steps))
        res = {}
        for side, skip in (("loom", a.torch_only), ("torch", a.loom_only)):
            if skip:
                res[side] = ("skipped", None)
                continue
            try:
                if side == "loom":
                    rate, l0, l1 = bench_loom(a.loom, cfg, B, T, steps, a.input)
                else:
                    rate, l0, l1 = bench_torch(cfg, B, T, steps, tokens)
                res[side] = (rate, "loss %.4f -> %.4f" % (l0, l1))
            except BenchError as e:
                ok = False
                res[side] = ("FAILED", None)
                print("  %s: %s" % (side, e))
        print("  %-6s %10s  %s" % ("", "tok/s", ""))
        for side in ("loom", "torch"):
            print("  %-6s %s  %s" % (side, fmt_rate(res[side][0]), res[side][1] or ""))
        lr_, tr = res["loom"][0], res["torch"][0]
        ratio = "%.3f" % (lr_ / tr) if isinstance(lr_, float) and isinstance(tr, float) else "n/a"
        print("  %-6s %10s" % ("ratio", ratio) + "  (loom / torch)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
