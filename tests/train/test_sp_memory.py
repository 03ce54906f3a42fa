#!/usr/bin/env python3
"""Per-rank activation memory under tensor and sequence parallelism: the
"mem" -> "activations" of the --metrics JSONL (bytes of the model's
activation arena on a rank) equals the documented formula exactly, and with
--sp it is smaller than without at the same tp.

The formula (docs/parallelism.md, "Activation memory") is the plan of
layout_slot / layout_acts in src/model/gpt.c for one activation slot (what
`loom train` uses), with every allocation rounded up to 64 bytes by
src/core/arena.c. Notation: L blocks, h = n_embd, V = vocab_size, heads a,
t = tp, b = --batch / dp / --grad-accum, s = --seq, N = b*s, Nx = N/t with
--sp and N without, h_t = h/t, a_t = a/t, V_t = ceil(V/t), r(x) = x rounded
up to a multiple of 64, f(n) = r(4n) (n float32), threads = --threads.

  slot      2 r(4N) [inputs, targets] + 2 f(Nx h) [x, dx]
  per block 4 f(Nx h) [ln1, res2, ln2, res3] + 4 f(Nx) [LN means, rstds]
            + f(3N h_t) [qkv] + f(N h_t) [atty] + f(b a_t s^2) [att]
            + 2 f(4N h_t) [fch, fch_gelu]
            + SP only: 2 f(N h) [ln1g, ln2g: gathered LN outputs]
  head      f(Nx h) [lnf] + 2 f(Nx) + f(N V_t) [logits] + f(N) [losses]
            + SP only: f(N h) [lnfg]
  shared    2 f(Nx h) [dres, dlnf] + f(N h) [dlnfull] + [SP] f(N h) [dfull]
            + f(4N h_t) [d4c] + f(N h_t) [datty] + f(N) [xmax] + f(2N) [xsum]
  scratch   2 f(N h) [dfcp, dproj] + f(4N h_t) [dfch] + f(3N h_t) [dqkv]
            + 2 f(Nx h) [dln2, dln1]
  attention f(s^2 threads)

  activations = slot + L * block + head + shared + scratch + attention

The model's sizes are chosen so that several allocations are not multiples
of 64 bytes (h = 72, N = 60, Nx = 15, V_t = 127): the rounding is exercised,
and the test checks that the formula without it would be wrong."""
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
import loomtest as lt  # noqa: E402

MODEL = {"n_layer": 2, "n_head": 8, "n_embd": 72, "vocab_size": 253, "n_positions": 64}
THREADS = 1
COMMON = ["--steps", 1, "--seed", 3, "--threads", THREADS, "--peak-flops", "1e11", "--no-progress"]

CONFIGS = [  # (label, tp, dp, global batch, seq)
    ("tp=1", 1, 1, 3, 20),
    ("tp=2", 2, 1, 3, 20),
    ("tp=4", 4, 1, 3, 20),
    ("tp=4 b=2 s=32", 4, 1, 2, 32),
    ("dp=2 tp=2", 2, 2, 6, 20),
]


def activation_bytes(cfg, tp, sp, b, s, threads, align=64):
    """The formula of the docstring (align=1: the same without the rounding)."""
    L, h, a, V = cfg["n_layer"], cfg["n_embd"], cfg["n_head"], cfg["vocab_size"]
    N = b * s
    Nx = N // tp if sp else N
    ht, at, Vt = h // tp, a // tp, -(-V // tp)

    def r(x):
        return -(-x // align) * align

    def f(n):
        return r(4 * n)

    slot = 2 * r(4 * N) + 2 * f(Nx * h)
    block = (4 * f(Nx * h) + 4 * f(Nx) + f(3 * N * ht) + f(N * ht) + f(b * at * s * s)
             + 2 * f(4 * N * ht) + (2 * f(N * h) if sp else 0))
    head = f(Nx * h) + 2 * f(Nx) + f(N * Vt) + f(N) + (f(N * h) if sp else 0)
    shared = (2 * f(Nx * h) + f(N * h) + (f(N * h) if sp else 0) + f(4 * N * ht) + f(N * ht)
              + f(N) + f(2 * N))
    scratch = 2 * f(N * h) + f(4 * N * ht) + f(3 * N * ht) + 2 * f(Nx * h)
    return slot + L * block + head + shared + scratch + f(s * s * threads)


def main():
    rounding_matters = False
    with tempfile.TemporaryDirectory() as tmp:
        data = lt.make_text_data(tmp)
        model = os.path.join(tmp, "config.json")
        with open(model, "w") as f:
            json.dump(MODEL, f)

        def measure(tag, tp, dp, batch, seq, sp):
            metrics = os.path.join(tmp, tag + ".jsonl")
            flags = ["--tp", tp, "--dp", dp, "--batch", batch, "--seq", seq] + (["--sp"] if sp else [])
            np = tp * dp
            lt.run(["train", "--model", model, "--data", data, "--metrics", metrics] + COMMON + flags,
                   np=np if np > 1 else None)
            return lt.read_metrics(metrics)[0]["mem"]["activations"]

        for label, tp, dp, batch, seq in CONFIGS:
            b = batch // dp
            tag = label.replace(" ", "_").replace("=", "")
            got = {}
            for sp in ([False, True] if tp > 1 else [False]):
                got[sp] = measure(tag + ("_sp" if sp else ""), tp, dp, batch, seq, sp)
                want = activation_bytes(MODEL, tp, sp, b, seq, THREADS)
                name = label + (" sp" if sp else "")
                lt.check(got[sp] == want, "%s: activations %d bytes, formula says %d" % (name, got[sp], want))
                if activation_bytes(MODEL, tp, sp, b, seq, THREADS, align=1) != want:
                    rounding_matters = True
            if tp > 1:
                lt.check(got[True] < got[False], "%s: activations with --sp (%d bytes) not smaller than "
                         "without (%d)" % (label, got[True], got[False]))
                print("%-14s activations per rank: %9d B, with --sp %9d B (%.1f%% less)" % (
                    label, got[False], got[True], 100.0 * (got[False] - got[True]) / got[False]))
            else:
                print("%-14s activations per rank: %9d B" % (label, got[False]))
    lt.check(rounding_matters, "no config exercises the 64-byte rounding")
    lt.done()


if __name__ == "__main__":
    main()
