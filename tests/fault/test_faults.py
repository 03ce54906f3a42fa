#!/usr/bin/env python3
"""Failures after the first collective end the whole job promptly (train.h).

Through the real `loom` binary under the project's launcher, each rank run
under rank_exit.py (which records how that rank ended):

(a) --metrics on a full disk, dp=2: rank 0's write fails mid-training while
    rank 1 waits in the DP all-reduce. Every rank and mpirun must exit
    non-zero (mpirun with 74, I/O error) within 30 s of the last successful
    write, one loom error line must name "rank 0", --metrics and the OS's
    cause, no process of the job may be left, and the earlier file at the
    metrics path must be byte-identical.
(b) SIGKILL of rank 2 of 4 once the metrics show steps running: every process
    must be gone within 30 s, mpirun non-zero, the killed rank recorded as
    signal 9 and the others non-zero. The naming of the rank and the signal
    is Open MPI's report ("process rank 2 ... exited on signal 9"): a killed
    process cannot speak for itself, so the test accepts the launcher's line.
(c) --save-params onto a full disk, dp=2: every rank non-zero, mpirun 74, the
    message names rank 0 and the cause, the earlier file is intact and no
    .tmp is left on the full disk.

The full disk is a 16 KiB / 64 KiB tmpfs mounted in a temporary directory
(for (a) filled to within 4 KiB first, so it fills after a few steps).
Where mounting is refused, the write error comes another real way: the
output's FILE.tmp is a symbolic link to /dev/full, whose writes fail with
ENOSPC in the kernel; the test says which it used and never skips
(LOOM_FAULT_NO_MOUNT=1 forces the second way, to check it where mounting works).
Every subprocess is bounded by a timeout; leftovers are killed on failure.
Rank end times printed include Open MPI's kill sequence, lengthened to 3 s
per signal here (see rank_exit.py); at its default of 1 s the ranks ended
0.1-1.6 s after the fault.
"""
import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
import loomtest as lt  # noqa: E402

WRAP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rank_exit.py")
TINY = ["--model", "tiny", "--seq", "16", "--peak-flops", "1e11", "--no-progress", "--quiet"]
EIO = 74  # status.h: LOOM_EIO, the documented code of a failed write
cause = os.strerror(28)  # ENOSPC: "No space left on device"


@contextlib.contextmanager
def full_disk(tmp, name, size, out):
    """The path of an output file `out` on a full disk. Normally a tmpfs of
    `size` bytes mounted at TMP/NAME; where mounting is refused (or
    LOOM_FAULT_NO_MOUNT is set, to check this way where it works), the
    output's FILE.tmp is a symbolic link to /dev/full, whose every write fails
    with ENOSPC in the kernel."""
    d = os.path.join(tmp, name)
    os.mkdir(d)
    if os.environ.get("LOOM_FAULT_NO_MOUNT"):
        r = subprocess.CompletedProcess([], 1, "", "LOOM_FAULT_NO_MOUNT is set")
    else:
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=%d" % size, "tmpfs", d],
                           capture_output=True, text=True, timeout=30)
    path = os.path.join(d, out)
    if r.returncode != 0:
        print("mount refused (%s); %s.tmp -> /dev/full instead" % (r.stderr.strip(), path))
        os.symlink("/dev/full", path + ".tmp")
        yield path
        return
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", d], timeout=30)


def leave_free(d, nbytes):
    """Fill the file system of d but for about nbytes (a no-op where writes
    cannot fill it: with /dev/full nothing is written there)."""
    if not os.path.ismount(d):
        return
    filler = os.path.join(d, "filler")
    with open(filler, "wb", buffering=0) as f:
        with contextlib.suppress(OSError):
            while True:
                f.write(b"x" * 1024)
    os.truncate(filler, max(0, os.path.getsize(filler) - nbytes))


