#!/usr/bin/env python3
"""SIGTERM / SIGINT with --save-dir (docs/checkpoints.md): the job finishes
the step it is in, saves DIR/step_K, exits 75 (every rank), and
--resume DIR continues exactly: the resumed losses and the final
parameters are bitwise equal to an uninterrupted run of the same layout.
Once on one process (SIGINT) and once on 2 ranks (dp2 zero1) with SIGTERM
delivered to rank 1 only (the ranks agree on it after each step).

Through the launcher (scripts/loomrun on 2 ranks, a longer run): SIGTERM and
SIGINT sent to loomrun - what a batch system or Ctrl-C does - stop every
rank after a step with the checkpoint saved, and loomrun exits 75 (Open MPI
alone would kill the ranks after 1 s and exit 1); the SIGTERM run resumes
from its checkpoint to the end. A SIGTERM to loomrun once the last step is
logged changes nothing: exit 0, the final checkpoint saved. loomrun killed
with SIGKILL does not leave its job running."""
import os
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
import ckptlib  # noqa: E402
import loomtest as lt  # noqa: E402
import numpy as np  # noqa: E402

STEPS = 80
COMMON = ["--steps", STEPS, "--quiet", "--batch", 8, "--seq", 32, "--lr", "1e-3", "--warmup", 2, "--seed", 9,
          "--peak-flops", "1e11", "--no-progress"]


def descendants(pid):
    """Processes below pid, as {pid: argv} (Linux /proc/PID/task/TID/children:
    a few reads, not a scan of every process on a busy machine)."""
    out, todo = {}, [pid]
    while todo:
        p = todo.pop()
        try:
            kids = []
            for t in os.listdir("/proc/%d/task" % p):
                with open("/proc/%d/task/%s/children" % (p, t)) as f:
                    kids += [int(k) for k in f.read().split()]
        except OSError:
            continue
        for k in kids:
            try:
                with open("/proc/%d/cmdline" % k, "rb") as f:
                    out[k] = f.read().split(b"\0")
            except OSError:
                continue
            todo.append(k)
    return out


def proc_status(pid):
    """/proc/PID/status as a dict; State "gone" once it has ended."""
    try:
        with open("/proc/%d/status" % pid) as f:
            st = dict(line.rstrip("\n").split(":\t", 1) for line in f if ":\t" in line)
    except OSError:
        return {"State": "gone", "ShdPnd": "0"}
    return st if not st["State"].startswith("Z") else {"State": "gone", "ShdPnd": "0"}


def wait_started(p, metrics):
    """Until the job opened its metrics file: its signal handlers are in
    place (installed before setup) and all its steps are still to come."""
    deadline = time.time() + 120
    while time.time() < deadline and p.poll() is None and not os.path.exists(metrics + ".tmp"):
        time.sleep(0.005)


def signal_frozen(ranks, target, sig, arrives):
    """Send sig to target while every rank is stopped (SIGSTOP), wait until
    the signal each rank is to get (`arrives`: {pid: signal}) is pending on
    it, then continue them: the signal lands inside the run whatever the
    machine's load, not after it."""
    for r in ranks:
        os.kill(r, signal.SIGSTOP)
    deadline = time.time() + 60
    while time.time() < deadline and not all(proc_status(r)["State"][0] in "Tg" for r in ranks):
        time.sleep(0.01)
    os.kill(target, sig)
    while time.time() < deadline and not all(
            int(proc_status(r)["ShdPnd"], 16) >> (s - 1) & 1 or proc_status(r)["State"] == "gone"
            for r, s in arrives.items()):
        time.sleep(0.01)
    for r in ranks:
        os.kill(r, signal.SIGCONT)


def loom_ranks(pid):
    return sorted(k for k, argv in descendants(pid).items() if argv and argv[0].endswith(b"/loom"))


