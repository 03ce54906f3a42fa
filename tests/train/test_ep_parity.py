#!/usr/bin/env python3
"""Invariant 1 for expert parallelism: --ep 2, 4, 8 (inside dp) train the same
MoE model as one rank whose micro-batches are the same routing groups (one
rank with --grad-accum dp sees, per micro-batch, exactly what each DP rank
sees) - loss at each of 10 steps and every final parameter within 1e-5, for
top-1 and top-2, dropless and with capacity (tokens dropped), and with a
larger dp than ep (expert gradients summed over two replicas) at zero 0 and 1.
The routing itself must agree: tokens per expert (after capacity) and chosen
per expert (before) equal the one-rank run's at every step, and a capacity
run must drop tokens while a dropless one drops none."""
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
import loomtest as lt  # noqa: E402

STEPS = 10
BASE = {"n_layer": 2, "n_head": 4, "n_embd": 64, "vocab_size": 256, "n_positions": 128,
        "num_local_experts": 8, "moe_intermediate_size": 128, "router_aux_loss_coef": 0.01}
VARIANTS = {  # name: (MoE keys, [(dp, ep, zero)])
    "top2-dropless": ({"num_experts_per_tok": 2, "router_z_loss_coef": 0.001},
                      [(2, 2, 0), (4, 4, 0), (8, 8, 0)]),
    "top2-capacity": ({"num_experts_per_tok": 2, "capacity_factor": 1.0},
                      [(2, 2, 0), (4, 4, 0), (8, 8, 0), (4, 2, 0), (4, 2, 1)]),
    "top1-dropless": ({"num_experts_per_tok": 1, "norm_topk_prob": False}, [(2, 2, 0), (4, 4, 0)]),
    "top1-capacity": ({"num_experts_per_tok": 1, "capacity_factor": 1.25, "norm_topk_prob": False},
                      [(2, 2, 0), (4, 4, 0)]),
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
            for dp, ep, zero in layouts:
                if dp not in refs:  # one rank, the same routing groups: dp micro-batches
                    refs[dp] = lt.train(tmp, "%s-ref%d" % (name, dp), None, common + ["--grad-accum", dp])
                    d = dropped(refs[dp][0])
                    lt.check((d > 0) == ("capacity_factor" in keys),
                             "%s: one rank dropped a fraction %.3f of assignments over the run" % (name, d))
                label = "%s dp=%d ep=%d zero=%d" % (name, dp, ep, zero)
                run = lt.train(tmp, label, dp, common + ["--dp", dp, "--ep", ep, "--zero", zero])
                lt.compare_runs(refs[dp][0], refs[dp][1], run[0], run[1], label)
                lt.check(routing(run[0]) == routing(refs[dp][0]),
                         "%s: tokens per expert differ from the one-rank run" % label)
    lt.done()


if __name__ == "__main__":
    main()
