"""Helpers shared by loom's benchmark scripts: errors, machine description,
running a command, and the warm-up-skipping median every benchmark reports."""
import json
import os
import platform
import statistics
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOOM_RUN = os.path.join(ROOT, "scripts", "loomrun")
TEXT = "/usr/share/common-licenses/GPL-3"

WARMUP = 2


class BenchError(Exception):
    pass


def cpu_model():
    """The CPU's model name from /proc/cpuinfo."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def run(cmd, env=None, what=None):
    """Run cmd; raise BenchError with the command and its output tail on failure."""
    cmd = [str(c) for c in cmd]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        tail = "\n".join((p.stdout + p.stderr).strip().splitlines()[-15:])
        raise BenchError("%s failed (exit %d): %s\n%s" % (what or "command", p.returncode, " ".join(cmd), tail))
    return p


def median_after_warmup(xs, warmup=WARMUP):
    if len(xs) <= warmup:
        raise BenchError("need more than %d steps to skip warm-up, got %d" % (warmup, len(xs)))
    return statistics.median(xs[warmup:])


def random_batch(tokens, rng, B, T):
    """The PyTorch side's training batch: B windows of T + 1 tokens at random
    starts of the uint8 token array (numpy Generator rng), as int64 tensors
    (inputs, targets shifted by one)."""
    import numpy as np
    import torch
    starts = rng.integers(0, len(tokens) - T - 1, size=B)
    chunk = np.stack([tokens[s:s + T + 1] for s in starts]).astype(np.int64)
    return torch.from_numpy(chunk[:, :T].copy()), torch.from_numpy(chunk[:, 1:].copy())


def train_steps(loom, ranks, flags, base, env, metrics):
    """`loom train BASE FLAGS --metrics METRICS` on `ranks` ranks (through
    loomrun when more than one); returns (command line, rank 0's step records)."""
    cmd = ([LOOM_RUN, "-np", str(ranks)] if ranks > 1 else []) + [loom, "train"] + base + flags + [
        "--metrics", metrics]
    run(cmd, env)
    with open(metrics) as f:
        return " ".join(map(str, cmd)), [r for r in (json.loads(line) for line in f if line.strip()) if "step" in r]


def train_base(tmp, a, env, batch):
    """The `loom train` arguments every row of a model benchmark shares, for
    the parsed model_parser options a: the byte-level text shard and the model
    config written in tmp, steps, batch, seq, seed 1, one thread."""
    if not os.access(a.loom, os.X_OK):
        raise BenchError("%s: not an executable loom binary (build it, or pass --loom)" % a.loom)
    data = os.path.join(tmp, "train.bin")
    run([a.loom, "data", "--input", TEXT, "--out", data, "--val", ""], env)
    model = os.path.join(tmp, "model.json")
    with open(model, "w") as f:
        json.dump({"n_layer": a.layers, "n_head": a.heads, "n_embd": a.embd, "vocab_size": 256,
                   "n_positions": a.seq}, f)
    return ["--model", model, "--data", data, "--steps", str(a.steps), "--batch", str(batch),
            "--seq", str(a.seq), "--seed", "1", "--threads", "1", "--peak-flops", "1e11",
            "--no-progress", "--quiet"]


def model_parser(doc, steps, layers, embd, heads, seq):
    """An argument parser with --loom, --steps, --layers, --embd, --heads,
    --seq (defaults given) and --json, for the scripts that train a model."""
    import argparse
    ap = argparse.ArgumentParser(description=doc.split("\n")[0])
    ap.add_argument("--loom", default=os.environ.get("LOOM", os.path.join(ROOT, "build", "loom")))
    ap.add_argument("--steps", type=int, default=steps)
    ap.add_argument("--layers", type=int, default=layers)
    ap.add_argument("--embd", type=int, default=embd)
    ap.add_argument("--heads", type=int, default=heads)
    ap.add_argument("--seq", type=int, default=seq)
    ap.add_argument("--json", help="also write the rows as JSON to this file")
    return ap
