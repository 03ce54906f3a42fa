#!/usr/bin/env python3
"""SIGTERM through the launcher, again and again (issue 31, docs/checkpoints.md):
each run is `scripts/loomrun -np 2 loom train --dp 2 --zero 1 --save-dir DIR
--save-every 5` on a fresh DIR, sent SIGTERM once its first checkpoint is
published, at a random moment 0-0.5 s later (loomrun relays it to every rank
through mpirun). Every run must exit 75 with rank 0's "stopped by signal 15
(SIGTERM) after step K" and DIR/latest naming step_K, the newest step that
verifies (hashlib, tests/lib/ckptlib.py); then `--resume DIR` to the end
must exit 0 with final parameters (--save-params) byte-equal to one straight
run's.

    /usr/bin/python3 bench/ckpt_sigterm.py [--runs 20] [--seed S]
"""
import argparse
import filecmp
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "lib"))
import ckptlib  # noqa: E402
import loomtest as lt  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--seed", type=int, default=int(time.time()))
    a = ap.parse_args()
    rng = random.Random(a.seed)
    print("seed %d, %d runs" % (a.seed, a.runs), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        data = lt.make_text_data(tmp)
        model = lt.write_model(tmp, n_layer=2, n_head=2, n_embd=32, vocab_size=256, n_positions=32)
        train = [lt.LOOM_RUN, "-np", "2", lt.LOOM, "train", "--model", model, "--data", data, "--steps", "400",
                 "--batch", "4", "--seq", "16", "--dp", "2", "--zero", "1", "--peak-flops", "1e11",
                 "--no-progress"]
        straight = os.path.join(tmp, "straight.safetensors")
        r = subprocess.run(train + ["--save-params", straight], capture_output=True, text=True)
        lt.check(r.returncode == 0, "straight run: exit %d\n%s" % (r.returncode, r.stderr[-2000:]))
        stops = {}
        for i in range(a.runs):
            ck = os.path.join(tmp, "ck%d" % i)
            p = subprocess.Popen(train + ["--save-dir", ck, "--save-every", "5"], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True)
            t_end = time.time() + 300
            while time.time() < t_end and p.poll() is None and not ckptlib.published(ck):
                time.sleep(0.01)
            time.sleep(rng.uniform(0.0, 0.5))
            p.send_signal(signal.SIGTERM)
            out, err = p.communicate(timeout=300)
            m = re.search(r"stopped by signal 15 \(SIGTERM\) after step (\d+)", err + out)
            k = int(m.group(1)) if m else None
            newest = ckptlib.newest_verified(ck)
            lt.check(p.returncode == 75 and k is not None,
                     "run %d: exit %d, stop line %s\n%s" % (i, p.returncode, k, err[-2000:]))
            lt.check(newest is not None and os.path.basename(newest) == "step_%s" % k and
                     ckptlib.latest(ck) == "step_%s" % k,
                     "run %d: stopped after step %s, newest verified %s, latest %s" % (
                         i, k, newest, ckptlib.latest(ck)))
            params = os.path.join(tmp, "p%d.safetensors" % i)
            r = subprocess.run(train + ["--resume", ck, "--save-dir", ck, "--save-params", params],
                               capture_output=True, text=True)
            lt.check(r.returncode == 0, "run %d: resume exit %d\n%s" % (i, r.returncode, r.stderr[-2000:]))
            same = r.returncode == 0 and filecmp.cmp(params, straight, shallow=False)
            lt.check(same, "run %d: resumed from step %s, final parameters differ from the straight run" % (i, k))
            stops[i] = k
            print("run %d: exit %d after step %s, latest %s; resumed to step 400: parameters %s" % (
                i, p.returncode, k, ckptlib.latest(ck), "bitwise equal" if same else "DIFFER"), flush=True)
        print("%d runs: %d exited 75, stopped after steps %s" % (
            a.runs, sum(1 for k in stops.values() if k is not None), sorted(k for k in stops.values() if k)))
    lt.done()


if __name__ == "__main__":
    main()
