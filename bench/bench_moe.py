#!/usr/bin/python3
"""Mixture-of-Experts throughput: mini-moe (4 layers, d_model 256, 8 experts,
top-2, dropless) on 1, 2 and 4 ranks with ep = ranks, and one MoE layer of
loom against the same layer in PyTorch on one thread.

usage: bench/bench_moe.py [--loom build/loom] [--steps N] [--seq T] [--batch B]
                          [--json FILE]

Rows (same model, global batch, data and seed; --threads 1 per rank):
  ep=1   1 rank (plain `loom train`)
  ep=P   P ranks, --dp P --ep P (each rank routes its own micro-batch)
From loom's --metrics JSONL, median over the steps after the first WARMUP:
tokens/s ("tokens_per_s"), the all-to-all share of the step (the EP group's
alltoall(v) ms on rank 0 over "step_ms") and the mean imbalance (max/mean
tokens per expert) over the MoE blocks.

Layer ratio: loom has no way to time one MoE block alone, so the ratio is
loom's whole step of a 1-layer model of the same width (embedding, attention,
the MoE block, head, AdamW; one rank) over PyTorch's forward+backward of that
MoE layer alone (float32, one thread, autograd, same N x C, E = 8, H = 4C,
top-2) - PyTorch is given less work, so a ratio of 1 would mean loom's MoE is
faster than PyTorch's.

Exit 0 if every row ran, 1 otherwise.
"""
import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import BenchError, cpu_model, median_after_warmup, run  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOOM_RUN = os.path.join(ROOT, "scripts", "loomrun")
TEXT = "/usr/share/common-licenses/GPL-3"


def row(loom, ranks, base, env, metrics):
    flags = ["--dp", ranks, "--ep", ranks] if ranks > 1 else []
    cmd = ([LOOM_RUN, "-np", str(ranks)] if ranks > 1 else []) + [loom, "train"] + base + flags + [
        "--metrics", metrics]
    run(cmd, env, "loom train on %d ranks" % ranks)
    with open(metrics) as f:
        steps = [r for r in (json.loads(line) for line in f if line.strip()) if "step" in r]
    a2a = [sum(op["ms"] for k, op in m["comm"].get("ep", {}).items() if k.startswith("alltoall")) /
           m["step_ms"] for m in steps]
    imb = [sum(b["imbalance"] for b in m["moe"]) / len(m["moe"]) for m in steps]
    return {"ranks": ranks, "tokens_per_s": median_after_warmup([m["tokens_per_s"] for m in steps]),
            "a2a_share": median_after_warmup(a2a), "imbalance": median_after_warmup(imb),
            "step_ms": median_after_warmup([m["step_ms"] for m in steps])}


def torch_moe_layer_ms(N, C, E, H, k, reps=10):
    """Forward+backward of one top-k MoE layer (router, softmax, top-k,
    per-expert GELU MLPs, weighted combine) in PyTorch, float32, one thread."""
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(1)
    torch.manual_seed(0)
    x = torch.randn(N, C, requires_grad=True)
    wr = (0.02 * torch.randn(C, E)).requires_grad_()
    w1 = [(0.02 * torch.randn(C, H)).requires_grad_() for _ in range(E)]
    w2 = [(0.02 * torch.randn(H, C)).requires_grad_() for _ in range(E)]
    times = []
    for _ in range(reps + 2):
        t0 = time.perf_counter()
        p = torch.softmax(x @ wr, -1)
        g, idx = torch.topk(p, k, -1)
        g = g / g.sum(-1, keepdim=True)
        out = torch.zeros_like(x)
        for e in range(E):
            tok, j = torch.nonzero(idx == e, as_tuple=True)
            if len(tok):
                y = F.gelu(x[tok] @ w1[e], approximate="tanh") @ w2[e]
                out = out.index_add(0, tok, y * g[tok, j].unsqueeze(1))
        out.sum().backward()
        times.append(1e3 * (time.perf_counter() - t0))
    return median_after_warmup(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--loom", default=os.path.join(ROOT, "build", "loom"))
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--json")
    a = ap.parse_args()
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    out = {"cpu": cpu_model(), "rows": []}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            data = os.path.join(tmp, "train.bin")
            run([a.loom, "data", "--input", TEXT, "--out", data, "--val", ""], env, "loom data")
            base = ["--model", "mini-moe", "--data", data, "--steps", a.steps, "--batch", a.batch,
                    "--seq", a.seq, "--threads", 1, "--peak-flops", "1e11", "--no-progress"]
            for ranks in (1, 2, 4):
                r = row(a.loom, ranks, base, env, os.path.join(tmp, "m%d.jsonl" % ranks))
                out["rows"].append(r)
                print("ep=%d: %8.0f tokens/s  all-to-all %5.1f%% of the step  imbalance %.2f  step %.1f ms"
                      % (ranks, r["tokens_per_s"], 100 * r["a2a_share"], r["imbalance"], r["step_ms"]))
            cfg = os.path.join(tmp, "one.json")
            with open(cfg, "w") as f:
                json.dump({"n_layer": 1, "n_head": 4, "n_embd": 256, "vocab_size": 256, "n_positions": 256,
                           "num_local_experts": 8, "num_experts_per_tok": 2}, f)
            one = row(a.loom, 1, ["--model", cfg] + base[2:], env, os.path.join(tmp, "one.jsonl"))
            tms = torch_moe_layer_ms(a.batch * a.seq, 256, 8, 1024, 2)
            out["layer"] = {"loom_1layer_step_ms": one["step_ms"], "torch_moe_layer_ms": tms,
                            "ratio": one["step_ms"] / tms}
            print("1-layer mini-moe step in loom %.1f ms (embedding, attention, MoE, head, AdamW) vs "
                  "PyTorch's MoE layer alone %.1f ms: ratio %.2f" % (one["step_ms"], tms, one["step_ms"] / tms))
    except BenchError as e:
        print("bench_moe: %s" % e, file=sys.stderr)
        return 1
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
