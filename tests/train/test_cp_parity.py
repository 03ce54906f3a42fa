#!/usr/bin/env python3
"""Invariant 1 for context parallelism: --cp 2 and 4 (ring and Ulysses), 8 (ring,
and Ulysses on an 8-head variant of the model, as Ulysses needs heads / tp % cp = 0),
alone and with dp = 2, tp = 2 with and without sp, ZeRO 1, 2, 3 (sharded
over dp x cp) and pp = 2 (1f1b, zero-bubble), train the same model as one rank -
the loss at each of 10 steps within 1e-5 relative and every final parameter
tensor within 1e-5 (norm-wise relative). Layouts CP cannot take are refused
with exit 64 and a message naming the numbers. Each step's CP bytes in
--metrics equal the documented formula.

T = 512 on 4 heads of 16 channels: with cp = 4 each rank holds two chunks of
64 rows, with cp = 2 two of 128 - each slice spans several of the kernel's
64 x 64 attention tiles, and under the causal split every ring step meets
fully visible, diagonal and fully masked chunk pairs."""
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
import loomtest as lt  # noqa: E402

STEPS = 10
BATCH, SEQ = 2, 512
MODEL = {"n_layer": 2, "n_head": 4, "n_embd": 64, "vocab_size": 256, "n_positions": 512}
COMMON = ["--steps", STEPS, "--batch", BATCH, "--seq", SEQ, "--lr", "1e-3", "--warmup", 2,
          "--seed", 7, "--threads", 1, "--peak-flops", "1e11", "--no-progress"]

LAYOUTS = [  # (label, ranks, flags)
    ("cp=2 ring", 2, ["--cp", 2]),
    ("cp=4 ring", 4, ["--cp", 4, "--cp-impl", "ring"]),
    ("dp=2 cp=4 ring", 8, ["--dp", 2, "--cp", 4]),
    ("cp=8 ring", 8, ["--cp", 8]),
    ("tp=2 sp cp=2 ring", 4, ["--tp", 2, "--sp", "--cp", 2]),
    ("tp=2 cp=2 ulysses", 4, ["--tp", 2, "--cp", 2, "--cp-impl", "ulysses"]),
    ("cp=2 ulysses", 2, ["--cp", 2, "--cp-impl", "ulysses"]),
    ("cp=4 ulysses", 4, ["--cp", 4, "--cp-impl", "ulysses"]),
    ("dp=2 cp=2 zero=1", 4, ["--dp", 2, "--cp", 2, "--zero", 1]),
    ("cp=2 zero=2", 2, ["--cp", 2, "--zero", 2]),
    ("dp=2 cp=2 zero=3 ulysses", 4, ["--dp", 2, "--cp", 2, "--zero", 3, "--cp-impl", "ulysses"]),
    ("pp=2 cp=2 1f1b", 4, ["--pp", 2, "--cp", 2]),
    ("pp=2 cp=2 zb ulysses", 4, ["--pp", 2, "--cp", 2, "--schedule", "zb", "--cp-impl", "ulysses"]),
]

REFUSED = [  # (label, ranks, flags, words the one message must contain)
    ("ulysses heads", 3, ["--cp", 3, "--seq", 510, "--cp-impl", "ulysses"],
     ["cp=3", "n_head=4", "tp=1", "= 4"]),
    ("split", 4, ["--cp", 4, "--seq", 500], ["--seq 500", "2*cp=8"]),
    ("impl", 2, ["--cp", 2, "--cp-impl", "rings"], ["--cp-impl rings"]),
]


# Ulysses at cp = 8 needs 8 heads: the same model with 8 heads of 8 channels
MODEL8 = dict(MODEL, n_head=8)
LAYOUTS8 = [("cp=8 ulysses (8 heads)", 8, ["--cp", 8, "--cp-impl", "ulysses"])]


def flag(flags, name, default):
    return flags[flags.index(name) + 1] if name in flags else default


def check_cp_metrics(label, flags, metrics):
    """Rank 0's per-step CP bytes equal the formula of docs/context-parallel.md
    (ring: sent 8 B T_l C (3cp - 2) per layer; Ulysses: all-to-all 48 B T_l C),
    with B = batch/dp, T_l = seq/cp, C = n_embd/tp, L/pp layers; and the overlap
    summary is consistent (exposed <= total, hidden in [0, 1])."""
    dp, tp, pp, cp = (int(flag(flags, f, 1)) for f in ("--dp", "--tp", "--pp", "--cp"))
    impl = flag(flags, "--cp-impl", "ring")
    B, Tl, C, L = BATCH // dp, SEQ // cp, MODEL["n_embd"] // tp, MODEL["n_layer"] // pp
    want = 8 * B * Tl * C * (3 * cp - 2) * L if impl == "ring" else 48 * B * Tl * C * L
    op = "send" if impl == "ring" else "alltoall"
    for r in metrics:
        got = r["comm"]["cp"][op]["bytes"]
        lt.check(got == want, "%s step %d: cp %s bytes %d, formula %d" % (label, r["step"], op, got, want))
        o = r["cp"]
        lt.check(0 <= o["hidden"] <= 1 and o["exposed_ms"] <= o["ms"] + 1e-6,
                 "%s step %d: cp overlap summary %s" % (label, r["step"], o))


def run_layouts(tmp, ref_tag, common, layouts, only):
    """The one-rank run, then each layout against it (and its CP bytes)."""
    ref = lt.train(tmp, ref_tag, None, common)
    for label, np, flags in layouts:
        if only and label not in only:
            continue
        run = lt.train(tmp, label, np, common + flags)
        lt.compare_runs(ref[0], ref[1], run[0], run[1], label)
        check_cp_metrics(label, flags, lt.read_metrics(run[0]))


def main():
    only = sys.argv[1:]  # optional labels to run (debugging)
    with tempfile.TemporaryDirectory() as tmp:
        data = lt.make_text_data(tmp)
        model = lt.write_model(tmp, **MODEL)
        common = ["--model", model, "--data", data] + COMMON
        run_layouts(tmp, "ref", common, LAYOUTS, only)
        model8 = os.path.join(tmp, "model8")
        os.makedirs(model8)
        common8 = ["--model", lt.write_model(model8, **MODEL8), "--data", data] + COMMON
        run_layouts(tmp, "ref8", common8, LAYOUTS8, only)
        for label, np, flags, words in REFUSED:
            if only:
                continue
            p = lt.run(["train"] + common + flags, np=np, check_ok=False)
            lt.check(p.returncode == 64, "%s: exit %d, expected 64 (LOOM_EUSAGE)" % (label, p.returncode))
            lt.check(all(w in p.stderr for w in words), "%s: message lacks %s:\n%s"
                     % (label, words, p.stderr[-600:]))
    lt.done()


if __name__ == "__main__":
    main()
