#!/usr/bin/env python3
"""Invariant 1 for MoE with context parallelism: the EP group formed inside
dp x cp, each (dp, cp) rank's tokens of a micro-batch its routing group.

The one-rank reference routes the same groups: --grad-accum dp (one
micro-batch per DP rank) and --moe-route-cp cp (each micro-batch routed as
the cp groups of tokens each CP rank holds, cp.h's split). Against it, over
10 steps: the loss at every step and every final parameter within 1e-5, and
tokens per expert (after capacity) and chosen per expert (before) equal at
every step - so capacity drops the same assignments whatever the layout.
Layouts: cp 2 ring x ep 2; dp 2 x cp 2 x ep 4 top-2 with capacity; cp 2
Ulysses x ep 2; dp 2 x cp 2 x ep 2 at ZeRO-2 (edp replicas of two ranks,
expert gradients summed over edp only: its bytes equal the local expert
floats x 4, and dp x cp carries no expert float); tp 2 + sp x cp 2 Ulysses x
ep 2 (an EP group per TP coordinate); pp 2 x dp 2 x cp 2 x ep 4, zero-bubble,
ZeRO-1 on 8 ranks (two micro-batches per DP rank: the reference takes
--grad-accum 4).

Negative control: the same capacity model routed as ONE group per
micro-batch (no --moe-route-cp) drops different assignments than the cp run,
so the per-expert counts differ - the routing-group definition is what
makes the layouts agree, not luck. --recompute full (each MoE forward run
again in backward) gives the same losses and counts each token once. Refused with exit 64 and the numbers
named: --moe-route-cp with --cp > 1, a --moe-route-cp whose 2N does not
divide --seq, an ep that does not divide dp x cp.

Evaluation is the language-model loss alone: `loom eval` of the trained
parameters gives the same loss under a config whose router losses are huge
(aux 1.0, z 0.5) as under one without them (both 0). Training logs both:
a first step with those coefficients reports router_loss above 1 (aux alone
is about aux_coef x k = 2 per block when the load is balanced) and loss =
lm_loss + router_loss, its lm_loss equal to the loss of the same first step
without router losses (the forward is the same: routing does not depend on
the coefficients)."""
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
import loomtest as lt  # noqa: E402

STEPS = 10
MODEL = {"n_layer": 2, "n_head": 4, "n_embd": 32, "vocab_size": 256, "n_positions": 64,
         "num_local_experts": 4, "moe_intermediate_size": 64, "router_aux_loss_coef": 0.01,
         "num_experts_per_tok": 2, "capacity_factor": 1.0, "router_z_loss_coef": 0.001}
COMMON = ["--steps", STEPS, "--batch", 4, "--seq", 32, "--lr", "1e-3", "--warmup", 2, "--seed", 5,
          "--peak-flops", "1e11", "--threads", 1, "--no-progress"]
LAYOUTS = [  # (ranks, micro-batches per step over dp, cp, flags)
    (2, 1, 2, ["--cp", 2, "--ep", 2]),
    (4, 2, 2, ["--dp", 2, "--cp", 2, "--ep", 4]),
    (2, 1, 2, ["--cp", 2, "--ep", 2, "--cp-impl", "ulysses"]),
    (4, 2, 2, ["--dp", 2, "--cp", 2, "--ep", 2, "--zero", 2]),
    (4, 1, 2, ["--tp", 2, "--sp", "--cp", 2, "--ep", 2, "--cp-impl", "ulysses"]),
    (8, 4, 2, ["--pp", 2, "--dp", 2, "--cp", 2, "--ep", 4, "--schedule", "zb", "--zero", 1]),
]

REFUSED = [  # (label, ranks, flags, words the one message must contain)
    ("route-cp with cp", 2, ["--cp", 2, "--moe-route-cp", 2], ["--moe-route-cp 2", "--cp 1"]),
    ("route-cp split", None, ["--moe-route-cp", 3], ["--moe-route-cp 3", "= 6", "--seq 32"]),
    ("ep outside dp x cp", 2, ["--cp", 2, "--ep", 4], ["ep=4", "dp*cp=2"]),
]


def routing(metrics, layers=None):
    """Per step, per MoE block (those of `layers` only, if given: with pp
    rank 0 reports its stage's blocks), the kept and chosen counts."""
    return [[(b["tokens"], b["routed"]) for b in m["moe"] if layers is None or b["layer"] in layers]
            for m in lt.read_metrics(metrics)]


