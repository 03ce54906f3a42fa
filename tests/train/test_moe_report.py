#!/usr/bin/env python3
"""What a user sees of a Mixture-of-Experts run, checked against independent
counts.

1. Volumes (dp 4, ep 2, top-2 with capacity): per step, the EP group's bytes
   as the communicator counted them on every rank equal docs/moe.md's formula
   from the per-expert token counts the JSONL reports - per block and
   micro-batch, 2 (A + R) C 4 bytes of alltoallv over the group (sum A = sum R
   = kept tokens) plus E 4 bytes of alltoall per rank; each block's a2a_bytes
   is its share. Expert gradients
   travel only over the expert-data-parallel group (edp: 4 bytes per local
   expert float), and the dp group's gradient all-reduce carries exactly the
   non-expert floats (plus the 8-byte loss).
2. A skewed router (ln_2 bias 1 and router column 0 raised, so every token
   prefers expert 0): the warning names each block, imbalance is E and 3/4
   of the assignments are dropped by capacity 1.0.
3. Aux-loss-free balancing (DeepSeek-V3's selection bias) brings the skewed
   router's imbalance down over 30 steps; without it, it stays at E."""
import json
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
import loomtest as lt  # noqa: E402

BASE = {"n_layer": 2, "n_head": 4, "n_embd": 64, "vocab_size": 256, "n_positions": 128,
        "moe_intermediate_size": 128}


def model(tmp, name, **keys):
    path = os.path.join(tmp, name + ".json")
    with open(path, "w") as f:
        json.dump(dict(BASE, **keys), f)
    return path


def volumes(tmp, data):
    E, C, dp, ep, K = 8, BASE["n_embd"], 4, 2, 1
    cfg = model(tmp, "vol", num_local_experts=E, num_experts_per_tok=2, capacity_factor=1.0)
    m, p = lt.train(tmp, "vol", dp, ["--model", cfg, "--data", data, "--steps", 4, "--batch", 8,
                                     "--seq", 32, "--lr", "1e-3", "--threads", 1, "--peak-flops", "1e11",
                                     "--no-progress", "--dp", dp, "--ep", ep])
    params, _ = lt.st.load(p)
    expert = sum(a.size for n, a in params.items() if ".experts." in n)
    dense = sum(a.size for n, a in params.items() if ".experts." not in n)
    for s in lt.read_metrics(m):
        formula = 0
        for b in s["moe"]:
            kept = sum(b["tokens"])
            block = 16 * C * kept + dp * K * E * 4
            lt.check(b["a2a_bytes"] == block, "step %d block %d: a2a_bytes %d, formula %d"
                     % (s["step"], b["layer"], b["a2a_bytes"], block))
            formula += block
        lt.check(s["ep_bytes"] == formula,
                 "step %d: EP group all-to-all bytes over the ranks %d, formula from the token counts %d"
                 % (s["step"], s["ep_bytes"], formula))
        lt.check(s["edp_bytes"] == 4 * expert // ep,
                 "step %d: edp bytes %d, expected 4 x %d local expert floats" % (s["step"], s["edp_bytes"], expert // ep))
        got = s["comm"]["dp"]["allreduce"]["bytes"]
        lt.check(got == 4 * dense + 8, "step %d: dp all-reduce %d bytes, expected 4 x %d non-expert floats + 8"
                 % (s["step"], got, dense))
    print("volumes: EP bytes per step %s, edp %d, dp %d" % ([s["ep_bytes"] for s in lt.read_metrics(m)],
                                                          4 * expert // ep, 4 * dense + 8))


def skewed(tmp, data):
    E = 4
    keys = dict(num_local_experts=E, num_experts_per_tok=1, router_aux_loss_coef=0.0, capacity_factor=1.0,
                norm_topk_prob=False)
    common = ["--data", data, "--batch", 8, "--seq", 32, "--seed", 11, "--threads", 1,
              "--peak-flops", "1e11", "--no-progress"]
    cfg = model(tmp, "skew", **keys)
    init = os.path.join(tmp, "init.safetensors")
    lt.run(["train", "--model", cfg, "--steps", 1, "--lr", "1e-9", "--save-params", init] + common)
    t, _ = lt.st.load(init)
    for layer in (0, 1):
        t["h.%d.ln_2.bias" % layer][:] = 1.0
        t["h.%d.mlp.router.weight" % layer][:, 0] += 0.05
    skew = os.path.join(tmp, "skew.safetensors")
    lt.st.save(skew, t)
    runs = {}
    for tag, rate in (("plain", 0.0), ("bias", 0.02)):
        c = model(tmp, tag, aux_free_bias_rate=rate, **keys)
        metrics = os.path.join(tmp, tag + ".jsonl")
        proc = lt.run(["train", "--model", c, "--steps", 30, "--lr", "1e-4", "--load-params", skew,
                       "--metrics", metrics] + common)
        runs[tag] = [[b["imbalance"] for b in s["moe"]] for s in lt.read_metrics(metrics)]
        first = lt.read_metrics(metrics)[0]["moe"]
        for layer in (0, 1):
            lt.check("MoE block h.%d: expert load imbalance" % layer in proc.stderr,
                     "%s: no imbalance warning naming block h.%d in:\n%s" % (tag, layer, proc.stderr))
            lt.check(first[layer]["imbalance"] == E and abs(first[layer]["dropped"] - 0.75) < 1e-9,
                     "%s: step 1 block %d imbalance %g dropped %g, expected %d and 0.75"
                     % (tag, layer, first[layer]["imbalance"], first[layer]["dropped"], E))
    for layer in (0, 1):
        plain = np.mean([r[layer] for r in runs["plain"][-10:]])
        bias = np.mean([r[layer] for r in runs["bias"][-10:]])
        print("block %d: imbalance over the last 10 of 30 steps %.2f without, %.2f with the bias"
              % (layer, plain, bias))
        lt.check(plain >= E - 0.1, "block %d: without balancing the skew should stay (%.2f)" % (layer, plain))
        lt.check(bias < 0.9 * E, "block %d: the selection bias did not reduce imbalance (%.2f)" % (layer, bias))


def main():
    with tempfile.TemporaryDirectory() as tmp:
        data = lt.make_text_data(tmp)
        volumes(tmp, data)
        skewed(tmp, data)
    lt.done()


if __name__ == "__main__":
    main()
