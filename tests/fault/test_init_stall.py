#!/usr/bin/env python3
"""A rank that never joins MPI start-up is reported, not waited for
(issue 31, item 7). Two ranks of `loom train` through scripts/loomrun with
the test hook LOOM_COMM_FAULT=stall-init:1 (launcher rank 1 stops before
MPI_Init, as a rank killed or unreachable while starting would never join)
and LOOM_COMM_INIT_TIMEOUT=3: rank 0 waits in MPI_Init for it, and after 3 s
its start-up guard prints "rank 0: MPI start-up has not finished after 3 s"
and exits 69, and the job ends (mpirun 69). Before the guard the job hung
until the test's bound (120 s) killed it. Also: a LOOM_COMM_INIT_TIMEOUT that
is not a number of seconds is refused (exit 64) with a message naming it.
"""
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
import loomtest as lt  # noqa: E402


def main():
    with tempfile.TemporaryDirectory() as tmp:
        data = lt.make_text_data(tmp)
        args = ["train", "--model", "tiny", "--seq", "16", "--steps", "2", "--batch", "2", "--no-progress",
                "--quiet", "--peak-flops", "1e11", "--data", data]
        env = dict(os.environ, LOOM_COMM_FAULT="stall-init:1", LOOM_COMM_INIT_TIMEOUT="3")
        t0 = time.time()
        p = subprocess.Popen([lt.LOOM_RUN, "-np", "2", lt.LOOM] + args, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)
        try:
            out, _ = p.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, 9)
            out, _ = p.communicate(timeout=30)
            lt.check(False, "the job still ran 120 s after it started, its rank 1 never joining")
        want = "loom: error: rank 0: MPI start-up has not finished after 3 s (LOOM_COMM_INIT_TIMEOUT)"
        print("rc %s after %.1f s: %s" % (p.returncode, time.time() - t0, [l for l in out.splitlines() if want in l]))
        lt.check(p.returncode == 69 and want in out, "rc %s, want 69 and '%s':\n%s" % (p.returncode, want, out[-3000:]))

        bad = subprocess.run([lt.LOOM] + args, capture_output=True, text=True, timeout=120,
                             env=dict(os.environ, LOOM_COMM_INIT_TIMEOUT="soon"))
        lt.check(bad.returncode == 64 and "LOOM_COMM_INIT_TIMEOUT='soon' is not a number of seconds" in bad.stderr,
                 "LOOM_COMM_INIT_TIMEOUT=soon: rc %d, stderr:\n%s" % (bad.returncode, bad.stderr[-2000:]))
    lt.done()


if __name__ == "__main__":
    main()