def interrupted_run(tmp, tag, np_, flags, sig, rank_index):
    ck = os.path.join(tmp, "ck_" + tag)
    metrics = os.path.join(tmp, tag + ".jsonl")
    args = ["train"] + flags + ["--save-dir", ck, "--metrics", metrics]
    cmd = ([lt.LOOM_RUN, "-np", str(np_), lt.LOOM] if np_ else [lt.LOOM]) + [str(a) for a in args]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_started(p, metrics)

    def steps_logged():
        return logged(metrics)
    ranks = loom_ranks(p.pid) if np_ else [p.pid]
    lt.check(len(ranks) == (np_ or 1), "%s: found %d loom processes under the launcher" % (tag, len(ranks)))
    target = ranks[min(rank_index, len(ranks) - 1)]
    seen = steps_logged()  # the ranks are past this step when they stop
    signal_frozen(ranks, target, sig, {target: sig})
    out, err = p.communicate(timeout=120)
    lt.check(p.returncode == 75, "%s: exit %d after signal %d, expected 75:\n%s" % (tag, p.returncode, sig, err[-2000:]))
    with open(os.path.join(ck, "latest")) as f:
        latest = f.read().strip()
    k = int(latest.split("_")[1])
    lt.check(seen <= k < STEPS, "%s: saved step %d, signal sent after %d steps" % (tag, k, seen))
    lt.check("--resume" in err and "signal %d" % sig in err, "%s: message: %s" % (tag, err[-500:]))
    return ck, k


def logged(metrics):
    try:
        with open(metrics + ".tmp") as f:
            return sum(1 for line in f if "\"step\"" in line)  # step rows, not the header
    except OSError:
        return 0


def launcher_run(tmp, tag, args, sig, after, must_run=True):
    """loomrun -np 2 loom train ARGS, signal `sig` to loomrun once `after`
    steps are logged (must_run: with the ranks frozen, signal_frozen);
    returns (process, stdout + stderr, save dir, steps seen,
    whether it still ran when signalled)."""
    ck, metrics = os.path.join(tmp, "ck_" + tag), os.path.join(tmp, tag + ".jsonl")
    cmd = [lt.LOOM_RUN, "-np", "2", lt.LOOM, "train"] + [str(a) for a in args + ["--save-dir", ck, "--metrics", metrics]]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if must_run:
        wait_started(p, metrics)
    deadline = time.time() + 120
    while time.time() < deadline and p.poll() is None and logged(metrics) < after:
        time.sleep(0.01)
    seen = logged(metrics)
    running = p.poll() is None
    if running and must_run:
        relayed = signal.SIGUSR1 if sig == signal.SIGINT else signal.SIGUSR2  # scripts/loomrun
        ranks = loom_ranks(p.pid)
        signal_frozen(ranks, p.pid, sig, {r: relayed for r in ranks})
    elif running:
        os.kill(p.pid, sig)
    out, err = p.communicate(timeout=120)
    lt.check(running or not must_run, "%s: the job ended (exit %d) before the signal:\n%s" % (
        tag, p.returncode, (out + err)[-1500:]))
    return p, out + err, ck, seen, running


