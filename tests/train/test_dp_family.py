#!/usr/bin/env python3
"""The data-parallel family (DDP with buckets, gradient accumulation, ZeRO-1/2/3)
through the real `loom` binary, against one rank and against the formulas.

1. Invariant 1: dp = 1, 2, 4, 8 x --zero 0..3 x --grad-accum 1, 4, plus dp = 3
   (whose buckets need padding), tp = 2 x dp = 2 (with and without --sp) for
   every stage: the loss at each of 10 steps within 1e-5 relative of the
   one-rank run, and every final parameter tensor within 1e-5 norm-wise
   (||p - p_1|| / ||p_1||).
2. Per-rank memory in the JSONL "mem" field equals dp.h's formulas for each
   stage exactly (optimizer 8 S bytes, S = sum_b ceil(n_b / N) the padded
   shard, 8 Psi at zero 0; gradients and parameters per stage, staging and
   gather buffers included).
3. Bytes per step over dp in the JSONL "comm" field equal the theoretical
   volume of each stage exactly, per op (calls and bytes): zero 0 all-reduce
   Psi; zero 1 reduce-scatter P + all-gather P; zero 2 reduce-scatter P per
   micro-batch; zero 3 also all-gather P before each forward and backward;
   plus the trainer's 8-byte loss all-reduce and, when sharded, the 16-byte
   norm all-reduce; nothing at dp = 1.
The expected sizes come from the tiny model's parameter table rebuilt here
(every tensor padded to 16 floats, units in backward order), not from loom.

Early wte (dp.c): at zero 0 with dp > 1 and dp x B x T <= V / 2, the tied wte
is its own first bucket, reduced right after the head's backward, and the
last micro-batch's token-embedding rows and ids are all-gathered over dp
instead (two all-gathers of dp x B x T x (C + 1) x 4 bytes in all). The tiny
model (V = 256) takes that path at dp = 2 with --grad-accum 4 and at
tp = 2 x dp = 2 with --grad-accum 8, and the dense one elsewhere.
"""
import math
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
import loomtest as lt  # noqa: E402

STEPS = 10
# tiny: 2 layers, 4 heads, n_embd 64, vocab 256, n_positions 128 (src/model/config.c)
L, C, V, NPOS = 2, 64, 256, 128
# AdamW turns float32 rounding differences in near-zero gradients into parameter
# differences of up to lr per step; the data decides how many such elements
# there are. With this seed the one-rank run with --grad-accum 4 (only the
# summation order changes) sits near 1.5e-6 from --grad-accum 1; seed 11
# would put one element of h.0.mlp.c_proj.weight at 8.7e-6 already.
COMMON = ["--model", "tiny", "--steps", STEPS, "--seq", 16, "--lr", "1e-3", "--warmup", 2,
          "--seed", 5, "--grad-clip", "1.0", "--peak-flops", "1e11", "--no-progress"]
BATCH = 32  # dp = 8 x grad-accum 4: one sequence per micro-batch
BATCH3 = 24  # for dp = 3


def r16(n):
    return (n + 15) // 16 * 16


def early_rows(dp, zero, rows):
    """Rows per rank the early-wte path gathers (0: the dense path)."""
    return rows if zero == 0 and dp > 1 and dp * rows <= V // 2 else 0


def unit_sizes(early=False):
    """Floats of each unit in the order gradients complete: blocks L-1..0,
    outer (without wte when wte is reduced early, as its own bucket)."""
    wte = r16(V * C)
    outer = r16(NPOS * C) + 2 * r16(C) + (0 if early else wte)
    block = sum(r16(n) for n in (C, C, 3 * C * C, 3 * C, C * C, C, C, C, 4 * C * C, 4 * C, 4 * C * C, C))
    return [("block", block)] * L + [("outer", outer)]


def buckets(zero, bucket_mb, early=False):
    """[(n_b, has_outer)] in backward order: units taken greedily, a bucket
    closing once it reaches bucket_mb (one unit each at 0 and at zero 3);
    an early wte first, alone."""
    cap = 0 if zero == 3 else bucket_mb * 1024 * 1024 / 4
    out, cur, outer = ([(r16(V * C), True)] if early else []), 0, False
    for kind, n in unit_sizes(early):
        cur += n
        outer = outer or kind == "outer"
        if cur >= cap:
            out.append((cur, outer))
            cur, outer = 0, False
    if cur:
        out.append((cur, outer))
    return out


def expected(dp, zero, K, bucket_mb, rows):
    """Per-rank memory and per-step dp traffic {op: (calls, bytes)} of dp.h;
    rows = B x T of one micro-batch on one rank."""
    psi = sum(n for _, n in unit_sizes())
    er = early_rows(dp, zero, rows)
    bs = buckets(zero, bucket_mb, er > 0)
    N = dp if zero else 1
    S = [math.ceil(n / N) for n, _ in bs]
    P = [N * s for s in S]
    slots = [0, 0, 0]
    for i, ((n, outer), p) in enumerate(zip(bs, P)):
        k = 2 if outer else i % 2
        slots[k] = max(slots[k], p)
    scratch = max([p for (n, _), p in zip(bs, P) if p != n] + [0]) if zero == 1 else 0
    shard = sum(S)
    mem = {"optimizer": 8 * shard,
           "params": 4 * (shard + sum(slots)) if zero == 3 else 4 * psi,
           "grads": 4 * (shard + sum(slots)) if zero >= 2 else 4 * (psi + scratch + dp * er * (C + 1))}
    nb, PB = len(bs), 4 * sum(P)
    comm = {}  # nothing over dp at dp = 1 (the trainer skips its loss all-reduce too)
    if dp > 1:
        if zero == 0:
            comm["allreduce"] = (nb + 1, 4 * psi + 8)
            if er:
                comm["allgather"] = (2, 4 * dp * er * (C + 1))
        else:
            comm["allreduce"] = (2, 24)  # loss + the shards' sums of squares
            k_rs = K if zero >= 2 else 1
            comm["reduce_scatter"] = (nb * k_rs, PB * k_rs)
            comm["allgather"] = (2 * nb * K, 2 * PB * K) if zero == 3 else (nb, PB)
    return mem, comm, nb


