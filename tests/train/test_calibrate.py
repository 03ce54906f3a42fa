"""`loom calibrate` and MFU (issue 13): records keyed by CPU, flags and kernel;
MFU never above 100 %.

- a fresh cache: the record is measured now; asked again it is read from the
  cache; a record naming another kernel is not used (measured again);
- the sgemm peak is positive and at most the FMA peak (measured FMA rate
  x clock), whose flop/cycle is a power of two within the flags' bound;
- with a bf16 GEMM provider (AVX512-BF16 / AMX CPUs) a bf16 row, its own
  record, a GEMM rate at most its FMA peak, and a bf16 run reports MFU against
  the bf16 GEMM peak; without one, no bf16 row;
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

    ROW = r"^%s\s+1\s+([0-9.]+)\s+([0-9.]+)\s+[0-9.]+%%\s+([0-9]+)\s+[0-9.]+GHz\s+(cached|measured now)"
    out = {}

    def calibrate(prec="fp32"):
        p = subprocess.run([lt.LOOM, "calibrate", "--threads", "1"], capture_output=True, text=True,
                           env=env, timeout=300)
        lt.check(p.returncode == 0, "calibrate exited %d: %s" % (p.returncode, p.stderr))
        out["text"] = p.stdout
        rows = re.findall(ROW % prec, p.stdout, re.M)
        lt.check(len(rows) == 1, "one %s row for 1 thread:\n%s" % (prec, p.stdout))
        return rows[0] if rows else ("0", "0", "0", "")

    sg, fma, fpc, how = calibrate()
    print("first: sgemm %s, FMA %s GFLOP/s, %s flop/cycle (%s)" % (sg, fma, fpc, how))
    lt.check(how == "measured now", "fresh cache but %s" % how)
    lt.check(0 < float(sg) <= float(fma), "sgemm %s vs FMA %s GFLOP/s" % (sg, fma))
    lt.check(int(fpc) in (8, 16, 32, 64), "fp32 flop/cycle %s: not 2 pipes x lanes x 2 of some x86 core" % fpc)
    provider = re.search(r"^bf16 gemm: (.*)$", out["text"], re.M)
    lt.check(provider is not None, "no bf16 gemm line:\n" + out["text"])
    has_bf16 = provider is not None and not provider.group(1).startswith("none")
    if has_bf16:
        bsg, bfma, bfpc, bhow = calibrate("bf16")
        print("bf16 (%s): GEMM %s, FMA %s GFLOP/s, %s flop/cycle" % (provider.group(1), bsg, bfma, bfpc))
        lt.check(0 < float(bsg) <= float(bfma), "bf16 GEMM %s vs FMA %s GFLOP/s" % (bsg, bfma))
        lt.check(int(bfpc) >= 2 * int(fpc), "bf16 flop/cycle %s below twice fp32's %s" % (bfpc, fpc))
    else:
        lt.check(not re.search(r"^bf16\s", out["text"], re.M), "a bf16 row without a provider:\n" + out["text"])
    _, _, _, how2 = calibrate()
    lt.check(how2 == "cached", "second call %s" % how2)
    recs = glob.glob(os.path.join(tmp, "loom", "peak-*-t1.txt"))
    lt.check(len(recs) == 1, "one record: %s" % recs)
    if recs:
        text = open(recs[0]).read()
        lt.check("kernel: OpenBLAS" in text and "cpu: " in text and "flags: " in text, text)
        with open(recs[0], "w") as f:
            f.write(re.sub(r"kernel: .*", "kernel: some other kernel", text))
        _, _, _, how3 = calibrate()
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
    if has_bf16:
        p = subprocess.run([lt.LOOM, "train", "--model", "tiny", "--steps", "3", "--threads", "1",
                            "--precision", "bf16"], capture_output=True, text=True, env=env, timeout=300)
        lt.check(p.returncode == 0, "bf16 train exited %d: %s" % (p.returncode, p.stderr[-2000:]))
        m = re.search(r"MFU ([0-9.]+)% of the bf16 GEMM peak \(([0-9.]+) GFLOP/s per rank", p.stderr)
        lt.check(m is not None and 0 < float(m.group(1)) <= 100.0, "bf16 MFU line: %s" %
                 (m.group(0) if m else p.stderr[-1500:]))
        if m:
            print("bf16 run: MFU %s%% of the bf16 GEMM peak %s GFLOP/s" % (m.group(1), m.group(2)))
lt.done()
