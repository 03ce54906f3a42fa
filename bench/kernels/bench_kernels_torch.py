#!/usr/bin/python3
"""Per-op timings in PyTorch for the shapes bench_kernels.c times in loom.

usage: bench/kernels/bench_kernels_torch.py [B T C NH V [threads [layers]]]

Each op is timed forward, and backward as autograd runs it (backward of the
op alone, gradients accumulating into .grad as in a training step), median
of 15 after a warm-up, in milliseconds. The ops are written as
tests/oracle/torch_gpt2.py writes them (matmul + bias, masked softmax
attention, F.gelu tanh, F.layer_norm, F.cross_entropy, torch.optim.AdamW).
"""

import math
import os
import statistics
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

REPS = 15


def med_ms(fn):
    fn()
    ts = []
    for _ in range(REPS):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


def leaf(*shape):
    return (torch.rand(*shape) * 2 - 1).requires_grad_(True)


def fwd_bwd(name, f, inputs, count, rows):
    out = f(*inputs)
    dout = torch.rand_like(out)
    tf = med_ms(lambda: f(*inputs))
    tb = med_ms(lambda: out.backward(dout, retain_graph=True))
    rows.append((name + " fwd", tf, count))
    rows.append((name + " bwd", tb, count))


def attention(qkv, B, T, C, NH):
    HS = C // NH
    q, k, v = qkv.split(C, dim=2)
    q = q.view(B, T, NH, HS).transpose(1, 2)
    k = k.view(B, T, NH, HS).transpose(1, 2)
    v = v.view(B, T, NH, HS).transpose(1, 2)
    att = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(HS))
    mask = torch.ones(T, T, dtype=torch.bool).triu(1)
    att = torch.softmax(att.masked_fill(mask, float("-inf")), dim=-1)
    return torch.matmul(att, v).transpose(1, 2).contiguous().view(B, T, C)


def main():
    a = [int(x) for x in sys.argv[1:]]
    B, T, C, NH, V = a[:5] if len(a) >= 5 else (8, 256, 256, 4, 256)
    threads = a[5] if len(a) >= 6 else 1
    layers = a[6] if len(a) >= 7 else 4
    torch.set_num_threads(threads)
    N = B * T
    rows = []
    x = leaf(B, T, C)
    w, b = leaf(C), leaf(C)
    fwd_bwd("layernorm", lambda x: F.layer_norm(x, (C,), w, b, 1e-5), [x], 2, rows)
    fwd_bwd("matmul qkv", lambda x, w, b: torch.matmul(x, w) + b,
            [x, leaf(C, 3 * C), leaf(3 * C)], 1, rows)
    fwd_bwd("attention", lambda q: attention(q, B, T, C, NH), [leaf(B, T, 3 * C)], 1, rows)
    fwd_bwd("matmul proj", lambda x, w, b: torch.matmul(x, w) + b, [x, leaf(C, C), leaf(C)], 1,
            rows)
    fwd_bwd("residual", lambda a, b: a + b, [x, leaf(B, T, C)], 2, rows)
    fwd_bwd("matmul fc", lambda x, w, b: torch.matmul(x, w) + b,
            [x, leaf(C, 4 * C), leaf(4 * C)], 1, rows)
    fwd_bwd("gelu", lambda h: F.gelu(h, approximate="tanh"), [leaf(B, T, 4 * C)], 1, rows)
    fwd_bwd("matmul fcproj", lambda h, w, b: torch.matmul(h, w) + b,
            [leaf(B, T, 4 * C), leaf(4 * C, C), leaf(C)], 1, rows)
    block = sum(t * c for _, t, c in rows)
    print("torch %s: B=%d T=%d C=%d NH=%d V=%d, %d thread(s), median of %d" %
          (torch.__version__, B, T, C, NH, V, threads, REPS))
    print("block (per layer, x%d):" % layers)
    for name, t, c in rows:
        print("  %-26s %9.3f ms  x%d" % (name, t, c))
    print("  %-26s %9.3f ms" % ("block total", block))

    rows = []
    wte = leaf(V, C)
    tok = torch.randint(0, V, (B, T))
    fwd_bwd("encoder", lambda wte, wpe: wte[tok] + wpe[:T], [wte, leaf(T, C)], 1, rows)
    fwd_bwd("lm head", lambda x, wte: torch.matmul(x, wte.t()), [x, wte], 1, rows)
    tgt = torch.randint(0, V, (N,))
    fwd_bwd("softmax_xent", lambda z: F.cross_entropy(z, tgt), [leaf(N, V)], 1, rows)
    nparams = V * C + T * C + layers * (12 * C * C + 13 * C) + 2 * C
    p = torch.nn.Parameter(torch.rand(nparams))
    p.grad = torch.rand(nparams)
    opt = torch.optim.AdamW([p], lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    rows.append(("adamw (all params)", med_ms(opt.step), 1))
    print("once per step:")
    for name, t, c in rows:
        print("  %-26s %9.3f ms  x%d" % (name, t, c))
    step = block * layers + sum(t * c for _, t, c in rows)
    print("params %d; estimated step %.2f ms = %.0f tokens/s (ops only)" %
          (nparams, step, N / step * 1e3))


if __name__ == "__main__":
    main()
