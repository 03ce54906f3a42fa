"""test_launcher.py - launcher sanity (loom_comm_init, comm.h): a job whose
environment says N > 1 ranks while MPI made a world of one - loom built
against another MPI than the launcher's - stops on every process with exit 64
and a message naming the mismatch, before anything is written; so does a world
of another size than scripts/loomrun asked for (LOOM_EXPECT_WORLD).

  (a) two processes started as Hydra starts them (PMI_RANK 0/1, PMI_SIZE=2),
      as in the issue: both exit 64 naming PMI_SIZE=2, no metrics file, no
      parameter file;
  (b) Slurm's srun variables (SLURM_STEP_NUM_TASKS=4), a PMIx rank 1: 64;
  (c) LOOM_EXPECT_WORLD=2 on a world of one: 64 naming it;
  (d) scripts/loomrun -np 2 with a matching world trains (the check is quiet).
"""
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
import loomtest as lt  # noqa: E402

ARGS = ["train", "--model", "tiny", "--steps", "1", "--batch", "2", "--seq", "16", "--peak-flops", "1e9"]


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_", "PMI", "SLURM_", "LOOM_EXPECT"))}
    env.update(OMP_NUM_THREADS="1", **extra)
    return env


def main():
    tmp = tempfile.mkdtemp(prefix="loom-launch-")
    data = lt.make_text_data(tmp)
    common = ARGS + ["--data", data]

    # (a) two processes, as another MPI's launcher starts them
    procs = []
    for r in range(2):
        out = os.path.join(tmp, "m%d" % r)
        cmd = [lt.LOOM] + common + ["--metrics", out + ".jsonl", "--save-params", out + ".safetensors"]
        procs.append(subprocess.Popen(cmd, env=clean_env(PMI_RANK=str(r), PMI_SIZE="2"), stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    for r, p in enumerate(procs):
        out, err = p.communicate(timeout=120)
        lt.check(p.returncode == 64, "(a) rank %d exit %d, expected 64:\n%s" % (r, p.returncode, err))
        lt.check("launcher mismatch" in err and "PMI_SIZE=2" in err and "world of 1" in err,
                 "(a) rank %d names the mismatch: %s" % (r, err))
        lt.check(err.count("\n") == 1, "(a) rank %d prints one line: %r" % (r, err))
    written = [f for f in os.listdir(tmp) if f.startswith("m")]
    lt.check(not written, "(a) nothing written: %s" % written)

    # (b) Slurm, PMIx
    for label, env in [("slurm", {"SLURM_STEP_NUM_TASKS": "4", "SLURM_PROCID": "0"}), ("pmix", {"PMIX_RANK": "1"})]:
        p = subprocess.run([lt.LOOM] + common, env=clean_env(**env), capture_output=True, text=True, timeout=120)
        name = list(env)[0] if label == "slurm" else "PMIX_RANK=1"
        lt.check(p.returncode == 64 and "launcher mismatch" in p.stderr and name in p.stderr,
                 "(b) %s: exit %d: %s" % (label, p.returncode, p.stderr))

    # (c) a world of another size than loomrun asked for
    p = subprocess.run([lt.LOOM] + common, env=clean_env(LOOM_EXPECT_WORLD="2"), capture_output=True, text=True,
                       timeout=120)
    lt.check(p.returncode == 64 and "LOOM_EXPECT_WORLD=2" in p.stderr and "world of 1" in p.stderr,
             "(c) exit %d: %s" % (p.returncode, p.stderr))

    # (d) the launcher loom's MPI expects: quiet
    p = subprocess.run([lt.LOOM_RUN, "-np", "2", lt.LOOM] + common + ["--dp", "2"], env=clean_env(),
                       capture_output=True, text=True, timeout=300)
    lt.check(p.returncode == 0 and "mismatch" not in p.stderr, "(d) loomrun -np 2: exit %d: %s" %
             (p.returncode, p.stderr[-2000:]))
    lt.done()


if __name__ == "__main__":
    main()