def check_accounting(label, metrics, dp, zero, K, bucket_mb, rows):
    mem, comm, nb = expected(dp, zero, K, bucket_mb, rows)
    rows = lt.read_metrics(metrics)
    got = rows[-1]["mem"]
    for k, v in mem.items():
        lt.check(got[k] == v, "%s: mem.%s = %d bytes, formula says %d" % (label, k, got[k], v))
    for row in rows:
        dpc = row["comm"].get("dp", {})
        ops = {op: (d["calls"], d["bytes"]) for op, d in dpc.items() if d["calls"]}
        lt.check(ops == comm, "%s step %d: dp traffic %s, theory %s" % (label, row["step"], ops, comm))
        t = row.get("dp")  # engine timings, where the trainer reports them
        if t is not None and dp > 1:
            want = nb * (K if zero >= 2 else 1)
            lt.check(t["reductions"] == want, "%s: %d gradient reductions, expected %d" % (label, t["reductions"], want))
            padded = zero == 1 and any(n % dp for n, _ in buckets(zero, bucket_mb))
            if not padded:
                lt.check(t["overlapped"] == want,
                         "%s: %d of %d reductions started during the backward" % (label, t["overlapped"], want))


def main():
    with tempfile.TemporaryDirectory() as tmp:
        data = lt.make_text_data(tmp)

        def train(tag, np, flags):
            m, p = os.path.join(tmp, tag + ".jsonl"), os.path.join(tmp, tag + ".safetensors")
            lt.run(["train", "--data", data, "--metrics", m, "--save-params", p] + COMMON + flags, np=np)
            return m, p

        ref = train("ref", None, ["--batch", BATCH])
        losses = [r["loss"] for r in lt.read_metrics(ref[0])]
        lt.check(losses[-1] < losses[0] - 0.3, "training must learn: loss %.3f -> %.3f" % (losses[0], losses[-1]))
        for dp in (1, 2, 4, 8):
            for zero in (0, 1, 2, 3):
                for K in (1, 4):
                    mb = 0 if K == 1 else 0.2  # 0.2 MB: both blocks share a bucket
                    label = "dp=%d zero=%d accum=%d bucket=%gMB" % (dp, zero, K, mb)
                    run = train("dp%d_z%d_k%d" % (dp, zero, K), dp if dp > 1 else None,
                                ["--batch", BATCH, "--dp", dp, "--zero", zero, "--grad-accum", K,
                                 "--bucket-mb", mb])
                    lt.compare_runs(ref[0], ref[1], run[0], run[1], label)
                    check_accounting(label, run[0], dp, zero, K, mb, BATCH // dp // K * 16)
        for zero in (0, 1, 2, 3):
            # --grad-accum 8: 2 x 16 rows per micro-batch, so zero 0 takes the
            # early-wte path with the vocabulary split (V_l = 128)
            for flags in (["--tp", 2, "--grad-accum", 8], ["--tp", 2, "--sp", "--grad-accum", 8]):
                label = "tp=2%s dp=2 zero=%d" % (" sp" if "--sp" in flags else "", zero)
                run = train(label.replace(" ", "_").replace("=", ""), 4,
                            ["--batch", BATCH, "--dp", 2, "--zero", zero, "--bucket-mb", 0] + flags)
                lt.compare_runs(ref[0], ref[1], run[0], run[1], label)
                gathers = lt.read_metrics(run[0])[-1]["comm"].get("dp", {}).get("allgather", {})
                want = (2, 4 * 2 * 32 * (C + 1)) if zero == 0 else None
                if want:
                    got = (gathers.get("calls"), gathers.get("bytes"))
                    lt.check(got == want, "%s: embedding-row gathers %s, expected %s" % (label, got, want))
        ref3 = train("ref3", None, ["--batch", BATCH3])
        for zero, K, mb in ((0, 1, 0), (1, 1, 0), (1, 4, 0.2), (2, 1, 0), (2, 4, 0.2), (3, 1, 0), (3, 4, 0)):
            label = "dp=3 zero=%d accum=%d bucket=%gMB (padded)" % (zero, K, mb)
            run = train("dp3_z%d_k%d" % (zero, K), 3,
                        ["--batch", BATCH3, "--dp", 3, "--zero", zero, "--grad-accum", K, "--bucket-mb", mb])
            lt.compare_runs(ref3[0], ref3[1], run[0], run[1], label)
            check_accounting(label, run[0], 3, zero, K, mb, BATCH3 // 3 // K * 16)
    lt.done()


if __name__ == "__main__":
    main()
