"""GEMM kernels chosen from the CPU's feature flags (issue 13).

The flags come from the kernel's /proc/cpuinfo (an instrument loom does not
use: loom reads CPUID itself). Checks, through the real `loom` binary:
- by default the start-up line names an OpenBLAS core as wide as the flags
  allow (AVX-512 F/BW/VL/DQ -> SkylakeX/Cooperlake/SapphireRapids, AVX2+FMA ->
  Haswell/Zen or wider) and says why;
- a user's OPENBLAS_CORETYPE is kept (and said to be the user's, and, when
  it names narrower kernels than the flags allow, that it does);
- LOOM_BLAS_AUTO=0 leaves OpenBLAS's own choice;
- runs on different kernels agree on the loss to float rounding (1e-5);
- on an AVX-512 CPU with oneDNN installed the line also names oneDNN's fp32
  matmul for the forward and input-gradient products, and
  LOOM_FP32_GEMM=openblas takes it away (the losses again within 1e-5);
- OpenMP's waiting: loom re-executes with GOMP_SPINCOUNT=20000 (the
  "threads:" line says so), a user's GOMP_SPINCOUNT or OMP_WAIT_POLICY is
  kept, LOOM_OMP_AUTO=0 leaves the runtime's default.
"""
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
import loomtest as lt  # noqa: E402

flags = set()
with open("/proc/cpuinfo") as f:
    for line in f:
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
avx512 = {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags
avx2 = {"avx2", "fma"} <= flags
WIDE512 = {"skylakex", "cooperlake", "sapphirerapids"}
WIDE2 = {"haswell", "zen"} | WIDE512


def run(env_extra):
    env = dict(os.environ)
    env.pop("OPENBLAS_CORETYPE", None)
    env.pop("LOOM_BLAS_CHOSEN", None)
    for k in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY", "LOOM_OMP_CHOSEN", "LOOM_OMP_AUTO"):
        env.pop(k, None)
    env.update(env_extra)
    import subprocess
    p = subprocess.run([lt.LOOM, "train", "--model", "tiny", "--steps", "2", "--threads", "1",
                        "--peak-flops", "1e9", "--log-every", "1"],
                       capture_output=True, text=True, env=env, timeout=300)
    lt.check(p.returncode == 0, "loom exited %d: %s" % (p.returncode, p.stderr[-2000:]))
    m = re.search(r"gemm: OpenBLAS \S+ sgemm kernels (\S+) \(([^)]*)\)", p.stderr)
    lt.check(m is not None, "no gemm: line in start-up output:\n" + p.stderr[-2000:])
    losses = [float(x) for x in re.findall(r"step \d+/\d+ loss ([0-9.]+)", p.stderr)]
    t = re.search(r"^threads: \d+ per rank; (.*)$", p.stderr, re.M)
    lt.check(t is not None, "no threads: line in start-up output:\n" + p.stderr[-2000:])
    run.threads_line = t.group(1) if t else ""
    g = re.search(r"^gemm: (.*)$", p.stderr, re.M)
    run.gemm_line = g.group(1) if g else ""
    return (m.group(1), m.group(2)) if m else ("", ""), losses


(core, why), loss_default = run({})
print("default: core %s (%s); flags avx512=%s avx2=%s" % (core, why, avx512, avx2))
lt.check(run.threads_line.startswith("GOMP_SPINCOUNT=20000 (set by loom"), "default waiting: %s" % run.threads_line)
if avx512:
    lt.check(core.lower() in WIDE512, "AVX-512 CPU but OpenBLAS runs %s" % core)
elif avx2:
    lt.check(core.lower() in WIDE2 and core.lower() not in WIDE512, "AVX2 CPU, core %s" % core)
lt.check("avx2" in why if avx2 else True, "reason names the flags: %s" % why)

if avx2:
    (core_u, why_u), loss_user = run({"OPENBLAS_CORETYPE": "Haswell"})
    print("user Haswell: core %s (%s)" % (core_u, why_u))
    lt.check(core_u == "Haswell" and "set by the user" in why_u, "user's choice not kept: %s (%s)" % (core_u, why_u))
    # narrower than the flags allow: the line says so and how to undo it
    lt.check(("narrower than the SkylakeX kernels" in why_u and "unset it" in why_u) == avx512,
             "AVX-512 %s, user Haswell: %s" % (avx512, why_u))
    lt.check(len(loss_user) == 2 and len(loss_default) == 2, "two losses each")
    for a, b in zip(loss_user, loss_default):
        lt.check(abs(a - b) <= 1e-5 * abs(b), "loss %.6f (Haswell) vs %.6f (default)" % (a, b))

def have_dnnl():
    import ctypes
    try:
        ctypes.CDLL("libdnnl.so.2")
        return True
    except OSError:
        return False


DNNL_FP32 = "oneDNN"
dnnl_line = run.gemm_line
if avx512 and have_dnnl():
    lt.check(re.search(r"; oneDNN \S+ matmul \([^)]*avx512[^)]*\) for forward and input-gradient products$",
                       dnnl_line) is not None, "AVX-512 CPU with oneDNN, but the gemm line: %s" % dnnl_line)
else:
    lt.check(DNNL_FP32 not in dnnl_line, "oneDNN named without AVX-512 or libdnnl: %s" % dnnl_line)
_, loss_blas = run({"LOOM_FP32_GEMM": "openblas"})
print("LOOM_FP32_GEMM=openblas: %s" % run.gemm_line)
lt.check(DNNL_FP32 not in run.gemm_line, "LOOM_FP32_GEMM=openblas, but the gemm line: %s" % run.gemm_line)
lt.check(len(loss_blas) == 2, "two losses with OpenBLAS alone")
for a, b in zip(loss_blas, loss_default):
    lt.check(abs(a - b) <= 1e-5 * abs(b), "loss %.6f (OpenBLAS alone) vs %.6f (default)" % (a, b))

(core_o, why_o), _ = run({"LOOM_BLAS_AUTO": "0"})
print("LOOM_BLAS_AUTO=0: core %s (%s)" % (core_o, why_o))
lt.check("OpenBLAS's own choice" in why_o, "auto off but: %s" % why_o)

for extra, want in (({"GOMP_SPINCOUNT": "5000"}, "GOMP_SPINCOUNT=5000 (set by the user)"),
                    ({"OMP_WAIT_POLICY": "passive"}, "OMP_WAIT_POLICY=passive (set by the user)"),
                    ({"LOOM_OMP_AUTO": "0"}, "the OpenMP runtime's default waiting")):
    run(extra)
    print("%s: %s" % (extra, run.threads_line))
    lt.check(run.threads_line == want, "%s: threads line %r, want %r" % (extra, run.threads_line, want))
lt.done()
