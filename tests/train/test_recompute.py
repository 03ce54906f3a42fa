"""--recompute none|selective|full (issue 13): same numbers, less memory.

1. Bitwise: on a small model, selective and full recompute give exactly the
   losses of every step (as printed in --metrics) and exactly the final
   parameter bytes of the run without recompute: one rank, tp=2 (the
   recomputed forward redoes its collectives), pp=2 1f1b (selective and
   full: several micro-batches share the recomputed set) and dp=2 ZeRO-3
   (full: the recompute runs on the parameters the hooks gathered); pp=2 zb
   and zbv with full (the split backward recomputes in B and again in W),
   also under dp=2 ZeRO-3. The pipeline partitioner charges full
   recompute to the blocks (not the LM head): a heavy head gets more blocks
   beside it with full than with none.
2. Memory, measured by the kernel (peak RSS of each run under
   tests/lib/peak_rss.py): on a long-sequence config (T = 512, six blocks)
   each mode runs at batch 1 and 3; the difference of the two peaks is the
   activation memory of two sequences (parameters, optimizer state and
   libraries cancel). Asserted: full <= 0.5 x none, and selective within
   10 % of none: with the online-softmax attention kernel nothing T x T is
   ever stored, so selective recompute (Korthikanti's: drop the attention
   probabilities) has nothing left to drop - attention's backward always
   recomputes them from q, k, v and the saved log-sum-exp.
"""
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import loomtest as lt  # noqa: E402

SMALL = {"n_layer": 4, "n_head": 4, "n_embd": 64, "vocab_size": 256, "n_positions": 64}
LONG = {"n_layer": 6, "n_head": 4, "n_embd": 64, "vocab_size": 256, "n_positions": 512}


def same_run(ref, other, label):
    (m0, p0), (m1, p1) = ref, other
    l0 = [r["loss"] for r in lt.read_metrics(m0)]
    l1 = [r["loss"] for r in lt.read_metrics(m1)]
    lt.check(len(l0) == len(l1) > 0 and l0 == l1, "%s: losses %s vs %s" % (label, l1, l0))
    lt.check(open(p0, "rb").read() == open(p1, "rb").read(), "%s: final parameters differ" % label)


with tempfile.TemporaryDirectory() as tmp:
    data = lt.make_text_data(tmp)
    small = os.path.join(tmp, "small.json")
    with open(small, "w") as f:
        json.dump(SMALL, f)
    common = ["--model", small, "--data", data, "--steps", 3, "--batch", 4, "--seq", 64, "--threads", 1,
              "--peak-flops", "1e11", "--no-progress", "--lr", "1e-3"]
    ref = lt.train(tmp, "none", None, common + ["--recompute", "none"])
    for mode in ("selective", "full"):
        same_run(ref, lt.train(tmp, mode, None, common + ["--recompute", mode]), mode)
    ref_tp = lt.train(tmp, "tp2_none", 2, common + ["--tp", 2, "--recompute", "none"])
    same_run(ref_tp, lt.train(tmp, "tp2_full", 2, common + ["--tp", 2, "--recompute", "full"]), "tp=2 full")
    ref_pp = lt.train(tmp, "pp2_none", 2, common + ["--pp", 2, "--micro-batches", 2])
    same_run(ref_pp, lt.train(tmp, "pp2_sel", 2, common + ["--pp", 2, "--micro-batches", 2, "--recompute",
                                                             "selective"]), "pp=2 selective")
    same_run(ref_pp, lt.train(tmp, "pp2_full", 2, common + ["--pp", 2, "--micro-batches", 2, "--recompute",
                                                              "full"]), "pp=2 full")
    ref_z3 = lt.train(tmp, "z3_none", 2, common + ["--dp", 2, "--zero", 3])
    same_run(ref_z3, lt.train(tmp, "z3_full", 2, common + ["--dp", 2, "--zero", 3, "--recompute", "full"]),
             "dp=2 zero-3 full")
    # the partitioner charges full recompute to the blocks, not the LM head: a
    # head worth ~9 blocks (V 8192, C 64) gets fewer blocks beside it with
    # none (11,1) than with full recompute (9,3)
    heavy = os.path.join(tmp, "heavy_head.json")
    with open(heavy, "w") as f:
        json.dump(dict(SMALL, n_layer=12, vocab_size=8192), f)
    for mode, want in (("none", "11,1"), ("full", "9,3")):
        p = lt.run(["train", "--model", heavy, "--data", data, "--steps", 1, "--batch", 2, "--seq", 64,
                    "--threads", 1, "--peak-flops", "1e11", "--no-progress", "--pp", 2, "--micro-batches", 2,
                    "--recompute", mode], np=2)
        lt.check("blocks per virtual stage %s\n" % want in p.stderr + p.stdout,
                 "pp=2 --recompute %s: expected blocks %s: %s" % (mode, want, (p.stderr + p.stdout)[-600:]))
    # the split backward with full recompute: B recomputes each block, W once
    # more (B's set went to the blocks before it); bitwise the run without
    for sched in ("zb", "zbv"):
        pp_flags = ["--pp", 2, "--micro-batches", 4, "--schedule", sched]
        ref_zb = lt.train(tmp, "pp2_%s_none" % sched, 2, common + pp_flags)
        same_run(ref_zb, lt.train(tmp, "pp2_%s_full" % sched, 2, common + pp_flags + ["--recompute", "full"]),
                 "pp=2 %s full" % sched)
    z3_zb = ["--dp", 2, "--zero", 3, "--pp", 2, "--micro-batches", 2, "--schedule", "zb"]
    same_run(lt.train(tmp, "z3_zb_none", 4, common + z3_zb),
             lt.train(tmp, "z3_zb_full", 4, common + z3_zb + ["--recompute", "full"]), "dp=2 zero-3 pp=2 zb full")

    longm = os.path.join(tmp, "long.json")
    with open(longm, "w") as f:
        json.dump(LONG, f)
    act = {}
    for mode in ("none", "selective", "full"):
        rss = []
        for b in (1, 3):
            rss.append(lt.peak_rss(tmp, "%s_b%d" % (mode, b), 1,
                                   ["train", "--model", longm, "--data", data, "--steps", 1, "--batch", b,
                                    "--seq", 512, "--threads", 1, "--peak-flops", "1e11", "--no-progress",
                                    "--recompute", mode])[0])
        act[mode] = rss[1] - rss[0]
        print("%-9s peak RSS b=1 %.1f MB, b=3 %.1f MB: activations of 2 sequences %.1f MB" %
              (mode, rss[0] / 1e6, rss[1] / 1e6, act[mode] / 1e6))
    lt.check(act["none"] > 0, "activation memory grows with the batch: %s" % act)
    lt.check(act["full"] <= 0.5 * act["none"], "full %.1f MB > 0.5 x none %.1f MB" %
             (act["full"] / 1e6, act["none"] / 1e6))
    lt.check(abs(act["selective"] - act["none"]) <= 0.1 * act["none"],
             "selective %.1f MB vs none %.1f MB: expected the same (no T x T buffer to drop)" %
             (act["selective"] / 1e6, act["none"] / 1e6))
lt.done()
