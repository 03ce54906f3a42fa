#!/usr/bin/env python3
"""Invariant 1 for pipeline parallelism: pp = 2 and 4 with every schedule
(gpipe, 1f1b, interleaved with 2 virtual stages, zb) and m = p, 2p, 4p
micro-batches, plus dp=2 x tp=2 x pp=2 on 8 ranks, train the same model as
one rank: loss at each of 10 steps within 1e-5 relative, every final
parameter tensor within 1e-5 (||p - p_1|| / ||p_1||).

ZeRO-2 and ZeRO-3 with dp = 2 under pp = 2 and 4 and every schedule (the
tied embedding split between the first and last stage, the zero-bubble split
backward), and ZeRO-3 with dp=2 x tp=2 x sp x pp=2 zb, against the same
one-rank run.

Also the executor's own count of live activation sets on the first stage:
at most p for 1f1b (exactly min(p, m)) against m for gpipe."""
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
import loomtest as lt  # noqa: E402

STEPS = 10
COMMON = ["--steps", STEPS, "--batch", 16, "--seq", 16, "--lr", "1e-3", "--warmup", 2,
          "--seed", 9, "--peak-flops", "1e11", "--no-progress"]


def setup(tmp):
    """The 8-layer test model and its data in tmp: returns train(tag, np,
    flags) -> (metrics, params) and the one-rank reference run."""
    data = lt.make_text_data(tmp)
    model = lt.write_model(tmp, n_layer=8, n_head=4, n_embd=32, vocab_size=256, n_positions=32)
    common = ["--model", model, "--data", data] + COMMON

    def train(tag, np, flags):
        return lt.train(tmp, tag, np, common + flags)

    return train, train("ref", None, [])


def main():
    with tempfile.TemporaryDirectory() as tmp:
        train, ref = setup(tmp)
        for pp in (2, 4):
            for sched in ("gpipe", "1f1b", "interleaved", "zb"):
                for m in (pp, 2 * pp, 4 * pp):
                    flags = ["--pp", pp, "--schedule", sched, "--micro-batches", m]
                    if sched == "interleaved":
                        flags += ["--virtual-stages", 2]
                    label = "pp=%d %s m=%d" % (pp, sched, m)
                    run = train(label, pp, flags)
                    lt.compare_runs(ref[0], ref[1], run[0], run[1], label)
                    peak = lt.read_metrics(run[0])[-1]["pp_peak_live"]
                    if sched == "1f1b":
                        lt.check(peak == min(pp, m), "%s: stage 0 held %d activation sets, 1f1b allows %d" % (label, peak, min(pp, m)))
                    if sched == "gpipe":
                        lt.check(peak == m, "%s: stage 0 held %d activation sets, gpipe holds m=%d" % (label, peak, m))
        # ZeRO-2/3 under every schedule: gradients (and at 3 parameters) only as
        # shards, the tied wte's two halves summed in the outer unit's staging
        # buffer, the zero-bubble split backward (B gathers, W accumulates)
        for zero in (2, 3):
            for pp in (2, 4):
                for sched in ("gpipe", "1f1b", "interleaved", "zb"):
                    flags = ["--dp", 2, "--zero", zero, "--pp", pp, "--schedule", sched,
                             "--micro-batches", 2 * pp]
                    if sched == "interleaved":
                        flags += ["--virtual-stages", 2]
                    label = "dp=2 zero=%d pp=%d %s m=%d" % (zero, pp, sched, 2 * pp)
                    run = train(label, 2 * pp, flags)
                    lt.compare_runs(ref[0], ref[1], run[0], run[1], label)
        run = train("dp2tp2pp2sp_zb_z3", 8, ["--dp", 2, "--tp", 2, "--sp", "--pp", 2, "--zero", 3,
                                             "--schedule", "zb", "--micro-batches", 4])
        lt.compare_runs(ref[0], ref[1], run[0], run[1], "dp=2 tp=2 sp pp=2 zb m=4 zero=3")
        run = train("dp2tp2pp2", 8, ["--dp", 2, "--tp", 2, "--pp", 2, "--schedule", "1f1b", "--micro-batches", 4])
        lt.compare_runs(ref[0], ref[1], run[0], run[1], "dp=2 tp=2 pp=2 1f1b m=4")
        run = train("dp2tp2pp2sp_zb", 8, ["--dp", 2, "--tp", 2, "--sp", "--pp", 2, "--schedule", "zb", "--micro-batches", 4])
        lt.compare_runs(ref[0], ref[1], run[0], run[1], "dp=2 tp=2 sp pp=2 zb m=4")
    lt.done()


if __name__ == "__main__":
    main()
