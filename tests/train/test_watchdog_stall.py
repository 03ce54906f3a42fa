#!/usr/bin/env python3
"""The hang watchdog names the stalled rank, not only the waiting one
(issue 31): 4 ranks of dp4 training through scripts/loomrun, world rank 2
stopped with SIGSTOP once the run started; the others wait for it in the
data-parallel all-reduce, and after LOOM_COMM_TIMEOUT (4 s here) the job
ends with exit 69 and a message that names rank 2 with its pid and host as
the member that has not entered the call, or entered it but does not run
(its peers read its progress from shared memory it does not need to drive). Without the progress board the
message named only the waiting rank."""
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "lib"))
import loomtest as lt  # noqa: E402


def children(pid):
    kids = []
    try:
        for t in os.listdir("/proc/%d/task" % pid):
            with open("/proc/%d/task/%s/children" % (pid, t)) as f:
                kids += [int(k) for k in f.read().split()]
    except OSError:
        pass
    return kids


def world_ranks(root):
    """{world rank: pid} of the loom processes below root."""
    out, todo = {}, [root]
    while todo:
        for k in children(todo.pop()):
            todo.append(k)
            try:
                with open("/proc/%d/cmdline" % k, "rb") as f:
                    argv0 = f.read().split(b"\0")[0]
                with open("/proc/%d/environ" % k, "rb") as f:
                    env = dict(e.split(b"=", 1) for e in f.read().split(b"\0") if b"=" in e)
            except OSError:
                continue
            if argv0.endswith(b"/loom") and b"OMPI_COMM_WORLD_RANK" in env:
                out[int(env[b"OMPI_COMM_WORLD_RANK"])] = k
    return out


def main():
    with tempfile.TemporaryDirectory() as tmp:
        data = lt.make_text_data(tmp)
        model = lt.write_model(tmp, n_layer=2, n_head=2, n_embd=32, vocab_size=256, n_positions=32)
        metrics = os.path.join(tmp, "m.jsonl")
        cmd = [lt.LOOM_RUN, "-np", "4", lt.LOOM, "train", "--model", model, "--data", data, "--steps", "100000",
               "--batch", "8", "--seq", "16", "--dp", "4", "--no-progress", "--quiet", "--peak-flops", "1e11",
               "--metrics", metrics]
        env = dict(os.environ, LOOM_COMM_TIMEOUT="4")
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        deadline = time.time() + 120
        ranks = {}
        while time.time() < deadline and p.poll() is None and not (os.path.exists(metrics + ".tmp") and len(ranks) == 4):
            ranks = world_ranks(p.pid)
            time.sleep(0.01)
        stopped = ranks.get(2)
        lt.check(stopped is not None and p.poll() is None, "found ranks %s, job %s" % (ranks, p.poll()))
        if stopped:
            os.kill(stopped, signal.SIGSTOP)
        try:
            out, err = p.communicate(timeout=120)
        finally:
            if stopped:
                try:
                    os.kill(stopped, signal.SIGKILL)
                except OSError:
                    pass
        # stopped before or inside the call: "has not entered it" or "entered it but its process has not run"
        want = "rank 2 (pid %d on host %s) " % (stopped or -1, socket.gethostname())
        lt.check(p.returncode == 69 and "has not completed after" in err and want in err,
                 "exit %d, want 69 and '%s':\n%s" % (p.returncode, want, err[-2500:]))
        print("\n".join([line.strip()[:300] for line in err.splitlines()
                         if "has not completed" in line or "rank 2 (pid" in line][:2]))
    lt.done()


if __name__ == "__main__":
    main()
