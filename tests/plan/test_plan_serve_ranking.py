#!/usr/bin/env python3
"""`loom plan --mode serve` against a measured serving trade-off.

serve_tradeoff.json beside this file is the record `bench/bench_serve.py
--tradeoff --runs 3 --json` wrote on the 2-core development machine: for 2
and 4 ranks, the cluster file `loom calibrate` measured there (with the
machine's other work as background_runnable), and for each layout (tp=R,
dp=R replicas, tp=2 x dp=2) and concurrency (1, 8, 32 closed-loop clients)
the tokens/s and the p50 end-to-end latency of every run (a run = one
round over the layouts, one after another). For each (ranks, concurrency)
the plan is run with that cluster file and must order, by tokens/s (what
it ranks by), every pair of layouts the measurement separates - one
beating the other in every round - as measured. The table is data measured
once, not the plan's own formula: a cost model that ranks these layouts
otherwise fails here. p50 latency is printed beside it, not asserted: the
plan predicts a mean (TTFT + max_tokens x TPOT), and on the loaded machine
the medians of tp layouts miss the stalls their means carry
(docs/serving.md lists where they disagree)."""
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
import loomtest as lt  # noqa: E402

TABLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "serve_tradeoff.json")


def name_of(layout):
    d = dict(kv.split("=", 1) for kv in layout.split(","))
    if any(int(d.get(k, 1)) != 1 for k in ("pp", "cp", "ep")):
        return None
    tp, dp = int(d["tp"]), int(d["dp"])
    return ",".join(x for x in (("tp=%d" % tp) if tp > 1 else "", ("dp=%d" % dp) if dp > 1 else "") if x)


def predict(tmp, rec, ranks, conc, cluster, names):
    path = os.path.join(tmp, "cluster%s.json" % ranks)
    with open(path, "w") as f:
        json.dump(cluster, f)
    p = lt.run(["plan", "--model", rec["model"], "--mode", "serve", "--cluster", path, "--gpus", ranks, "--batch",
                conc, "--seq", rec["prompt"], "--gen", rec["max_tokens"], "--precision", "fp32", "--top", 1000,
                "--json"])
    pred = {}
    for r in json.loads(p.stdout)["layouts"]:
        n = name_of(r["layout"])
        if n in names and n not in pred:
            pred[n] = {"tok_s": r["tokens_per_s_per_device"] * int(ranks),
                       "lat_p50": r["ttft_s"] + rec["max_tokens"] * r["tpot_s"]}
    lt.check(sorted(pred) == sorted(names), "ranks %s conc %s: the plan evaluates %s (got %s)" % (
        ranks, conc, names, sorted(pred)))
    return pred


def main():
    with open(TABLE) as f:
        rec = json.load(f)
    pairs_checked = 0
    with tempfile.TemporaryDirectory(prefix="loom-serverank-") as tmp:
        for ranks, d in sorted(rec["ranks"].items()):
            names = sorted(d["rows"])
            for conc in sorted(d["rows"][names[0]], key=int):
                pred = predict(tmp, rec, ranks, conc, d["cluster"], names)
                for what, hi in (("tok_s", True), ("lat_p50", False)):
                    runs = {n: d["rows"][n][conc][what] for n in names}
                    for x in names:
                        for y in names:
                            if x == y or not all(p > q if hi else p < q for p, q in zip(runs[x], runs[y])):
                                continue
                            right = pred[x][what] > pred[y][what] if hi else pred[x][what] < pred[y][what]
                            msg = "ranks %s, concurrency %s, %s: measured %s better than %s in every round (%s vs " \
                                "%s); the plan predicts %.4g vs %.4g" % (ranks, conc, what, x, y, runs[x], runs[y],
                                                                        pred[x][what], pred[y][what])
                            if what == "tok_s":
                                pairs_checked += 1
                                lt.check(right, msg)
                            else:
                                print("%s: %s" % ("agrees" if right else "DISAGREES", msg))
    # the table must separate something, or the pair checks above prove nothing
    lt.check(pairs_checked >= 3, "%d measured pairs apart in every round checked (need >= 3)" % pairs_checked)
    print("%d separated pairs by tokens/s ordered as measured" % pairs_checked)
    lt.done()


if __name__ == "__main__":
    main()
