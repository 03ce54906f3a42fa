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

usage: ckpt_crash.py [--iterations N] [--seed S]   (CI runs a few; bench/ckpt_crash.sh 50)"""
import argparse
import os
import random
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
import ckptlib  # noqa: E402
import loomtest as lt  # noqa: E402

LAYOUTS = [(1, []), (2, ["--dp", 2, "--zero", 2]), (2, ["--tp", 2]), (2, ["--pp", 2]),
           (4, ["--dp", 2, "--tp", 2, "--zero", 3])]


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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iterations", type=int, default=5)
    ap.add_argument("--seed", type=int, default=int(time.time()))
    a = ap.parse_args()
    rng = random.Random(a.seed)
    print("seed %d, %d iterations" % (a.seed, a.iterations))
    mid_save = kills = 0
    with tempfile.TemporaryDirectory() as tmp:
        data = lt.make_text_data(tmp)
        model = lt.write_model(tmp, n_layer=4, n_head=4, n_embd=64, vocab_size=256, n_positions=32)
        ck = os.path.join(tmp, "ck")
        common = ["train", "--model", model, "--data", data, "--steps", 100000, "--batch", 8, "--seq", 16,
                  "--lr", "1e-3", "--seed", 9, "--peak-flops", "1e11", "--no-progress", "--save-dir", ck,
                  "--save-every", 1]
        for it in range(a.iterations):
            np_, flags = rng.choice(LAYOUTS)
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
                        n.endswith(".tmp") for n in os.listdir(ck)):
                    pass
                time.sleep(rng.uniform(0.0, 0.004))
            else:
                time.sleep(rng.uniform(0.0, 0.6))
            lt.check(len(pids) == np_ and p.poll() is None, "iteration %d: %d loom processes, job %s" % (it, len(pids), p.poll()))
            if pids and p.poll() is None:
                os.kill(rng.choice(pids), 9)
                kills += 1
                if any(n.endswith(".tmp") and os.path.isdir(os.path.join(ck, n)) for n in os.listdir(ck)):
                    mid_save += 1
            out, err = p.communicate(timeout=120)
            lt.check(p.returncode != 0, "iteration %d: job exited 0 after kill -9" % it)
            if before:
                m = re.search(r"resumed from (\S+) at step (\d+)", out + err)
                lt.check(m is not None, "iteration %d: no 'resumed from' line:\n%s" % (it, err[-1500:]))
                if m:
                    lt.check(os.path.normpath(m.group(1)) == os.path.normpath(want),
                             "iteration %d: resumed from %s, expected %s" % (it, m.group(1), want))
            for s, ok in before.items():
                d = os.path.join(ck, "step_%d" % s)
                lt.check(os.path.isdir(d) and (not ok or verifies(d)), "iteration %d: earlier %s lost or damaged" % (it, d))
            for s in published(ck):
                lt.check(verifies(os.path.join(ck, "step_%d" % s)), "iteration %d: published step_%d does not verify" % (it, s))
            print("iteration %d: %d ranks %s, %d checkpoints, resumed from %s" % (
                it, np_, " ".join(map(str, flags)), len(published(ck)), want and os.path.basename(want)), flush=True)
        ok = expected_choice(ck)
        lt.check(ok is not None, "no complete checkpoint at the end")
    print("kill -9: %d kills, %d while a save was in flight (step_N.tmp present)" % (kills, mid_save))
    lt.done()


if __name__ == "__main__":
    main()
