#!/usr/bin/env python3
"""A rank killed with kill -9 is named by loom itself (issue 31, item 6):
the surviving ranks of its host read its slot on the progress board (shared
memory, src/comm/comm_job.c), see that its process is gone while it was
running, and the lowest of them prints

    loom: error: rank R (pid P on host H) died (killed by a signal, or crashed) ...

and every survivor exits 69 instead of waiting for it in a collective that
cannot finish. Before, loom printed nothing; only mpirun named the rank.

Three jobs of `loom train --save-dir` through scripts/loomrun, the victim
killed with SIGKILL once the run has started:
  dp2, rank 1 killed, each rank under rank_exit.py (which records how it
      ended): the survivor's watch thread finds the death;
  pp2, rank 0 killed, under rank_exit.py likewise;
  dp2, rank 1 killed, no wrapper: the survivor is mpirun's own child and
      finds the death at the SIGCONT with which Open MPI starts ending it.
Each asserts the message with the victim's rank, pid and host, every rank
ended non-zero (the victim by signal 9, the survivor with exit 69 where
recorded), mpirun non-zero, and no process of the job left. With --save-dir
a survivor catches mpirun's SIGTERM (it would finish its step and save), so
only loom's own check can end it before mpirun's SIGKILL: Open MPI's kill
grace (odls_base_sigkill_timeout) is 5 s here against the at most 0.25 s
(plus scheduling) the survivor's watch thread takes - Open MPI waits the
grace out twice even when every rank has ended, so a case takes about 10 s.
Every wait is bounded (300 s): a hang fails the test instead of hanging it.

The run is given 10^9 steps and the test checks that the kill landed while
it ran (its metrics still FILE.tmp afterwards): with 100000 steps this tiny
model finished in 30-70 s, and under load (2 cores, load average 30-45) a
scan of /proc here took up to 31 s, so the victim was sometimes found only
after the run had completed - the "survivor" then rightly exited 0 with no
message (its metrics renamed, all 100001 lines written): the flaky failures
of this test were kills after the end, not a death loom missed. The victim
is looked for among the job's own processes only.
"""
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
import loomtest as lt  # noqa: E402

WRAP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rank_exit.py")


def procs_of(tmp, among=None):
    """(pid, argv, world rank or None) of every process (of those among, if
    given) whose command line names tmp."""
    out = []
    for pid in (map(str, among) if among is not None else os.listdir("/proc")):
        if not pid.isdigit():
            continue
        try:
            with open("/proc/%s/cmdline" % pid, "rb") as f:
                argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
            with open("/proc/%s/environ" % pid, "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
        except OSError:
            continue
        if any(tmp in a for a in argv):
            r = env.get(b"OMPI_COMM_WORLD_RANK", b"")
            out.append((int(pid), argv, int(r) if r.isdigit() else None))
    return out


def run_case(tmp, data, model, label, layout, victim, wrap):
    d = os.path.join(tmp, label)
    os.mkdir(d)
    metrics = os.path.join(d, "m.jsonl")
    prefix = os.path.join(d, "end")
    cmd = [lt.LOOM_RUN, "-np", "2"] + ([sys.executable, WRAP, prefix, "--"] if wrap else [])
    cmd += [lt.LOOM, "train", "--model", model, "--data", data, "--steps", "1000000000", "--batch", "4",
            "--seq", "16", "--no-progress", "--quiet", "--peak-flops", "1e11", "--metrics", metrics,
            "--save-dir", os.path.join(d, "ck"), "--save-every", "100000"] + layout
    env = dict(os.environ, OMPI_MCA_odls_base_sigkill_timeout="5")
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                         start_new_session=True)
    deadline, pid = time.time() + 300, None
    while time.time() < deadline and p.poll() is None and pid is None:
        if os.path.exists(metrics + ".tmp"):
            ranks = [q for q, argv, r in procs_of(d, lt.descendants(p.pid)) if argv[0] == lt.LOOM and r == victim]
            pid = ranks[0] if len(ranks) == 1 else None
        time.sleep(0.05)
    lt.check(pid is not None and p.poll() is None, "%s: no running rank %d found (job %s)" % (label, victim, p.poll()))
    if pid is not None:
        os.kill(pid, signal.SIGKILL)
    t_kill = time.time()
    try:
        out, _ = p.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(OSError):
            os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate(timeout=30)
        lt.check(False, "%s: the job was still running 300 s after rank %d was killed" % (label, victim))
    took = time.time() - t_kill
    want = "loom: error: rank %d (pid %d on host %s) died" % (victim, pid or -1, socket.gethostname())
    said = [line for line in out.splitlines() if want in line]
    print("%s: mpirun rc %d %.1f s after the kill; %s" % (label, p.returncode, took, said[0] if said else "no message"))
    lt.check(p.returncode != 0, "%s: mpirun exited 0" % label)
    lt.check(os.path.exists(metrics + ".tmp") and not os.path.exists(metrics),
             "%s: the run was not running when rank %d was killed (metrics complete)" % (label, victim))
    lt.check(len(said) == 1, "%s: want one line with '%s':\n%s" % (label, want, out[-3000:]))
    if wrap:
        ends = []
        for r in range(2):
            with contextlib.suppress(OSError):
                with open("%s.rank%d" % (prefix, r)) as f:
                    ends.append(f.readline().strip())
        print("%s: rank ends %s" % (label, ends))
        survivor = 1 - victim
        lt.check(len(ends) == 2 and ends[victim] == "signal 9" and ends[survivor] == "exit 69",
                 "%s: rank ends %s, want rank %d 'signal 9' and rank %d 'exit 69'" % (label, ends, victim, survivor))
    time.sleep(0.5)
    left = procs_of(d)
    lt.check(not left, "%s: processes left: %s" % (label, left))
    for q, _, _ in left:
        with contextlib.suppress(OSError):
            os.kill(q, signal.SIGKILL)


def main():
    with tempfile.TemporaryDirectory() as tmp:
        data = lt.make_text_data(tmp)
        model = lt.write_model(tmp, n_layer=2, n_head=2, n_embd=32, vocab_size=256, n_positions=32)
        run_case(tmp, data, model, "dp2", ["--dp", "2"], 1, True)
        run_case(tmp, data, model, "pp2", ["--pp", "2"], 0, True)
        run_case(tmp, data, model, "dp2_plain", ["--dp", "2"], 1, False)
    lt.done()


if __name__ == "__main__":
    main()
