#!/usr/bin/env python3
"""Invariant 1 for the list-scheduled pipelines (docs/pipeline.md): zbh2,
zbv and dualpipev at pp = 2 and 4 (m = p and 2p; zbv and dualpipev place two
chunks per rank in a V, so rank 0 holds the embedding and the LM head) train
the same model as one rank: loss at each of 10 steps within 1e-5 relative,
every final parameter tensor within 1e-5. Also zbv and dualpipev under
dp = 2 with ZeRO 1 and 2, and zbv with dp=2 x tp=2 x pp=2.

The executor's own count of live activation sets on rank 0 is checked
against the schedule's peak (loom sim's "peak live"): 2p-1 for zbh2 and at
most 2p chunk sets for zbv once m >= p. Each pipeline rank's idle and
waiting time in the metrics (pp_idle_ms, pp_wait_ms): one per rank, the
waits within the idle time."""
import os
import re
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import loomtest as lt  # noqa: E402
import test_pp_parity  # noqa: E402  (the same model, data and one-rank run)


def sim_peak(sched, pp, m):
    """Rank 0's peak live sets as loom sim reports them for the same lists."""
    out = lt.run(["sim", "--pp", pp, "--micro-batches", m, "--schedule", sched]).stdout
    row = re.search(r"^0\s+\S+\s+\S+\s+\S+\s+(\d+)\s*$", out, re.M)
    return int(row.group(1)) if row else -1


def main():
    with tempfile.TemporaryDirectory() as tmp:
        train, ref = test_pp_parity.setup(tmp)
        for pp in (2, 4):
            for sched in ("zbh2", "zbv", "dualpipev"):
                for m in (pp, 2 * pp):
                    label = "pp=%d %s m=%d" % (pp, sched, m)
                    run = train(label, pp, ["--pp", pp, "--schedule", sched, "--micro-batches", m])
                    lt.compare_runs(ref[0], ref[1], run[0], run[1], label)
                    last = lt.read_metrics(run[0])[-1]
                    idle, wait = last.get("pp_idle_ms", []), last.get("pp_wait_ms", [])
                    # per pipeline rank from the executor's timestamps: a rank's waits
                    # lie inside its idle time (the longest span less its compute)
                    lt.check(len(idle) == len(wait) == pp and all(w <= i + 1e-3 and w >= 0 for i, w in zip(idle, wait)),
                             "%s: pp_idle_ms %s, pp_wait_ms %s" % (label, idle, wait))
                    peak = last["pp_peak_live"]
                    want = sim_peak(sched, pp, m)
                    lt.check(peak == want, "%s: rank 0 held %d activation sets, loom sim says %d" % (label, peak, want))
                    if sched == "zbh2":
                        lt.check(peak == min(m, 2 * pp - 1), "%s: zbh2 peak %d, want min(m, 2p-1)" % (label, peak))
                    if sched == "zbv" and m >= pp:
                        lt.check(peak <= 2 * pp, "%s: zbv peak %d chunk sets > 2p" % (label, peak))
        for zero in (1, 2):
            for sched in ("zbv", "dualpipev"):
                label = "dp=2 zero=%d pp=2 %s m=4" % (zero, sched)
                run = train(label, 4, ["--dp", 2, "--zero", zero, "--pp", 2, "--schedule", sched,
                                       "--micro-batches", 4])
                lt.compare_runs(ref[0], ref[1], run[0], run[1], label)
        run = train("dp2tp2pp2_zbv", 8, ["--dp", 2, "--tp", 2, "--pp", 2, "--schedule", "zbv",
                                         "--micro-batches", 4])
        lt.compare_runs(ref[0], ref[1], run[0], run[1], "dp=2 tp=2 pp=2 zbv m=4")
    lt.done()


if __name__ == "__main__":
    main()
