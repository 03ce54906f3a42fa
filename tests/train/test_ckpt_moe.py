#!/usr/bin/env python3
"""Checkpoints of an expert-parallel MoE model (docs/checkpoints.md).

tiny-moe (4 experts, top-2). dp2 x ep2 on 2 ranks (each rank holds 2
experts in the EP engine's storage): 20 steps straight (saving at 10 and
20) against 10 + --resume DIR/step_10 + 10: the 10 resumed losses and every
final parameter are bitwise equal, and the step-10 manifest holds every
global element of every tensor (all 4 experts' params, exp_avg, exp_avg_sq)
exactly once.

Resharding: that ep2 checkpoint resumed on one rank (ep 1), and a one-rank
(ep 1) checkpoint resumed at dp2 x ep2: the 10 resumed losses and the final
parameters agree with the uninterrupted one-rank run within 1e-5 (one rank
with --grad-accum 2: its micro-batches are the dp ranks' routing groups)."""
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
sys.path.insert(0, os.path.dirname(__file__))
import loomtest as lt  # noqa: E402
import numpy as np  # noqa: E402
from test_ckpt_resume import check_manifest, losses  # noqa: E402

COMMON = ["--model", "tiny-moe", "--steps", 20, "--batch", 8, "--seq", 16, "--lr", "1e-3", "--warmup", 2,
          "--seed", 9, "--peak-flops", "1e11", "--no-progress", "--quiet"]
EP2 = ["--dp", 2, "--ep", 2]
ONE = ["--grad-accum", 2]  # one rank, the same routing groups as micro-batches (test_ep_parity.py)


def close(label, ref_m, ref_p, m, p):
    a, b = losses(ref_m), losses(m)
    lt.check(sorted(b) == list(range(11, 21)), "%s: resumed steps %s" % (label, sorted(b)))
    worst = max(abs(a[s] - b[s]) for s in b)
    lt.check(worst <= 1e-5, "%s: resumed losses differ by %g" % (label, worst))
    pa, _ = lt.st.load(ref_p)
    pb, _ = lt.st.load(p)
    lt.check(sorted(pa) == sorted(pb), "%s: parameter names differ" % label)
    dp = max(float(np.max(np.abs(pa[k] - pb[k]))) for k in pa)
    lt.check(dp <= 1e-5, "%s: final parameters differ by %g" % (label, dp))
    print("%s: losses within %.2g, parameters within %.2g" % (label, worst, dp))


def main():
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        data = lt.make_text_data(tmp)
        common = ["--data", data] + COMMON
        ck2, ck1 = os.path.join(tmp, "ck_ep2"), os.path.join(tmp, "ck_one")
        m2, p2 = lt.train(tmp, "ep2_straight", 2, common + EP2 + ["--save-dir", ck2, "--save-every", 10])
        check_manifest(os.path.join(ck2, "step_10"), "dp2 ep2")
        rm, rp = lt.train(tmp, "ep2_resumed", 2, common + EP2 + ["--resume", os.path.join(ck2, "step_10")])
        a, b = losses(m2), losses(rm)
        lt.check(sorted(b) == list(range(11, 21)), "ep2: resumed steps %s" % sorted(b))
        lt.check(all(b[s] == a[s] for s in b), "ep2: resumed losses not bitwise equal: %s" % (
            [(s, a[s], b[s]) for s in b if a[s] != b[s]]))
        pa, _ = lt.st.load(p2)
        pb, _ = lt.st.load(rp)
        diff = [k for k in pa if not np.array_equal(pa[k], pb[k])]
        lt.check(not diff, "ep2: final parameters not bitwise equal: %s" % diff[:5])
        print("dp2 ep2: 10 resumed steps and final parameters bitwise equal")
        m1, p1 = lt.train(tmp, "one_straight", None, common + ONE + ["--save-dir", ck1, "--save-every", 10])
        m, p = lt.train(tmp, "ep2_to_one", None, common + ONE + ["--resume", os.path.join(ck2, "step_10")])
        close("ep2 -> ep1", m1, p1, m, p)
        m, p = lt.train(tmp, "one_to_ep2", 2, common + EP2 + ["--resume", os.path.join(ck1, "step_10")])
        close("ep1 -> ep2", m1, p1, m, p)
    print("total %.1f s" % (time.time() - t0))
    lt.done()


if __name__ == "__main__":
    main()
