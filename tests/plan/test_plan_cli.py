#!/usr/bin/env python3
"""`loom plan` and `loom calibrate` through the real binary: a search returns
ranked layouts as JSON whose bubble is marked simulated for the best; --layout
evaluates exactly one (same fields); a rejected layout exits 64 with the
reason; a missing cluster file exits 66, a malformed model config 78; serving
prints TTFT, per-token latency and concurrency; calibrate writes a cluster
file plan reads and replaces an existing file whole."""
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
import loomtest as lt  # noqa: E402


def main():
    p = lt.run(["plan", "--model", "llama3-70b", "--gpus", "256", "--batch", "512", "--seq", "4096", "--top", "4",
                "--json"])
    d = json.loads(p.stdout)
    lay = d["layouts"]
    lt.check(len(lay) == 4, "4 layouts")
    lt.check(all(x["feasible"] for x in lay), "ranked layouts are feasible")
    lt.check(all(lay[i]["tokens_per_s_per_device"] >= lay[i + 1]["tokens_per_s_per_device"] for i in range(3)),
             "ranked by tokens/s/device")
    lt.check(lay[0]["bubble_simulated"] or "pp=1," in lay[0]["layout"], "the best layout's bubble is simulated")
    lt.check(d["rejected_memory"] > 0 and d["rejected_divisibility"] > 0, "rejections counted")
    # the H100 80GB preset's capacity: 81559 MiB = 85.521e9 bytes (plan/clusters/h100-80gb.json)
    lt.check(lay[0]["memory_bytes"]["total"] <= 85.521e9, "fits an H100 80GB (85.521e9 bytes)")
    # --layout of the best gives the same prediction
    q = lt.run(["plan", "--model", "llama3-70b", "--gpus", "256", "--batch", "512", "--seq", "4096", "--layout",
                lay[0]["layout"], "--json"])
    one = json.loads(q.stdout)
    lt.check(one["layout"] == lay[0]["layout"], "same layout")
    lt.check(abs(one["time_s"]["step"] - lay[0]["time_s"]["step"]) < 1e-9 * lay[0]["time_s"]["step"],
             "--layout predicts the same step (%g vs %g)" % (one["time_s"]["step"], lay[0]["time_s"]["step"]))
    # rejected layout: exit 64, reason named
    r = lt.run(["plan", "--model", "llama3-70b", "--gpus", "64", "--batch", "512", "--seq", "4096", "--layout",
                "dp=64"], check_ok=False)
    lt.check(r.returncode == 64, "rejected layout exits 64 (got %d)" % r.returncode)
    lt.check("over by" in r.stderr and "GB" in r.stderr, "reason names the memory overrun: %s" % r.stderr.strip())
    r = lt.run(["plan", "--model", "llama3-70b", "--gpus", "48", "--layout", "dp=16,tp=3"], check_ok=False)
    lt.check(r.returncode == 64 and "tp=3 does not divide n_head=64" in r.stderr, "divisibility: %s" % r.stderr.strip())
    r = lt.run(["plan", "--cluster", "/nonexistent/c.json"], check_ok=False)
    lt.check(r.returncode == 66 and "cannot open" in r.stderr, "missing cluster exits 66: %s" % r.stderr.strip())
    with tempfile.TemporaryDirectory(prefix="loom-plancli-") as tmp:
        bad = os.path.join(tmp, "config.json")
        with open(bad, "w") as f:
            f.write('{"model_type": "llama", "num_hidden_layers": 2, "hidden_size": "big", '
                    '"num_attention_heads": 2, "intermediate_size": 8, "vocab_size": 9}')
        r = lt.run(["plan", "--model", bad, "--gpus", "8"], check_ok=False)
        lt.check(r.returncode == 78 and "hidden_size" in r.stderr, "bad config exits 78: %s" % r.stderr.strip())
        # calibrate: an existing file is replaced whole
        out = os.path.join(tmp, "machine.json")
        with open(out, "w") as f:
            f.write("old")
        lt.run(["calibrate", "--out", out, "--quiet"], np=2)
        with open(out) as f:
            c = json.load(f)
        lt.check(c["gpus_per_node"] == 2 and c["peak_tflops"]["fp32"] > 0, "calibrate wrote 2 ranks, a peak")
        lt.check(c.get("cores_per_node") == len(os.sched_getaffinity(0)),
                 "calibrate wrote the cores the ranks share (%s, nproc %d)" % (c.get("cores_per_node"),
                                                                              len(os.sched_getaffinity(0))))
        curve = c.get("gemm_curve", [])
        lt.check(len(curve) >= 4 and all(0 < p["eff"] <= 1 for p in curve) and max(p["eff"] for p in curve) == 1
                 and min(p["m"] for p in curve) <= 32,
                 "calibrate wrote GEMM efficiency by size, skinny shapes included, best = 1: %s" % curve)
        lt.check(len(c["collectives"]["all_reduce"]) == 1 and c["collectives"]["p2p"][0]["group"] == 2,
                 "collectives by group size")
        p = lt.run(["plan", "--model", "mini", "--cluster", out, "--batch", "8", "--seq", "128", "--precision",
                    "fp32", "--json", "--top", "3"])
        lt.check(len(json.loads(p.stdout)["layouts"]) >= 1, "plan reads the calibrated cluster")
    # serving
    p = lt.run(["plan", "--model", "llama3-70b", "--mode", "serve", "--gpus", "16", "--batch", "64", "--seq", "2048",
                "--json", "--top", "3"])
    s = json.loads(p.stdout)["layouts"][0]
    lt.check(s["ttft_s"] > 0 and s["tpot_s"] > 0 and s["max_concurrent_sequences"] >= 1, "serving fields")
    lt.done()


if __name__ == "__main__":
    main()
