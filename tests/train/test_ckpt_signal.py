#!/usr/bin/env python3
"""SIGTERM / SIGINT with --save-dir (docs/checkpoints.md): the job finishes
the step it is in, saves DIR/step_K, exits 75 (every rank), and
--resume DIR continues exactly: the resumed losses and the final
parameters are bitwise equal to an uninterrupted run of the same layout.
Once on one process (SIGINT) and once on 2 ranks (dp2 zero1) with SIGTERM
delivered to rank 1 only (the ranks agree on it after each step)."""
import os
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
import loomtest as lt  # noqa: E402
import numpy as np  # noqa: E402

STEPS = 80
COMMON = ["--steps", STEPS, "--batch", 8, "--seq", 32, "--lr", "1e-3", "--warmup", 2, "--seed", 9,
          "--peak-flops", "1e11", "--no-progress"]


def descendants(pid):
    """Processes below pid (from /proc), as {pid: argv}."""
    kids = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % d) as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open("/proc/%s/cmdline" % d, "rb") as f:
                argv = f.read().split(b"\0")
            kids[int(d)] = (ppid, argv)
        except (OSError, IndexError, ValueError):
            continue
    out, todo = {}, [pid]
    while todo:
        p = todo.pop()
        for k, (pp, argv) in kids.items():
            if pp == p and k not in out:
                out[k] = argv
                todo.append(k)
    return out


def interrupted_run(tmp, tag, np_, flags, sig, rank_index):
    ck = os.path.join(tmp, "ck_" + tag)
    metrics = os.path.join(tmp, tag + ".jsonl")
    args = ["train"] + flags + ["--save-dir", ck, "--metrics", metrics]
    cmd = ([lt.LOOM_RUN, "-np", str(np_), lt.LOOM] if np_ else [lt.LOOM]) + [str(a) for a in args]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = 0
    deadline = time.time() + 120
    while time.time() < deadline and p.poll() is None:  # a few steps done
        try:
            with open(metrics + ".tmp") as f:
                seen = sum(1 for line in f if "\"step\"" in line)  # step rows, not the header
        except OSError:
            seen = 0
        if seen >= 5:
            break
        time.sleep(0.02)
    def steps_logged():
        try:
            with open(metrics + ".tmp") as f:
                return sum(1 for line in f if "\"step\"" in line)
        except OSError:
            return 0
    if np_:
        ranks = sorted(k for k, argv in descendants(p.pid).items() if argv and argv[0].endswith(b"/loom"))
        lt.check(len(ranks) == np_, "%s: found %d loom processes under the launcher" % (tag, len(ranks)))
        target = ranks[rank_index] if len(ranks) > rank_index else p.pid
    else:
        target = p.pid
    seen = steps_logged()  # right before the signal
    os.kill(target, sig)
    out, err = p.communicate(timeout=120)
    lt.check(p.returncode == 75, "%s: exit %d after signal %d, expected 75:\n%s" % (tag, p.returncode, sig, err[-2000:]))
    with open(os.path.join(ck, "latest")) as f:
        latest = f.read().strip()
    k = int(latest.split("_")[1])
    lt.check(seen <= k <= seen + 3, "%s: saved step %d, signal sent after %d steps" % (tag, k, seen))
    lt.check("--resume" in err and "signal %d" % sig in err, "%s: message: %s" % (tag, err[-500:]))
    return ck, k


def main():
    with tempfile.TemporaryDirectory() as tmp:
        data = lt.make_text_data(tmp)
        model = lt.write_model(tmp, n_layer=2, n_head=4, n_embd=32, vocab_size=256, n_positions=32)
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
    lt.done()


if __name__ == "__main__":
    main()
