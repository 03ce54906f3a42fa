#!/usr/bin/env python3
"""Invariant 4 for tensor and sequence parallelism: the bytes the TP group
moves in one training step, per op, equal the theoretical volume exactly.

Notation: L blocks, h = n_embd, s = sequence length, b = sequences per
micro-batch on one DP rank (--batch / dp / --grad-accum),
N = b*s rows, K = --grad-accum, t = tp > 1. A "B.s.h activation" is N*h
float32 = 4*N*h bytes. Byte accounting is comm.h's: all-reduce counts its
buffer, reduce-scatter its full input, all-gather its full output, so one
all-reduce of an activation and one reduce-scatter or all-gather of it all
count 4*N*h bytes (an all-reduce is a reduce-scatter + an all-gather).

Per micro-batch, from src/model/gpt.c (Megatron's conjugate regions: f =
col_in, identity forward / sum backward; g = row_out, sum forward /
identity backward):

  where                         without SP             with SP
  embedding fwd   g (row_out)   all-reduce  N*h        reduce-scatter N*h
  block fwd, x2   f (col_in)    -                      all-gather     N*h
  block fwd, x2   g (row_out)   all-reduce  N*h        reduce-scatter N*h
  head fwd        f (col_in)    -                      all-gather     N*h
  cross-entropy   max           all-reduce  N (MAX)    same
  cross-entropy   sum-exp, tgt  all-reduce  2N (SUM)   same
  head bwd        f (col_in)    all-reduce  N*h        reduce-scatter N*h
  block bwd, x2   g (row_out)   -                      all-gather     N*h
  block bwd, x2   f (col_in)    all-reduce  N*h        reduce-scatter N*h
  embedding bwd   g (row_out)   -                      all-gather     N*h
  block bwd W, x2 re-gather LN  -                      all-gather     N*h
  head bwd W      re-gather LN  -                      all-gather     N*h

With SP a block keeps only its rank's rows of the LayerNorm outputs (ln_1,
ln_2, ln_f); the weight gradients of the column-parallel matmuls (c_attn,
c_fc, the LM head) need all N rows, so backward all-gathers them again
(Megatron's trade: 2L+1 more all-gathers per micro-batch for (N,h) floats
less memory per block). A split backward (zero-bubble, not run here) also
re-gathers the two row-parallel output gradients per block in W.

Once per step:
  SP grads (loom_gpt_finish_grads, SP only): one all-reduce per parameter
      whose gradient is partial over the sequence shards: ln_1.{w,b},
      ln_2.{w,b} of each block (h floats each), wpe (s*h: only the rows of
      positions < s, the others get no gradient on any rank),
      ln_f.{w,b} (h each): 4L+3 calls, 4*(4L*h + s*h + 2h) bytes;
  grad norm (loom_dp_grad_norm): one all-reduce of 1 double (the sum of
      squares of the split gradients): 8 bytes.

Totals per step on each TP rank:
  without SP: all-reduce      K*(4L+4) + 1 calls,
                              K*(4*N*h*(4L+2) + 12*N) + 8 bytes
  with SP:    all-gather      K*(6L+3) calls, K*4*N*h*(6L+3) bytes
              reduce-scatter  K*(4L+2) calls, K*4*N*h*(4L+2) bytes
              all-reduce      2K + 4L+3 + 1 calls,
                              K*12*N + 4*h*(4L+2+s) + 8 bytes
and the TP group issues no other op. The test runs the real binary for a few
layouts and compares these with the "comm" -> "tp" counters of every step of
the --metrics JSONL (rank 0's; every TP rank issues the same collectives)."""
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
import loomtest as lt  # noqa: E402

MODEL = {"n_layer": 2, "n_head": 8, "n_embd": 64, "vocab_size": 253, "n_positions": 64}
STEPS = 2
COMMON = ["--steps", STEPS, "--seq", 32, "--seed", 3, "--threads", 1, "--peak-flops", "1e11",
          "--no-progress"]

LAYOUTS = [  # (label, ranks, tp, dp, sp, global batch, grad-accum)
    ("tp=2", 2, 2, 1, False, 4, 1),
    ("tp=2 sp", 2, 2, 1, True, 4, 1),
    ("tp=4", 4, 4, 1, False, 2, 1),
    ("tp=4 sp", 4, 4, 1, True, 2, 1),
    ("dp=2 tp=2", 4, 2, 2, False, 8, 1),
    ("dp=2 tp=2 sp", 4, 2, 2, True, 8, 1),
    ("tp=2 sp grad-accum=2", 2, 2, 1, True, 4, 2),
]


def theory(cfg, tp, dp, sp, batch, seq, accum):
    """{op: (calls, bytes)} the TP group issues in one step (see the docstring)."""
    L, h, s = cfg["n_layer"], cfg["n_embd"], seq
    b = batch // dp // accum
    N, K = b * seq, accum
    act = 4 * N * h  # bytes of one B.s.h activation
    n_act = 4 * L + 2  # activation collectives per micro-batch (fwd + bwd)
    n_regather = 2 * L + 1  # SP: LayerNorm outputs gathered again for the weight gradients
    xent = (2, 4 * N + 8 * N)  # max (N floats) + sum-exp and target logit (2N floats)
    norm = (1, 8)
    if tp == 1:
        return {}
    if not sp:
        return {"allreduce": (K * (n_act + xent[0]) + norm[0],
                              K * (n_act * act + xent[1]) + norm[1])}
    sp_grads = (4 * L + 3, 4 * (4 * L * h + s * h + 2 * h))
    return {
        "allgather": (K * (n_act + n_regather), K * (n_act + n_regather) * act),
        "reduce_scatter": (K * n_act, K * n_act * act),
        "allreduce": (K * xent[0] + sp_grads[0] + norm[0], K * xent[1] + sp_grads[1] + norm[1]),
    }


def main():
    with tempfile.TemporaryDirectory() as tmp:
        data = lt.make_text_data(tmp)
        model = os.path.join(tmp, "config.json")
        with open(model, "w") as f:
            json.dump(MODEL, f)
        for label, np, tp, dp, sp, batch, accum in LAYOUTS:
            metrics = os.path.join(tmp, label.replace(" ", "_").replace("=", "") + ".jsonl")
            flags = ["--tp", tp, "--dp", dp, "--batch", batch, "--grad-accum", accum] + (["--sp"] if sp else [])
            lt.run(["train", "--model", model, "--data", data, "--metrics", metrics] + COMMON + flags, np=np)
            want = theory(MODEL, tp, dp, sp, batch, 32, accum)
            steps = lt.read_metrics(metrics)
            lt.check(len(steps) == STEPS, "%s: %d steps logged, expected %d" % (label, len(steps), STEPS))
            for m in steps:
                got = {op: (v["calls"], v["bytes"]) for op, v in m["comm"].get("tp", {}).items()}
                lt.check(got == want, "%s step %d: tp group moved %s, theory says %s"
                         % (label, m["step"], json.dumps(got, sort_keys=True), json.dumps(want, sort_keys=True)))
            print("%-22s tp per step: %s" % (label, "  ".join(
                "%s %d calls %d B" % (op, c, b) for op, (c, b) in sorted(want.items()))))
    lt.done()


if __name__ == "__main__":
    main()
