#!/usr/bin/env python3
"""Crash test for checkpoints (docs/checkpoints.md): kill -9 a random rank
at a random moment while a job saves a checkpoint after every step, again
and again; each new job resumes with --resume DIR under a layout picked at
random (so resuming also reshards).

Every time: the checkpoint the job resumed from (it prints it) is complete -
its manifest's own SHA-256 and every file's match, computed here with
hashlib (tests/lib/ckptlib.py) - and is the newest step_N that does
(DIR/latest is only a hint); every checkpoint published before the kill is
still there and still verifies (no --keep, so none may go). A step_N.tmp directory left
by a kill is never chosen. Counts how many kills landed while a save was in
flight (a step_N.tmp present right after the kill).

A share of the kills (--mpirun-kills, of jobs with more than one rank) goes
to mpirun instead of a rank: its ranks must then end on their own (loom's
launcher check) within the bound, leaving no process behind.

Each resumed job must also continue the run's own state: every loss it
prints is compared with a straight one-rank run of the same settings (made at
the end, as far as the jobs got); the layouts differ only by float32
rounding, so a resume of another step's or another tensor's state shows as a
jump. After the last kill one more job resumes and is stopped with SIGTERM
through scripts/loomrun: it must exit 75, and DIR/latest must then name the
newest step that verifies.

usage: ckpt_crash.py [--iterations N] [--seed S] [--layouts L,...] [--mpirun-kills F]
(CI runs a few; bench/ckpt_crash.sh for the long run)"""
import argparse
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
import ckptlib  # noqa: E402
import loomtest as lt  # noqa: E402

LAYOUTS = {"1": (1, []), "dp2z2": (2, ["--dp", 2, "--zero", 2]), "tp2": (2, ["--tp", 2]), "pp2": (2, ["--pp", 2]),
           "dp2z1": (2, ["--dp", 2, "--zero", 1]), "dp2tp2z3": (4, ["--dp", 2, "--tp", 2, "--zero", 3]),
           "pp2zb": (2, ["--pp", 2, "--schedule", "zb"])}
LOSS_TOL = 1e-3  # |loss - straight one-rank loss|: float32 rounding of another layout, not another state
STEP_LINE = re.compile(r"^step (\d+)/\d+ loss ([0-9.eE+-]+|nan|inf)", re.M)


verifies = ckptlib.verifies
published = ckptlib.published
expected_choice = ckptlib.newest_verified


def loom_pids(root):
    procs = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open("/proc/%s/stat" % d) as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                with open("/proc/%s/cmdline" % d, "rb") as f:
                    argv0 = f.read().split(b"\0")[0]
                procs[int(d)] = (ppid, argv0)
            except (OSError, IndexError, ValueError):
                pass
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        for k, (pp, a0) in procs.items():
            if pp == p:
                todo.append(k)
                if a0.endswith(b"/loom"):
                    out.append(k)
    if procs.get(root, (0, b""))[1].endswith(b"/loom"):
        out.append(root)
    return out


def mpirun_of(pids):
    """The launcher of rank processes pids: their common parent."""
    parents = set()
    for q in pids:
        try:
            with open("/proc/%d/stat" % q) as f:
                parents.add(int(f.read().rsplit(")", 1)[1].split()[1]))
        except (OSError, IndexError, ValueError):
            pass
    return parents.pop() if len(parents) == 1 else None


def alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def straight_losses(common, upto):
    """Losses of steps 1..upto of one rank without --save-dir (the reference)."""
    args = [str(x) for x in common if x not in ("--save-every", 1)]
    i = args.index("--save-dir")
    del args[i:i + 2]
    p = subprocess.Popen([lt.LOOM] + args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    losses = {}
    for line in p.stderr:  # loom logs its step lines to stderr
        m = STEP_LINE.match(line)
        if m:
            losses[int(m.group(1))] = float(m.group(2))
            if int(m.group(1)) >= upto:
                break
    p.kill()
    p.wait()
    return losses


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iterations", type=int, default=5)
    ap.add_argument("--seed", type=int, default=int(time.time()))
    ap.add_argument("--layouts", default=",".join(LAYOUTS), help="comma-separated, of: " + " ".join(LAYOUTS))
    ap.add_argument("--mpirun-kills", type=float, default=0.25, help="share of kills aimed at mpirun")
    a = ap.parse_args()
    layouts = [LAYOUTS[n] for n in a.layouts.split(",")]
    rng = random.Random(a.seed)
    print("seed %d, %d iterations, layouts %s" % (a.seed, a.iterations, a.layouts))
    mid_save = kills = mpirun_kills = resumes = latest_behind = 0
    seen = {}  # step -> (loss, iteration, layout) of every step line a job printed
    with tempfile.TemporaryDirectory() as tmp:
        data = lt.make_text_data(tmp)
        model = lt.write_model(tmp, n_layer=4, n_head=4, n_embd=64, vocab_size=256, n_positions=32)
        ck = os.path.join(tmp, "ck")
        common = ["train", "--model", model, "--data", data, "--steps", 100000, "--batch", 8, "--seq", 16,
                  "--lr", "1e-3", "--seed", 9, "--peak-flops", "1e11", "--no-progress", "--save-dir", ck,
                  "--save-every", 1]
        for it in range(a.iterations):
            np_, flags = rng.choice(layouts)
            before = {s: verifies(os.path.join(ck, "step_%d" % s)) for s in (published(ck) if os.path.isdir(ck) else [])}
            want = expected_choice(ck) if before else None
            args = common + flags + (["--resume", ck] if before else [])
            cmd = ([lt.LOOM_RUN, "-np", str(np_), lt.LOOM] if np_ > 1 else [lt.LOOM]) + [str(x) for x in args]
            p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            # wait for the first save of this job, then kill at a random moment
            t_first = time.time() + 60
            while time.time() < t_first and p.poll() is None:
                if os.path.isdir(ck) and len(published(ck)) > len(before):
                    break
                time.sleep(0.01)
            pids = loom_pids(p.pid)
            if rng.random() < 0.8:  # into a save: wait for a step_N.tmp to appear
                t_end = time.time() + 5
                while time.time() < t_end and p.poll() is None and not any(
                        n.endswith(".tmp") for n in (os.listdir(ck) if os.path.isdir(ck) else [])):
                    pass
                time.sleep(rng.uniform(0.0, 0.004))
            else:
                time.sleep(rng.uniform(0.0, 0.6))
            lt.check(len(pids) == np_ and p.poll() is None, "iteration %d: %d loom processes, job %s" % (it, len(pids), p.poll()))
            launcher = mpirun_of(pids) if np_ > 1 else None
            victim = "rank"
            if pids and p.poll() is None:
                if launcher and rng.random() < a.mpirun_kills:
                    os.kill(launcher, 9)
                    victim = "mpirun"
                    mpirun_kills += 1
                else:
                    os.kill(rng.choice(pids), 9)
                kills += 1
                if os.path.isdir(ck) and any(n.endswith(".tmp") and os.path.isdir(os.path.join(ck, n))
                                             for n in os.listdir(ck)):
                    mid_save += 1
            try:
                out, err = p.communicate(timeout=300)
            except subprocess.TimeoutExpired:
                p.kill()
                out, err = p.communicate()
                lt.check(False, "iteration %d: job still running 300 s after kill -9 of %s" % (it, victim))
            lt.check(p.returncode != 0, "iteration %d: job exited 0 after kill -9 of %s" % (it, victim))
            t_gone = time.time() + 60  # the ranks end on their own (loom's launcher and peer checks)
            while time.time() < t_gone and any(alive(q) for q in pids):
                time.sleep(0.1)
            left = [q for q in pids if alive(q)]
            lt.check(not left, "iteration %d: rank processes %s left 60 s after kill -9 of %s" % (it, left, victim))
            for q in left:
                os.kill(q, 9)
            for m in STEP_LINE.finditer(out + err):
                seen[int(m.group(1))] = (float(m.group(2)), it, " ".join(map(str, flags)) or "1 rank")
            if before:
                m = re.search(r"resumed from (\S+) at step (\d+)", out + err)
                lt.check(m is not None, "iteration %d: no 'resumed from' line:\n%s" % (it, err[-1500:]))
                if m:
                    resumes += 1
                    lt.check(os.path.normpath(m.group(1)) == os.path.normpath(want),
                             "iteration %d: resumed from %s, expected %s" % (it, m.group(1), want))
            for s, ok in before.items():
                d = os.path.join(ck, "step_%d" % s)
                lt.check(os.path.isdir(d) and (not ok or verifies(d)), "iteration %d: earlier %s lost or damaged" % (it, d))
            for s in published(ck):
                lt.check(verifies(os.path.join(ck, "step_%d" % s)), "iteration %d: published step_%d does not verify" % (it, s))
            newest = expected_choice(ck)
            if newest and ckptlib.latest(ck) != os.path.basename(newest):
                latest_behind += 1  # a kill between publishing and moving latest: the next job repairs it
            print("iteration %d: %d ranks %s, kill -9 of %s, %d checkpoints, resumed from %s" % (
                it, np_, " ".join(map(str, flags)), victim, len(published(ck)), want and os.path.basename(want)),
                  flush=True)
        ok = expected_choice(ck)
        lt.check(ok is not None, "no complete checkpoint at the end")
        # the last job: resumed, stopped through the launcher; latest must end on the newest verified step
        np_, flags = layouts[-1]
        args = common + flags + ["--resume", ck]
        cmd = ([lt.LOOM_RUN, "-np", str(np_), lt.LOOM] if np_ > 1 else [lt.LOOM]) + [str(x) for x in args]
        before = len(published(ck))
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        t_end = time.time() + 120
        while time.time() < t_end and p.poll() is None and len(published(ck)) <= before:
            time.sleep(0.01)
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=300)
        for m in STEP_LINE.finditer(out + err):
            seen[int(m.group(1))] = (float(m.group(2)), a.iterations, " ".join(map(str, flags)) or "1 rank")
        newest = expected_choice(ck)
        lt.check(p.returncode == 75, "final job: exit %d after SIGTERM, want 75:\n%s" % (p.returncode, err[-1500:]))
        lt.check(newest is not None and ckptlib.latest(ck) == os.path.basename(newest),
                 "final latest %s, newest verified %s" % (ckptlib.latest(ck), newest))
        print("final job: exit %d, latest %s, newest verified %s" % (
            p.returncode, ckptlib.latest(ck), newest and os.path.basename(newest)))
        # every loss printed against the straight one-rank run
        lt.check(len(seen) > 0, "no step lines from the jobs")
        ref = straight_losses(common, max(seen) if seen else 0)
        worst, where = 0.0, None
        for k, (loss, it, lay) in sorted(seen.items()):
            d = abs(loss - ref.get(k, float("nan")))
            if not d <= worst:
                worst, where = d, (k, it, lay)
        lt.check(worst <= LOSS_TOL, "loss of step %s (iteration %s, %s) differs from the straight run by %g" % (
            where and where[0], where and where[1], where and where[2], worst))
        print("losses: %d steps compared with the straight run, worst |difference| %.3g (step %s)" % (
            len(seen), worst, where and where[0]))
    print("kill -9: %d kills (%d of mpirun), %d while a save was in flight (step_N.tmp present); "
          "%d resumes, each from the newest verified step; latest behind after %d kills (repaired by the next job)"
          % (kills, mpirun_kills, mid_save, resumes, latest_behind))
    lt.done()


if __name__ == "__main__":
    main()
