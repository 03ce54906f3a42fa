#!/usr/bin/env python3
"""Checkpoints of an expert-parallel MoE model (docs/checkpoints.md).

tiny-moe's sizes (2 layers, 4 experts, top-2) with aux-loss-free balancing
(aux_free_bias_rate 0.01: a selection bias that changes every step and must
come back from the checkpoint). dp2 x ep2 on 2 ranks (each rank holds 2
experts in the EP engine's storage): 20 steps straight (saving at 10 and
20) against 10 + --resume DIR/step_10 + 10: the 10 resumed losses and every
final parameter are bitwise equal, and the step-10 manifest holds every
global element of every tensor (all 4 experts' params, exp_avg, exp_avg_sq)
exactly once, and it holds both blocks' selection biases.

Resharding: that ep2 checkpoint resumed on one rank (ep 1), and a one-rank
(ep 1) checkpoint resumed at dp2 x ep2: the 10 resumed losses and the final
parameters agree with the uninterrupted one-rank run within 1e-5 (one rank
with --grad-accum 2: its micro-batches are the dp ranks' routing groups).
On 4 ranks, a dp4 x ep4 checkpoint (one expert a rank) resumed at dp4 x ep2
ZeRO-3 (each expert on two edp replicas) against one rank --grad-accum 4.

Context parallelism: cp2 x ep2 (the EP group inside dp x cp, each CP rank's
tokens a routing group) saving at step 10 agrees with one rank routing the
same groups (--moe-route-cp 2) over all 20 steps, and its step-10
checkpoint resumed at dp2 x ep2 agrees with that one-rank checkpoint
resumed with dp2's groups (--grad-accum 2) within 1e-5."""
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
sys.path.insert(0, os.path.dirname(__file__))
import loomtest as lt  # noqa: E402
import numpy as np  # noqa: E402
from test_ckpt_resume import check_manifest, losses  # noqa: E402

COMMON = ["--steps", 20, "--batch", 8, "--seq", 16, "--lr", "1e-3", "--warmup", 2,
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
        model = lt.write_model(tmp, n_layer=2, n_head=4, n_embd=64, vocab_size=256, n_positions=128,
                               num_local_experts=4, num_experts_per_tok=2, aux_free_bias_rate=0.01)
        common = ["--model", model, "--data", data] + COMMON
        ck2, ck1 = os.path.join(tmp, "ck_ep2"), os.path.join(tmp, "ck_one")
        m2, p2 = lt.train(tmp, "ep2_straight", 2, common + EP2 + ["--save-dir", ck2, "--save-every", 10])
        check_manifest(os.path.join(ck2, "step_10"), "dp2 ep2")
        with open(os.path.join(ck2, "step_10", "manifest.json")) as f:
            bufs = json.load(f).get("buffers", {})
        lt.check(sorted(bufs) == ["h.0.mlp.selection_bias", "h.1.mlp.selection_bias"]
                 and all(len(v) == 4 and any(x != 0 for x in v) for v in bufs.values()),
                 "selection biases in the manifest: %s" % bufs)
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
        # cp2 x ep2 -> dp2 x ep2: the routing groups change with the layout at step 10
        ckc, ckr = os.path.join(tmp, "ck_cp2"), os.path.join(tmp, "ck_route2")
        mr, pr = lt.train(tmp, "route2_straight", None, common + ["--moe-route-cp", 2, "--save-dir", ckr,
                                                                  "--save-every", 10])
        mc, pc = lt.train(tmp, "cp2_straight", 2, common + ["--cp", 2, "--ep", 2, "--save-dir", ckc,
                                                            "--save-every", 10])
        lt.compare_runs(mr, pr, mc, pc, "cp2 ep2 vs one rank --moe-route-cp 2")
        m1r, p1r = lt.train(tmp, "route2_to_one", None, common + ONE + ["--resume", os.path.join(ckr, "step_10")])
        m, p = lt.train(tmp, "cp2_to_dp2", 2, common + EP2 + ["--resume", os.path.join(ckc, "step_10")])
        close("cp2 ep2 -> dp2 ep2", m1r, p1r, m, p)
        # 4 ranks: dp4 x ep4 (one expert a rank) -> dp4 x ep2 at ZeRO-3 (two replicas of each expert)
        ck4 = os.path.join(tmp, "ck_ep4")
        lt.train(tmp, "ep4_straight", 4, common + ["--dp", 4, "--ep", 4, "--save-dir", ck4, "--save-every", 10])
        m4, p4 = lt.train(tmp, "one_ga4", None, common + ["--grad-accum", 4])
        m, p = lt.train(tmp, "ep4_to_ep2z3", 4, common + ["--dp", 4, "--ep", 2, "--zero", 3, "--resume",
                                                         os.path.join(ck4, "step_10")])
        close("dp4 ep4 -> dp4 ep2 zero3", m4, p4, m, p)
    print("total %.1f s" % (time.time() - t0))
    lt.done()


if __name__ == "__main__":
    main()