def expert_floats(cfg, ep):
    C, H, E = cfg["n_embd"], cfg["moe_intermediate_size"], cfg["num_local_experts"]
    return cfg["n_layer"] * (E // ep) * (2 * C * H + H + C)


def all_floats(cfg):
    L, C, V, P = cfg["n_layer"], cfg["n_embd"], cfg["vocab_size"], cfg["n_positions"]
    H, E = cfg["moe_intermediate_size"], cfg["num_local_experts"]
    per_block = 4 * C + 3 * C * C + 3 * C + C * C + C + C * E + E * (2 * C * H + H + C)
    return L * per_block + (V + P) * C + 2 * C


def main():
    with tempfile.TemporaryDirectory() as tmp:
        data = lt.make_text_data(tmp)
        cfg = os.path.join(tmp, "moe.json")
        with open(cfg, "w") as f:
            json.dump(MODEL, f)
        common = ["--model", cfg, "--data", data] + COMMON
        refs = {}
        for ranks, dp, cp, flags in LAYOUTS:
            if (dp, cp) not in refs:  # dp: micro-batches of a step over the DP ranks
                refs[(dp, cp)] = lt.train(tmp, "ref-mb%d-cp%d" % (dp, cp), None,
                                          common + ["--grad-accum", dp, "--moe-route-cp", cp])
                drop = sum(b["dropped"] for m in lt.read_metrics(refs[(dp, cp)][0]) for b in m["moe"])
                lt.check(drop > 0, "reference dp%d cp%d dropped nothing under capacity 1" % (dp, cp))
            label = " ".join(str(f) for f in flags)
            run = lt.train(tmp, label, ranks, common + flags)
            ref = refs[(dp, cp)]
            lt.compare_runs(ref[0], ref[1], run[0], run[1], label)
            layers = {b["layer"] for b in lt.read_metrics(run[0])[0]["moe"]}
            lt.check(routing(run[0]) == routing(ref[0], layers),
                     "%s: tokens per expert differ from the one-rank run" % label)
            if flags[-2:] == ["--zero", 2]:  # expert gradients over edp only, the rest over dp x cp
                ep = flags[flags.index("--ep") + 1]
                for m in lt.read_metrics(run[0]):
                    lt.check(m["edp_bytes"] == 4 * expert_floats(MODEL, ep),
                             "%s step %d: edp bytes %s, want %d" % (label, m["step"], m["edp_bytes"],
                                                                   4 * expert_floats(MODEL, ep)))
                    dpcp = m["comm"]["dpcp"]
                    moved = sum(dpcp[op]["bytes"] for op in ("reduce_scatter",) if op in dpcp)
                    want = 4 * (all_floats(MODEL) - expert_floats(MODEL, 1))
                    lt.check(moved == want, "%s step %d: dp x cp reduce-scatter %d bytes, want %d "
                             "(the non-expert floats)" % (label, m["step"], moved, want))
        # negative control: one routing group per micro-batch drops differently
        one = lt.train(tmp, "one-group", None, common + ["--grad-accum", 1])
        lt.check(routing(one[0]) != routing(refs[(1, 2)][0]),
                 "routing as one group per micro-batch gave the cp grouping's counts: the test "
                 "cannot tell the groupings apart")
        # --recompute full runs each MoE forward twice: the same losses, routing counted once
        full = lt.train(tmp, "recompute-full", None, common + ["--moe-route-cp", 2, "--recompute", "full"])
        lt.check([m["loss"] for m in lt.read_metrics(full[0])] == [m["loss"] for m in lt.read_metrics(refs[(1, 2)][0])]
                 and routing(full[0]) == routing(refs[(1, 2)][0]),
                 "--recompute full: losses or tokens per expert differ from the run without recompute")
        eval_is_lm_only(tmp, data, refs[(1, 2)][1])
        for label, np_, flags, words in REFUSED:
            p = lt.run(["train"] + common + flags, np=np_, check_ok=False)
            lt.check(p.returncode == 64, "%s: exit %d, expected 64 (LOOM_EUSAGE)" % (label, p.returncode))
            lt.check(all(w in p.stderr for w in words), "%s: message lacks %s:\n%s"
                     % (label, words, p.stderr[-600:]))
    lt.done()


def eval_is_lm_only(tmp, data, params):
    losses, first = {}, {}
    for tag, aux, z in (("none", 0.0, 0.0), ("huge", 1.0, 0.5)):
        cfg = os.path.join(tmp, "eval-%s.json" % tag)
        with open(cfg, "w") as f:
            json.dump(dict(MODEL, router_aux_loss_coef=aux, router_z_loss_coef=z), f)
        out = lt.run(["eval", "--model", cfg, "--load-params", params, "--data", data, "--batch", 4,
                      "--seq", 32, "--batches", 2]).stdout
        losses[tag] = float(out.split("loss ")[1].split()[0])
        m, _ = lt.train(tmp, "train-" + tag, None, ["--model", cfg, "--data", data] + COMMON
                        + ["--steps", 1, "--warmup", 0])
        first[tag] = lt.read_metrics(m)[0]
    r = first["huge"]
    router = sum(b["aux_loss"] + b["z_loss"] for b in r["moe"])
    lt.check(router > 1.0 and abs(r["router_loss"] - router) <= 1e-6 * router,
             "training's router losses with aux 1.0: %g, blocks' sum %g" % (r["router_loss"], router))
    lt.check(abs(r["lm_loss"] + r["router_loss"] - r["loss"]) <= 1e-6 * r["loss"],
             "lm_loss %g + router_loss %g != loss %g" % (r["lm_loss"], r["router_loss"], r["loss"]))
    plain = first["none"]["loss"]
    lt.check(abs(r["lm_loss"] - plain) <= 1e-6 * plain and first["none"]["router_loss"] == 0,
             "training's lm_loss %.9g with router losses, loss %.9g without them" % (r["lm_loss"], plain))
    lt.check(losses["huge"] == losses["none"],
             "loom eval includes router losses: %.6f with aux 1.0 / z 0.5, %.6f without"
             % (losses["huge"], losses["none"]))
    print("eval: LM loss %.6f whatever the router-loss coefficients" % losses["none"])


if __name__ == "__main__":
    main()
