#!/usr/bin/python3
"""Training throughput of the Llama family, loom vs transformers on the same
machine: a Llama-shaped model of ~124M parameters (L12 C768, 12 query heads
over 4 key/value heads, SwiGLU 2048, vocabulary 32000, untied head) against
transformers' LlamaForCausalLM, and a Mixtral-shaped one (L4 C256, 8 SwiGLU
experts of 704, top 2, vocabulary 32000) against MixtralForCausalLM.

usage: bench/bench_families.py [--loom build/loom] [--models llama124m,mixtral]
                               [--shape 4x128] [--threads 2] [--runs 3] [--steps 5]
                               [--precision fp32,bf16]

Per model and precision the sides run ALTERNATELY (loom, torch, loom, torch,
...), --runs times each, every run a fresh process; a run's rate is the
median tokens/s of its steps after 2 warm-up steps; the table gives the
median over runs and the range (min-max), loom / torch of the medians, and
model FLOP/s against loom's measured best sgemm for that thread count (`loom
calibrate --force` at the start; bf16 rows against its bf16 GEMM peak):
6 N_active + 12 L C T FLOP per token, N_active the matmul parameters a token
meets (attention, its top-k experts' SwiGLU, router, LM head).

loom: `loom train --model CONFIG.json` (random init), --threads N,
OMP_NUM_THREADS=N, --precision fp32|bf16. PyTorch: transformers' model of the
same config in float32 (torch 1.13 has no torch.compile), eager attention,
torch.set_num_threads(N) with OpenBLAS on N threads or on one (the better per
run) and GOMP_SPINCOUNT=20000 as loom sets it; a step is forward,
cross-entropy, backward, clip_grad_norm_(1.0), AdamW, zero_grad; bf16:
torch.autocast("cpu", dtype=torch.bfloat16) around the forward. Both sides
train on byte-level tokens of the same text. The header prints the load
average before and after (other jobs share the machine).
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import TEXT, BenchError, cpu_model, median_after_warmup, random_batch, run  # noqa: E402
from bench_train import calibrate, loom_data  # noqa: E402

LR = 1e-4
BASE = dict(max_position_embeddings=2048, rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
            hidden_act="silu", vocab_size=32000)
MODELS = {
    "llama124m": dict(BASE, model_type="llama", hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                      num_attention_heads=12, num_key_value_heads=4),
    "mixtral": dict(BASE, model_type="mixtral", hidden_size=256, intermediate_size=704, num_hidden_layers=4,
                    num_attention_heads=4, num_key_value_heads=2, num_local_experts=8, num_experts_per_tok=2,
                    sliding_window=None, output_router_logits=False, router_aux_loss_coef=0.0),
}


def active_params(c):
    """Matmul parameters a token meets: attention, its top-k experts (or the dense MLP), router, LM head."""
    C, L, hd = c["hidden_size"], c["num_hidden_layers"], c["hidden_size"] // c["num_attention_heads"]
    attn = 2 * C * C + 2 * C * hd * c["num_key_value_heads"]
    k = c.get("num_experts_per_tok", 1) if "num_local_experts" in c else 1
    mlp = k * 3 * C * c["intermediate_size"] + (C * c["num_local_experts"] if "num_local_experts" in c else 0)
    return L * (attn + mlp) + c["vocab_size"] * C


def total_params(c):
    C, L, hd = c["hidden_size"], c["num_hidden_layers"], c["hidden_size"] // c["num_attention_heads"]
    E = c.get("num_local_experts", 1)
    attn = 2 * C * C + 2 * C * hd * c["num_key_value_heads"]
    return L * (attn + E * 3 * C * c["intermediate_size"] + 2 * C) + 2 * c["vocab_size"] * C + C


def flops_per_token(c, T):
    return 6.0 * active_params(c) + 12.0 * c["num_hidden_layers"] * c["hidden_size"] * T


def torch_worker(a):
    import numpy as np
    import torch
    import torch.nn.functional as F
    import transformers
    c = dict(MODELS[a.worker_model])
    arch = c.pop("model_type")
    cls = {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
           "mixtral": (transformers.MixtralConfig, transformers.MixtralForCausalLM)}[arch]
    torch.set_num_threads(a.worker_threads)
    torch.manual_seed(0)
    cfg = cls[0](**c)
    cfg._attn_implementation = "eager"
    model = cls[1](cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    with open(a.input, "rb") as f:
        tokens = np.frombuffer(f.read(), dtype=np.uint8)
    rng = np.random.default_rng(0)
    B, T = a.worker_B, a.worker_T
    rates = []
    for _ in range(a.steps_run):
        idx, tgt = random_batch(tokens, rng, B, T)
        t0 = time.perf_counter()
        if a.worker_bf16:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logits = model(idx).logits
        else:
            logits = model(idx).logits
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), tgt.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        rates.append(B * T / (time.perf_counter() - t0))
    print(json.dumps({"rate": median_after_warmup(rates)}))


def bench_torch(name, B, T, threads, steps, coretype, prec):
    best = 0.0
    for blas in ([threads, 1] if threads > 1 else [1]):
        env = dict(os.environ, OMP_NUM_THREADS=str(threads), OPENBLAS_NUM_THREADS=str(blas))
        env.setdefault("GOMP_SPINCOUNT", "20000")
        if coretype:
            env["OPENBLAS_CORETYPE"] = coretype
        p = run([sys.executable, os.path.abspath(__file__), "--worker-model", name, "--worker-B", B, "--worker-T",
                 T, "--worker-threads", threads, "--steps-run", steps, "--input", TEXT]
                + (["--worker-bf16"] if prec == "bf16" else []), env=env, what="torch run")
        best = max(best, json.loads(p.stdout.strip().splitlines()[-1])["rate"])
    return best


def bench_loom(loom, name, B, T, threads, steps, data, d, prec):
    model = os.path.join(d, name + ".json")
    with open(model, "w") as f:
        json.dump(MODELS[name], f)
    metrics = os.path.join(d, "m.jsonl")
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    run([loom, "train", "--model", model, "--data", data, "--steps", steps, "--batch", B, "--seq", T, "--lr",
         repr(LR), "--threads", threads, "--metrics", metrics, "--peak-flops", "1e12", "--precision", prec,
         "--no-progress", "--quiet"], env=env, what="loom train")
    with open(metrics) as f:
        rows = [r for r in (json.loads(x) for x in f if x.strip()) if "step" in r]
    if len(rows) != steps:
        raise BenchError("loom metrics have %d rows for %d steps" % (len(rows), steps))
    return median_after_warmup([float(r["tokens_per_s"]) for r in rows])


def stats(xs):
    return "%9.1f [%.1f-%.1f]" % (statistics.median(xs), min(xs), max(xs))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--loom", default=os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                                   "build", "loom"))
    ap.add_argument("--models", default="llama124m,mixtral")
    ap.add_argument("--shape", default="4x128")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--precision", default="fp32,bf16")
    ap.add_argument("--worker-model")
    ap.add_argument("--worker-B", type=int)
    ap.add_argument("--worker-T", type=int)
    ap.add_argument("--worker-threads", type=int)
    ap.add_argument("--worker-bf16", action="store_true")
    ap.add_argument("--steps-run", type=int)
    ap.add_argument("--input")
    a = ap.parse_args()
    if a.worker_model:
        return torch_worker(a)
    B, T = map(int, a.shape.split("x"))
    precs = a.precision.split(",")
    import torch
    import transformers
    print("machine: %s, %d CPUs; load average %.1f at start" % (cpu_model(), os.cpu_count(), os.getloadavg()[0]))
    print("torch %s, transformers %s, %d thread(s), B%d T%d, %d runs x %d steps" %
          (torch.__version__, transformers.__version__, a.threads, B, T, a.runs, a.steps), flush=True)
    peak = calibrate(a.loom, a.threads)
    print("loom calibrate: sgemm %.1f GFLOP/s (%s), bf16 GEMM %s GFLOP/s" %
          (peak[0] / 1e9, peak[1], "%.1f" % (peak[3] / 1e9) if peak[3] else "none"), flush=True)
    ok = True
    with tempfile.TemporaryDirectory() as d:
        data = loom_data(a.loom, TEXT, d)
        for name in a.models.split(","):
            c = MODELS[name]
            fpt = flops_per_token(c, T)
            print("\n[%s] %.1fM parameters, %.1fM active matmul, %.3g FLOP/token" %
                  (name, total_params(c) / 1e6, active_params(c) / 1e6, fpt), flush=True)
            rows = {(p, s): [] for p in precs for s in ("loom", "torch")}
            for r in range(a.runs):
                for p in precs:
                    try:
                        rows[(p, "loom")].append(bench_loom(a.loom, name, B, T, a.threads, a.steps, data, d, p))
                        rows[(p, "torch")].append(bench_torch(name, B, T, a.threads, a.steps, peak[1], p))
                    except BenchError as e:
                        ok = False
                        print("  run %d (%s) FAILED: %s" % (r + 1, p, e))
                print("  run %d done, load average %.1f" % (r + 1, os.getloadavg()[0]), flush=True)
            for p in precs:
                pk = peak[3] if p == "bf16" and peak[3] else peak[0]
                for s in ("loom", "torch"):
                    xs = rows[(p, s)]
                    if xs:
                        f = [100 * x * fpt / pk for x in xs]
                        print("  %-5s %-6s tok/s %s   model FLOP/s %5.1f%% [%.1f-%.1f] of the %s peak" %
                              (p, s, stats(xs), statistics.median(f), min(f), max(f), p))
                lo, to = rows[(p, "loom")], rows[(p, "torch")]
                if lo and to:
                    print("  %-5s loom / torch %.2f (run by run: %s)" %
                          (p, statistics.median(lo) / statistics.median(to),
                           ", ".join("%.2f" % (x / y) for x, y in zip(lo, to))))
            if "fp32" in precs and "bf16" in precs and rows[("fp32", "loom")] and rows[("bf16", "loom")]:
                print("  loom bf16 / fp32 %.2f" % (statistics.median(rows[("bf16", "loom")]) /
                                                  statistics.median(rows[("fp32", "loom")])))
    print("\nload average %.1f at the end" % os.getloadavg()[0])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
