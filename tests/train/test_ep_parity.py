#!/usr/bin/env python3
"""Invariant 1 for expert parallelism: --ep 2, 4, 8 (inside dp) train the same
MoE model as one rank whose micro-batches are the same routing groups (one
rank with --grad-accum dp sees, per micro-batch, exactly what each DP rank
sees) - loss at each of 10 steps and every final parameter within 1e-5, for
top-1 and top-2, dropless and with capacity (tokens dropped), and with a
larger dp than ep (expert gradients summed over two replicas) at zero 0 to 3,
with gradient accumulation (two routing groups per rank and step),
with pp 2 (1F1B, zero-bubble ZB-H1 and ZB-H2, and ZB-H1 with full recompute:
B and W each re-run the block with its expert all-to-alls; on a four-block
model ZB-V and DualPipeV with full recompute; each micro-batch a routing
group), with
TP-split experts (tp 2; tp 2 with sp x dp 2 x ep 2; the same x pp 2 with the
zero-bubble schedule at zero 1 on 8 ranks), and the
MoE model without EP under ZeRO-3.
The language-model part of the loss (JSONL lm_loss: loss minus the router
losses of every block, every stage) agrees too. The routing itself must agree: tokens per expert (after capacity) and chosen
per expert (before) equal the one-rank run's at every step, and a capacity
run must drop tokens while a dropless one drops none."""
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
import loomtest as lt  # noqa: E402

STEPS = 10
# A bias that stays near zero (an expert's, fed few tokens) is a sum of a few
# Adam steps of a near-zero gradient: Adam divides by the gradient's own RMS,
# so fp32 rounding differences between layouts move it by a visible fraction
# of its tiny norm (h.1.mlp.experts.7.c_fc.bias on tp2 sp dp2 ep2 zb pp2 with
# OpenBLAS's AVX-512 kernels: 1.08e-5 norm-wise, max |diff| 4.5e-7). A bias
# over the relative tolerance must then be within a thousandth of one Adam
# step (lr 1e-3) in every element; weights stay at the relative tolerance.
BIAS_ABS = 1e-6
BASE = {"n_layer": 2, "n_head": 4, "n_embd": 64, "vocab_size": 256, "n_positions": 128,
        "num_local_experts": 8, "moe_intermediate_size": 128, "router_aux_loss_coef": 0.01}
PP2 = ["--pp", 2, "--micro-batches", 2]
VARIANTS = {  # name: (MoE keys, [(ranks, routing groups of the one-rank run, flags)])
    "top2-dropless": ({"num_experts_per_tok": 2, "router_z_loss_coef": 0.001},
                      [(2, 2, ["--dp", 2, "--ep", 2]), (4, 4, ["--dp", 4, "--ep", 4]),
                       (8, 8, ["--dp", 8, "--ep", 8])]),
    "top2-capacity": ({"num_experts_per_tok": 2, "capacity_factor": 1.0},
                      [(2, 2, ["--dp", 2, "--ep", 2]), (4, 4, ["--dp", 4, "--ep", 4]),
                       (8, 8, ["--dp", 8, "--ep", 8]), (4, 4, ["--dp", 4, "--ep", 2]),
                       (4, 4, ["--dp", 4, "--ep", 2, "--zero", 1]),
                       (2, 4, ["--dp", 2, "--ep", 2, "--grad-accum", 2]),
                       (4, 4, ["--dp", 2, "--ep", 2] + PP2),
                       (4, 4, ["--dp", 2, "--ep", 2, "--schedule", "zb"] + PP2),
                       (4, 4, ["--dp", 2, "--ep", 2, "--schedule", "zbh2"] + PP2),
                       (4, 4, ["--dp", 2, "--ep", 2, "--schedule", "zb", "--recompute", "full"] + PP2),
                       (4, 4, ["--dp", 4, "--ep", 2, "--zero", 2]), (4, 4, ["--dp", 4, "--ep", 2, "--zero", 3]),
                       (2, 2, ["--dp", 2, "--zero", 3]),
                       (2, 1, ["--tp", 2]), (4, 2, ["--tp", 2, "--sp", "--dp", 2, "--ep", 2]),
                       (8, 4, ["--tp", 2, "--sp", "--dp", 2, "--ep", 2, "--schedule", "zb", "--zero", 1]
                        + PP2)]),
    # four blocks: pp 2 with the V schedules (two chunks per rank) needs four stages
    "top2-capacity-4": ({"num_experts_per_tok": 2, "capacity_factor": 1.0, "n_layer": 4},
                        [(4, 4, ["--dp", 2, "--ep", 2, "--schedule", "zbv"] + PP2),
                         (4, 4, ["--dp", 2, "--ep", 2, "--schedule", "dualpipev", "--recompute", "full"] + PP2)]),
    "top1-dropless": ({"num_experts_per_tok": 1, "norm_topk_prob": False},
                      [(2, 2, ["--dp", 2, "--ep", 2]), (4, 4, ["--dp", 4, "--ep", 4])]),
    "top1-capacity": ({"num_experts_per_tok": 1, "capacity_factor": 1.25, "norm_topk_prob": False},
                      [(2, 2, ["--dp", 2, "--ep", 2]), (4, 4, ["--dp", 4, "--ep", 4])]),
}


def routing(metrics):
    return [[(b["tokens"], b["routed"]) for b in m["moe"]] for m in lt.read_metrics(metrics)]


def dropped(metrics):
    return sum(b["dropped"] for m in lt.read_metrics(metrics) for b in m["moe"])


def main():
    with tempfile.TemporaryDirectory() as tmp:
        data = lt.make_text_data(tmp)
        for name, (keys, layouts) in VARIANTS.items():
            cfg = os.path.join(tmp, name + ".json")
            with open(cfg, "w") as f:
                json.dump(dict(BASE, **keys), f)
            common = ["--model", cfg, "--data", data, "--steps", STEPS, "--batch", 8, "--seq", 32,
                      "--lr", "1e-3", "--warmup", 2, "--seed", 11, "--peak-flops", "1e11",
                      "--threads", 1, "--no-progress"]
            refs = {}
            for ranks, groups, flags in layouts:
                if groups not in refs:  # one rank, the same routing groups as micro-batches
                    refs[groups] = lt.train(tmp, "%s-ref%d" % (name, groups), None,
                                            common + ["--grad-accum", groups])
                    d = dropped(refs[groups][0])
                    lt.check((d > 0) == ("capacity_factor" in keys),
                             "%s: one rank dropped a fraction %.3f of assignments over the run" % (name, d))
                label = "%s %s" % (name, " ".join(str(f) for f in flags))
                run = lt.train(tmp, label, ranks, common + flags)
                lt.compare_runs(refs[groups][0], refs[groups][1], run[0], run[1], label, bias_abs=BIAS_ABS)
                lm = [(a["lm_loss"], b["lm_loss"]) for a, b in zip(lt.read_metrics(run[0]),
                                                                   lt.read_metrics(refs[groups][0]))]
                lt.check(all(abs(a - b) <= 1e-5 * abs(b) for a, b in lm),  # router losses of every stage
                         "%s: lm_loss per step %s vs one rank" % (label, lm))
                if "--pp" not in flags:  # with pp, rank 0 reports only its stage's blocks
                    lt.check(routing(run[0]) == routing(refs[groups][0]),
                             "%s: tokens per expert differ from the one-rank run" % label)
    lt.done()


if __name__ == "__main__":
    main()