def job_procs(tmp):
    """(pid, argv) of every process whose argv names tmp (this job's only)."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        if any(tmp.encode() in a for a in argv):
            out.append((int(pid), [a.decode(errors="replace") for a in argv if a]))
    return out


def rank_of(pid):
    try:
        with open("/proc/%d/environ" % pid, "rb") as f:
            env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
    except OSError:
        return None
    for var in (b"OMPI_COMM_WORLD_RANK", b"PMI_RANK", b"PMIX_RANK"):
        if env.get(var, b"").isdigit():
            return int(env[var])
    return None


def kill_all(tmp):
    for pid, _ in job_procs(tmp):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


class Job:
    """`loom ARGS` on np ranks, each under rank_exit.py, in its own session."""

    def __init__(self, tmp, tag, np, args):
        self.tmp, self.np, self.prefix = tmp, np, os.path.join(tmp, tag)
        self.cmd = [lt.LOOM_RUN, "-np", str(np), sys.executable, WRAP, self.prefix, "--", lt.LOOM]
        self.cmd += [str(a) for a in args]
        self.log = open(self.prefix + ".out", "w+")
        self.t0 = time.time()
        env = dict(os.environ, OMPI_MCA_odls_base_sigkill_timeout="3")  # see rank_exit.py
        self.p = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                  start_new_session=True)

    def wait(self, timeout):
        """mpirun's exit code (None if it overran: then everything is killed)."""
        try:
            rc = self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(OSError):
                os.killpg(self.p.pid, signal.SIGKILL)
            kill_all(self.tmp)
            self.p.wait(timeout=30)
            rc = None
        self.t_end = time.time()
        self.log.seek(0)
        self.output = self.log.read()
        self.log.close()
        return rc

    def rank_records(self):
        """Per rank: (how it ended, when), or (None, None) without a record."""
        recs = []
        for r in range(self.np):
            try:
                with open("%s.rank%d" % (self.prefix, r)) as f:
                    how, when = f.read().split("\n")[:2]
                recs.append((how, float(when)))
            except (OSError, ValueError):
                recs.append((None, None))
        return recs

    def rank_ends(self):
        return [how for how, _ in self.rank_records()]

    def check_prompt(self, label, t_fault):
        """Every rank and mpirun ended within 30 s of the fault; prints the times."""
        whens = [w for _, w in self.rank_records() if w is not None]
        last = max(whens) if whens else float("inf")
        print("%s: last rank ended %.1f s, mpirun %.1f s after the fault"
              % (label, last - t_fault, self.t_end - t_fault))
        lt.check(last - t_fault <= 30 and self.t_end - t_fault <= 30,
                 "%s: ranks ended %.1f s, mpirun %.1f s after the fault (limit 30 s)"
                 % (label, last - t_fault, self.t_end - t_fault))

    def check_all_ended(self, label):
        """No process of this job left (killing any so the suite goes on)."""
        time.sleep(0.5)
        left = job_procs(self.tmp)
        lt.check(not left, "%s: processes left behind: %s" % (label, left))
        kill_all(self.tmp)

    def check_ranks_failed(self, label):
        ends = self.rank_ends()
        print("%s: rank ends %s" % (label, ends))
        for r, e in enumerate(ends):
            lt.check(e is not None and e != "exit 0",
                     "%s: rank %d ended %s, expected a non-zero exit or a signal" % (label, r, e))

    def show(self, label, rc):
        print("%s: mpirun rc %s after %.1f s; output:\n%s" % (label, rc, self.t_end - self.t0,
                                                             self.output.rstrip()))


def loom_errors(output):
    return [l for l in output.splitlines() if l.startswith("loom: error:")]


def test_metrics_full_disk(tmp, data):
    with full_disk(tmp, "full_m", 16 * 1024, "m.jsonl") as m:
        earlier = b'{"step": 1, "loss": 5.5, "from": "an earlier run"}\n'
        with open(m, "wb") as f:
            f.write(earlier)
        leave_free(os.path.dirname(m), 4096)  # full after a few steps, even on a slow machine
        job = Job(tmp, "metrics", 2, ["train"] + TINY + ["--dp", 2, "--batch", 2, "--steps", 10 ** 6,
                                                         "--data", data, "--metrics", m])
        rc = job.wait(120)
        job.show("metrics on a full disk", rc)
        tmpf = m + ".tmp"  # its last write is the last success (a link to /dev/full: none)
        t_fail = os.stat(tmpf).st_mtime if not os.path.islink(tmpf) and os.path.exists(tmpf) else job.t0
        lt.check(rc == EIO, "metrics full disk: mpirun rc %s, expected %d" % (rc, EIO))
        job.check_prompt("metrics full disk (fault: the last successful write)", t_fail)
        job.check_ranks_failed("metrics full disk")
        lt.check(job.rank_ends()[0] == "exit %d" % EIO, "metrics full disk: rank 0 did not exit %d" % EIO)
        errs = loom_errors(job.output)
        lt.check(len(errs) == 1 and "rank 0" in errs[0] and "--metrics " + m in errs[0]
                 and cause in errs[0],
                 "metrics full disk: expected one error naming rank 0, --metrics %s and '%s': %s"
                 % (m, cause, errs))
        with open(m, "rb") as f:
            lt.check(f.read() == earlier, "metrics full disk: the earlier %s was changed" % m)
        job.check_all_ended("metrics full disk")


