"""test_run_records.py - what a run leaves to look at, from one 4-rank MoE
pipeline run (tiny-moe, pp 2 x dp 2, ep 2, 4 steps):

  header   the first metrics row holds the run's settings and environment
           (model, layout, batch, LR, versions, host); the step rows follow.

    test_run_records.py
"""
import json
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
import loomtest as lt  # noqa: E402


def check_header(rows):
    h = rows[0]
    lt.check("run" in h and "env" in h and "loss" not in h, "first row is the header: %s" % list(h))
    run, env = h.get("run", {}), h.get("env", {})
    lt.check(run.get("model", {}).get("name") == "tiny-moe", "header model: %s" % run.get("model"))
    lay = run.get("layout", {})
    lt.check((lay.get("dp"), lay.get("pp"), lay.get("ep"), lay.get("world")) == (2, 2, 2, 4), "header layout %s" % lay)
    lt.check(run.get("batch") == 8 and run.get("seq") == 32 and run.get("lr") == 0.001 and run.get("steps") == 4,
             "header batch/seq/lr/steps: %s" % {k: run.get(k) for k in ("batch", "seq", "lr", "steps")})
    for k in ("loom", "commit", "compiler", "mpi", "blas", "host", "cpu"):
        lt.check(env.get(k), "header env names %s" % k)
    lt.check([r["step"] for r in rows[1:]] == [1, 2, 3, 4], "4 step rows after the header")


def main():
    work = tempfile.mkdtemp(prefix="loom-records-")
    data = lt.make_text_data(work)
    metrics = os.path.join(work, "m.jsonl")
    lt.run(["train", "--model", "tiny-moe", "--data", data, "--steps", "4", "--batch", "8", "--seq", "32",
            "--lr", "1e-3", "--pp", "2", "--dp", "2", "--ep", "2", "--micro-batches", "2", "--peak-flops", "1e9",
            "--metrics", metrics], np=4)
    rows = [json.loads(line) for line in open(metrics) if line.strip()]
    check_header(rows)
    shutil.rmtree(work, ignore_errors=True)
    lt.done()


if __name__ == "__main__":
    main()
