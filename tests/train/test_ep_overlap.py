#!/usr/bin/env python3
"""The overlapped expert dispatch (the local experts compute their own rows
while the other ranks' rows are in flight, ep.h loom_ep_dispatch_start)
changes nothing but where the compute thread waits: the same expert-parallel
training with it on (the default) and off (LOOM_EP_OVERLAP=0, one blocking
dispatch) gives bitwise the same loss at every step and bitwise the same
final parameters - at dp 2 x ep 2 (top-2 with capacity), at dp 4 x ep 4
(top-1 dropless), and at dp 2 x ep 2 x pp 2 under the zero-bubble schedule
with full recompute (the recompute's dispatches too). The JSONL's
a2a_overlapped proves which path ran: every forward and input-gradient
dispatch of every rank overlapped when on, none when off."""
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
import loomtest as lt  # noqa: E402
import st  # noqa: E402

STEPS = 4
BASE = {"n_layer": 2, "n_head": 4, "n_embd": 64, "vocab_size": 256, "n_positions": 128,
        "num_local_experts": 8, "moe_intermediate_size": 128, "router_aux_loss_coef": 0.01}
PP2 = ["--pp", 2, "--micro-batches", 2]
CASES = [  # (MoE keys, ranks, flags)
    ({"num_experts_per_tok": 2, "capacity_factor": 1.0}, 2, ["--dp", 2, "--ep", 2]),
    ({"num_experts_per_tok": 1, "norm_topk_prob": False}, 4, ["--dp", 4, "--ep", 4]),
    ({"num_experts_per_tok": 2, "capacity_factor": 1.0}, 4,
     ["--dp", 2, "--ep", 2, "--schedule", "zb", "--recompute", "full"] + PP2),
]


def overlapped(metrics):
    """a2a_overlapped of every block at every step (rank 0's stage's blocks)."""
    return [[b["a2a_overlapped"] for b in m["moe"]] for m in lt.read_metrics(metrics)]


def main():
    with tempfile.TemporaryDirectory() as tmp:
        data = lt.make_text_data(tmp)
        for i, (keys, ranks, flags) in enumerate(CASES):
            cfg = os.path.join(tmp, "moe%d.json" % i)
            with open(cfg, "w") as f:
                json.dump(dict(BASE, **keys), f)
            args = ["--model", cfg, "--data", data, "--steps", STEPS, "--batch", 8, "--seq", 32,
                    "--lr", "1e-3", "--warmup", 2, "--seed", 11, "--threads", 1, "--no-progress"] + flags
            label = " ".join(str(f) for f in flags)
            runs = {}
            for mode in ("1", "0"):
                os.environ["LOOM_EP_OVERLAP"] = mode
                runs[mode] = lt.train(tmp, "case%d-overlap%s" % (i, mode), ranks, args)
            os.environ.pop("LOOM_EP_OVERLAP")
            on, off = runs["1"], runs["0"]
            # per step, block and micro-batch, every rank dispatches the rows in
            # forward and their gradients in the input backward; with zb and
            # full recompute, B and W each re-run the forward (3 forwards)
            dp = ranks // (2 if "--pp" in flags else 1)
            mb = 2 if "--pp" in flags else 1
            per = dp * mb * ((3 if "--recompute" in flags else 1) + 1)
            ov_on, ov_off = overlapped(on[0]), overlapped(off[0])
            lt.check(all(x == per for row in ov_on for x in row),
                     "%s: overlap on: a2a_overlapped %s, expected %d per block and step" % (label, ov_on, per))
            lt.check(all(x == 0 for row in ov_off for x in row),
                     "%s: overlap off: a2a_overlapped %s" % (label, ov_off))
            l_on = [m["loss"] for m in lt.read_metrics(on[0])]
            l_off = [m["loss"] for m in lt.read_metrics(off[0])]
            lt.check(len(l_on) == STEPS and l_on == l_off,
                     "%s: losses with overlap %s, without %s" % (label, l_on, l_off))
            p_on, _ = st.load(on[1])
            p_off, _ = st.load(off[1])
            lt.check(sorted(p_on) == sorted(p_off), "%s: parameter names differ" % label)
            diff = [k for k in p_on if p_on[k].tobytes() != p_off[k].tobytes()]
            lt.check(not diff, "%s: parameters not bitwise equal with and without overlap: %s" % (label, diff[:5]))
            print("%s: %d steps, losses and %d parameters bitwise equal, %d dispatches overlapped per "
                  "block and step" % (label, STEPS, len(p_on), per))
    lt.done()


if __name__ == "__main__":
    main()