def wait_for_steps(job, path, n, timeout):
    """Until `path` holds n step rows (steps are running) or the job ends."""
    t_end = time.time() + timeout
    while time.time() < t_end and job.p.poll() is None:
        with contextlib.suppress(OSError):
            with open(path) as f:
                if sum(1 for line in f if '"step"' in line) >= n:  # not the header row
                    return True
        time.sleep(0.1)
    return False


def test_kill_rank(tmp, data):
    m = os.path.join(tmp, "kill.jsonl")
    job = Job(tmp, "kill", 4, ["train"] + TINY + ["--dp", 4, "--batch", 4, "--steps", 10 ** 6,
                                                  "--data", data, "--metrics", m])
    running = wait_for_steps(job, m + ".tmp", 3, 120)
    lt.check(running, "kill: training never showed 3 steps in %s.tmp" % m)
    victim = [pid for pid, argv in job_procs(tmp) if argv[0] == lt.LOOM and rank_of(pid) == 2]
    lt.check(len(victim) == 1, "kill: expected one loom process of rank 2, found %s" % victim)
    t_kill = time.time()
    if running and len(victim) == 1:
        os.kill(victim[0], signal.SIGKILL)
    rc = job.wait(60)
    job.show("SIGKILL of rank 2", rc)
    lt.check(rc not in (0, None), "kill: mpirun rc %s, expected non-zero" % rc)
    job.check_prompt("kill (fault: the SIGKILL)", t_kill)
    job.check_ranks_failed("kill")
    lt.check(job.rank_ends()[2] == "signal 9", "kill: rank 2 ended %s" % job.rank_ends()[2])
    named = re.search(r"rank 2\b.*(signal 9|Killed)", job.output)
    lt.check(named is not None, "kill: no line names rank 2 and signal 9")
    job.check_all_ended("kill")


def test_save_params_full_disk(tmp, data):
    with full_disk(tmp, "full_p", 64 * 1024, "p.safetensors") as p:
        earlier = b"parameters of an earlier run\n" * 100
        with open(p, "wb") as f:
            f.write(earlier)
        job = Job(tmp, "save", 2, ["train"] + TINY + ["--dp", 2, "--batch", 2, "--steps", 2,
                                                      "--data", data, "--save-params", p])
        rc = job.wait(120)
        job.show("save-params on a full disk", rc)
        lt.check(rc == EIO, "save full disk: mpirun rc %s, expected %d" % (rc, EIO))
        job.check_prompt("save full disk (fault: any time after the launch)", job.t0)
        job.check_ranks_failed("save full disk")
        errs = loom_errors(job.output)
        lt.check(len(errs) == 1 and "rank 0" in errs[0] and p in errs[0] and cause in errs[0],
                 "save full disk: expected one error naming rank 0, %s and '%s': %s" % (p, cause, errs))
        with open(p, "rb") as f:
            lt.check(f.read() == earlier, "save full disk: the earlier %s was changed" % p)
        lt.check(not os.path.lexists(p + ".tmp"), "save full disk: %s.tmp left on the full disk" % p)
        job.check_all_ended("save full disk")


def main():
    with tempfile.TemporaryDirectory(prefix="loomfault_") as tmp:
        try:
            data = lt.make_text_data(tmp)
            test_metrics_full_disk(tmp, data)
            test_kill_rank(tmp, data)
            test_save_params_full_disk(tmp, data)
        finally:
            kill_all(tmp)
    lt.done()


if __name__ == "__main__":
    main()
