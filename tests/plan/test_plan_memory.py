#!/usr/bin/env python3
"""The planner's memory per rank against the kernel's peak RSS of loom train.

`loom calibrate` (under mpirun, as many ranks as the layout) writes this
machine's cluster file, including the resident bytes of a rank right after
MPI starts (the planner's "reserved"). For each layout, `loom plan --layout
... --precision fp32 --json` predicts the most loaded rank's memory (params,
grads, optimizer state by ZeRO stage, the activations loom keeps per slot
times the schedule's in-flight micro-batches, the shared backward scratch,
reserved); `loom train` then runs the same layout with every rank under
tests/lib/peak_rss.py (ru_maxrss of the loom process, an instrument loom
does not compute). Asserted: predicted within TOL of the largest rank's
measured peak, for every layout.
"""
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
import loomtest as lt  # noqa: E402

TOL = 0.10
MODEL = "mini"
SEQ = 128
# (ranks, layout for loom plan, loom train flags, global batch[, sequence])
LAYOUTS = [
    (1, "dp=1", [], 16),
    (2, "dp=2", ["--dp", "2"], 32),
    (2, "dp=2,zero=2", ["--dp", "2", "--zero", "2"], 32),
    (2, "dp=1,tp=2,sp=1", ["--tp", "2", "--sp"], 16),
    (2, "dp=1,pp=2,schedule=1f1b,m=4", ["--pp", "2", "--schedule", "1f1b", "--micro-batches", "4"], 16),
    (2, "dp=1,pp=2,schedule=gpipe,m=4", ["--pp", "2", "--schedule", "gpipe", "--micro-batches", "4"], 16),
    # context parallel: activations on T/cp rows plus the ring's K/V buffers (a longer sequence, so they matter)
    (2, "dp=1,cp=2,cp_impl=ring", ["--cp", "2"], 16, 256),
    (2, "dp=1,cp=2,cp_impl=ulysses", ["--cp", "2", "--cp-impl", "ulysses"], 16, 256),
]


def main():
    with tempfile.TemporaryDirectory(prefix="loom-planmem-") as tmp:
        data = lt.make_text_data(tmp)
        clusters = {}
        for np_, layout, flags, batch, *rest in LAYOUTS:
            seq = rest[0] if rest else SEQ
            if np_ not in clusters:
                path = os.path.join(tmp, "machine%d.json" % np_)
                lt.run(["calibrate", "--out", path, "--quiet"], np=np_)
                clusters[np_] = path
            p = lt.run(["plan", "--model", MODEL, "--cluster", clusters[np_], "--gpus", np_, "--batch", batch,
                        "--seq", seq, "--precision", "fp32", "--layout", layout, "--json"])
            pred = json.loads(p.stdout)
            lt.check(pred["feasible"], "%s: feasible" % layout)
            predicted = pred["memory_bytes"]["total"]
            rss = lt.peak_rss(tmp, layout, np_, ["train", "--model", MODEL, "--data", data, "--steps", "2",
                                                 "--batch", batch, "--seq", seq, "--quiet"] + flags)
            measured = max(rss)
            err = predicted / measured - 1
            print("%-32s ranks %d  predicted %7.1f MB  measured %7.1f MB (max of %s)  %+5.1f%%" %
                  (layout, np_, predicted / 1e6, measured / 1e6,
                   ", ".join("%.1f" % (r / 1e6) for r in rss), 100 * err), flush=True)
            lt.check(abs(err) <= TOL, "%s: predicted %.1f MB vs measured %.1f MB (%+.1f%%, tolerance %d%%)" %
                     (layout, predicted / 1e6, measured / 1e6, 100 * err, 100 * TOL))
    lt.done()


if __name__ == "__main__":
    main()