def through_launcher(tmp, common):
    steps = STEPS
    flags = common + ["--dp", 2]
    for tag, sig in (("launcher_term", signal.SIGTERM), ("launcher_int", signal.SIGINT)):
        p, err, ck, seen, _ = launcher_run(tmp, tag, flags, sig, 0)
        k = int(ckptlib.latest(ck).split("_")[1]) if ckptlib.latest(ck) else -1
        lt.check(p.returncode == 75 and "stopped by signal %d" % sig in err and "--resume" in err,
                 "%s: loomrun exit %d, want 75:\n%s" % (tag, p.returncode, err[-1500:]))
        lt.check(seen <= k < steps and ckptlib.newest_verified(ck) == os.path.join(ck, "step_%d" % k),
                 "%s: saved step %d (verifies: %s), signal after %d of %d steps" % (
                     tag, k, ckptlib.newest_verified(ck), seen, steps))
        print("%s: loomrun exit %d, every rank stopped after step %d (signal after %d)" % (tag, p.returncode, k, seen))
        if sig == signal.SIGTERM:
            m = os.path.join(tmp, tag + "_resumed.jsonl")
            r = lt.run(["train"] + flags + ["--resume", ck, "--save-dir", ck, "--metrics", m], np=2, check_ok=False)
            done = sorted(x["step"] for x in lt.read_metrics(m)) if r.returncode == 0 else []
            lt.check(r.returncode == 0 and done == list(range(k + 1, steps + 1)) and ckptlib.latest(ck) == "step_%d" % steps,
                     "%s: resume exit %d, steps %s, latest %s\n%s" % (
                         tag, r.returncode, done[:3], ckptlib.latest(ck), r.stderr[-800:]))
    # loomrun killed (SIGKILL: a timeout, a crash): its watcher ends the job
    metrics = os.path.join(tmp, "killed.jsonl")
    p = subprocess.Popen([lt.LOOM_RUN, "-np", "2", lt.LOOM, "train"] + [str(a) for a in [
        a if a != STEPS else 1000000 for a in common] + ["--dp", 2, "--metrics", metrics]],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_started(p, metrics)
    ranks = loom_ranks(p.pid)
    p.kill()
    p.wait()
    deadline = time.time() + 60
    while time.time() < deadline and not all(proc_status(r)["State"] == "gone" for r in ranks):
        time.sleep(0.1)
    lt.check(len(ranks) == 2 and all(proc_status(r)["State"] == "gone" for r in ranks),
             "loomrun killed: ranks %s still there" % [r for r in ranks if proc_status(r)["State"] != "gone"])
    print("loomrun SIGKILLed: its 2 ranks ended")
    # after the last step: the run finished, the signal changes nothing
    last = [a if a != STEPS else 40 for a in common] + ["--dp", 2]
    p, err, ck, seen, running = launcher_run(tmp, "launcher_late", last, signal.SIGTERM, 40, must_run=False)
    lt.check(p.returncode == 0 and ckptlib.latest(ck) == "step_40" and ckptlib.verifies(os.path.join(ck, "step_40")),
             "late signal: loomrun exit %d, latest %s\n%s" % (p.returncode, ckptlib.latest(ck), err[-1500:]))
    print("late signal (after step %d of 40, %s): loomrun exit %d, latest %s" % (
        seen, "the job still running" if running else "the job had ended", p.returncode, ckptlib.latest(ck)))


def main():
    with tempfile.TemporaryDirectory() as tmp:
        data = lt.make_text_data(tmp)
        # about 10 ms a step here: the job is still running when the signal arrives
        model = lt.write_model(tmp, n_layer=2, n_head=4, n_embd=64, vocab_size=256, n_positions=32)
        common = ["--model", model, "--data", data] + COMMON
        for tag, np_, flags, sig, victim in (("one", None, [], signal.SIGINT, 0),
                                             ("dp2z1", 2, ["--dp", 2, "--zero", 1], signal.SIGTERM, 1)):
            ref_m, ref_p = lt.train(tmp, tag + "_ref", np_, common + flags)
            ck, k = interrupted_run(tmp, tag, np_, common + flags, sig, victim)
            m, p = lt.train(tmp, tag + "_resumed", np_, common + flags + ["--resume", ck])
            a = {x["step"]: x["loss"] for x in lt.read_metrics(ref_m)}
            b = {x["step"]: x["loss"] for x in lt.read_metrics(m)}
            lt.check(sorted(b) == list(range(k + 1, STEPS + 1)), "%s: resumed steps %s" % (tag, sorted(b)[:3]))
            lt.check(all(a[s] == b[s] for s in b), "%s: resumed losses differ" % tag)
            pa, _ = lt.st.load(ref_p)
            pb, _ = lt.st.load(p)
            lt.check(all(np.array_equal(pa[n], pb[n]) for n in pa), "%s: final parameters differ" % tag)
            print("%s: signal %d, saved step %d, resumed %d steps bitwise equal" % (tag, sig, k, len(b)))
        through_launcher(tmp, common)
    lt.done()


if __name__ == "__main__":
    main()
