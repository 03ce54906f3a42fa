"""`loom calibrate` and MFU (issue 13): records keyed by CPU, flags and kernel;
MFU never above 100 %.

- a fresh cache: the record is measured now; asked again it is read from the
  cache; a record naming another kernel is not used (measured again);
- the sgemm peak is positive and at most the FMA peak (flags x clock);
- a run given a peak far below what it reaches (--peak-flops 1e6) reports
  MFU <= 100 % per step and at the end, saying the peak was raised.
"""
import glob
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import loomtest as lt  # noqa: E402

with tempfile.TemporaryDirectory() as tmp:
    env = dict(os.environ, XDG_CACHE_HOME=tmp)

    def calibrate():
        p = subprocess.run([lt.LOOM, "calibrate", "--threads", "1"], capture_output=True, text=True,
                           env=env, timeout=300)
        lt.check(p.returncode == 0, "calibrate exited %d: %s" % (p.returncode, p.stderr))
        rows = re.findall(r"^\s+1\s+([0-9.]+)\s+([0-9.]+)\s+[0-9.]+%\s+[0-9.]+GHz\s+(cached|measured now)",
                          p.stdout, re.M)
        lt.check(len(rows) == 1, "one row for 1 thread:\n" + p.stdout)
        return rows[0] if rows else ("0", "0", "")

    sg, fma, how = calibrate()
    print("first: sgemm %s, FMA %s GFLOP/s (%s)" % (sg, fma, how))
    lt.check(how == "measured now", "fresh cache but %s" % how)
    lt.check(0 < float(sg) <= float(fma), "sgemm %s vs FMA %s GFLOP/s" % (sg, fma))
    _, _, how2 = calibrate()
    lt.check(how2 == "cached", "second call %s" % how2)
    recs = glob.glob(os.path.join(tmp, "loom", "peak-*-t1.txt"))
    lt.check(len(recs) == 1, "one record: %s" % recs)
    if recs:
        text = open(recs[0]).read()
        lt.check("kernel: OpenBLAS" in text and "cpu: " in text and "flags: " in text, text)
        with open(recs[0], "w") as f:
            f.write(re.sub(r"kernel: .*", "kernel: some other kernel", text))
        _, _, how3 = calibrate()
        lt.check(how3 == "measured now", "record of another kernel used: %s" % how3)

    met = os.path.join(tmp, "m.jsonl")
    p = subprocess.run([lt.LOOM, "train", "--model", "tiny", "--steps", "3", "--threads", "1",
                        "--peak-flops", "1e6", "--metrics", met], capture_output=True, text=True, env=env,
                       timeout=300)
    lt.check(p.returncode == 0, "train exited %d: %s" % (p.returncode, p.stderr[-2000:]))
    mfus = [r["mfu"] for r in lt.read_metrics(met)] if os.path.exists(met) else []
    lt.check(len(mfus) == 3 and all(0 < m <= 1.0 for m in mfus), "per-step MFU %s" % mfus)
    m = re.search(r"MFU ([0-9.]+)% of the (?:sgemm|given) peak \(([0-9.]+) GFLOP/s per rank(, raised[^)]*)?\)", p.stderr)
    lt.check(m is not None and float(m.group(1)) <= 100.0 and m.group(3), "final MFU line: %s" %
             (m.group(0) if m else p.stderr[-1500:]))
lt.done()
