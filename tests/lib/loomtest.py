"""Shared helpers for loom's script tests: run the real `loom` binary (under
the project's real MPI launcher for several ranks), make small data, compare
runs. Paths come from the environment ctest sets: LOOM, LOOM_RUN, LOOM_SRC."""
import json
import os
import subprocess
import sys

SRC = os.environ.get("LOOM_SRC", os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(SRC, "tests", "oracle"))
import st  # noqa: E402  (safetensors reader, numpy only)

LOOM = os.environ.get("LOOM", os.path.join(SRC, "build", "loom"))
LOOM_RUN = os.environ.get("LOOM_RUN", os.path.join(SRC, "scripts", "loomrun"))

failures = 0
passes = 0


def check(cond, msg):
    """Record one assertion; print failures as they happen."""
    global failures, passes
    if cond:
        passes += 1
    else:
        failures += 1
        print("FAIL: " + msg, flush=True)


def done():
    print("%d passed, %d failed" % (passes, failures))
    sys.exit(1 if failures else 0)


def run(args, np=None, check_ok=True, timeout=600):
    """Run `loom ARGS` (on np ranks through loomrun if np); return the process."""
    cmd = ([LOOM_RUN, "-np", str(np), LOOM] if np else [LOOM]) + [str(a) for a in args]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if check_ok and p.returncode != 0:
        print("command failed (%d): %s\n%s%s" % (p.returncode, " ".join(cmd), p.stdout, p.stderr))
        raise SystemExit(1)
    return p


def descendants(pid):
    """Every process below pid (children first), from /proc."""
    kids = {}
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            stat = open("/proc/%s/stat" % p).read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        kids.setdefault(ppid, []).append(int(p))
    found, todo = [], [pid]
    while todo:
        for k in kids.get(todo.pop(0), []):
            found.append(k)
            todo.append(k)
    return found


class Server:
    """`loom serve ARGS` (on np ranks through loomrun if np > 1) in its own
    session, logging to DIR/serve.TAG.log, bound to the port it writes
    to a port file; .port once it listens."""

    def __init__(self, tmp, args, np=1, tag="0"):
        import time
        port_file = os.path.join(tmp, "port." + tag)
        self.log_path = os.path.join(tmp, "serve.%s.log" % tag)
        self.log = open(self.log_path, "w")
        cmd = ([LOOM_RUN, "-np", str(np)] if np > 1 else []) + [LOOM, "serve"] + [str(a) for a in args] + [
            "--port", "0", "--port-file", port_file]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        for _ in range(600):
            if os.path.exists(port_file) and open(port_file).read().strip():
                break
            if self.proc.poll() is not None:
                print("the server exited %s:\n%s" % (self.proc.poll(), open(self.log_path).read()[-2000:]))
                raise SystemExit(1)
            time.sleep(0.1)
        self.port = int(open(port_file).read())

    def finish(self, timeout=60, tail=600):
        """Wait for it to exit (killing its process group after timeout s);
        print the log's tail; the exit status (or a string saying it was killed)."""
        import signal
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            for pid in [self.proc.pid] + descendants(self.proc.pid):  # the launcher, mpirun and the ranks
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            self.proc.wait()
            rc = "killed after %d s" % timeout
        self.log.close()
        print(open(self.log_path).read()[-tail:])
        return rc

    def stop(self, timeout=60, tail=600):
        """SIGTERM to the launcher (or the one rank), then finish()."""
        import signal
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.finish(timeout, tail)


def serve_post(port, body, timeout=300):
    """POST body (JSON) to a server's /v1/completions: (status, the answer's text)."""
    import http.client
    import json
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read().decode("utf-8")
    c.close()
    return r.status, data


def serve_metrics(port, names):
    """A server's /metrics values of names (None when absent) and its /health, as a dict each."""
    import http.client
    import json
    import re
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    c.request("GET", "/health")
    health = json.loads(c.getresponse().read())
    c.close()
    val = {}
    for name in names:
        m = re.search(r"^%s\{[^}]*\} (\S+)$" % name, text, re.M)
        val[name] = float(m.group(1)) if m else None
    return val, health


def make_text_data(tmp, name="train.bin"):
    """A byte-level shard of real English text shipped by every Debian system."""
    out = os.path.join(tmp, name)
    run(["data", "--input", "/usr/share/common-licenses/GPL-3", "--out", out, "--val", ""])
    return out


def read_metrics(path):
    """The step rows of a metrics file (the first row, the run's settings and
    environment, has no "step": read_header gives it)."""
    with open(path) as f:
        return [r for r in (json.loads(line) for line in f if line.strip()) if "step" in r]


def read_header(path):
    with open(path) as f:
        first = json.loads(f.readline())
    return first if "run" in first else None


def max_rel_err(a, b):
    """max|a-b| / max|b| over one tensor (the max-norm relative error)."""
    import numpy as np
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    den = max(float(np.max(np.abs(b))), 1e-30) if b.size else 1.0
    return float(np.max(np.abs(a - b))) / den if b.size else 0.0


def l2_rel_err(a, b):
    """||a-b||_2 / ||b||_2 over one tensor (the norm-wise relative error)."""
    import numpy as np
    a = np.asarray(a, dtype=np.float64).ravel()
    b = np.asarray(b, dtype=np.float64).ravel()
    return float(np.linalg.norm(a - b)) / max(float(np.linalg.norm(b)), 1e-30)


def compare_runs(ref_metrics, ref_params, metrics, params, label, tol=1e-5, bias_abs=None):
    """Loss at every step and every final parameter within tol (relative).
    bias_abs: a bias vector (name ending in "bias") may instead differ by at
    most this much in every element (see test_bf16.py for when that is the
    right measure)."""
    m0, m1 = read_metrics(ref_metrics), read_metrics(metrics)
    check(len(m0) == len(m1) and len(m0) > 0, "%s: %d vs %d steps logged" % (label, len(m1), len(m0)))
    worst = 0.0
    for a, b in zip(m1, m0):
        e = abs(a["loss"] - b["loss"]) / abs(b["loss"])
        worst = max(worst, e)
        check(e <= tol, "%s: step %d loss %.9g vs one rank %.9g (rel %.2e)" % (label, b["step"], a["loss"], b["loss"], e))
    p0, _ = st.load(ref_params)
    p1, _ = st.load(params)
    check(sorted(p0) == sorted(p1), "%s: parameter names differ" % label)
    worst_p = 0.0
    for name in p0:
        if name not in p1:
            continue
        e = l2_rel_err(p1[name], p0[name])
        if e > tol and bias_abs is not None and name.endswith("bias"):
            import numpy as np
            d = float(np.max(np.abs(p1[name] - p0[name])))
            check(d <= bias_abs, "%s: parameter %s rel err %.2e and max |diff| %.2e > %.2e" % (label, name, e, d, bias_abs))
            print("%s: %s rel err %.2e, max |diff| %.2e <= %.2e" % (label, name, e, d, bias_abs))
            continue
        worst_p = max(worst_p, e)
        check(e <= tol, "%s: parameter %s rel err %.2e" % (label, name, e))
    print("%s: %d steps, worst loss rel err %.2e, worst parameter rel err %.2e" % (label, len(m0), worst, worst_p))
    return worst, worst_p


def write_model(tmp, **cfg):
    """A Hugging Face style config.json for a test model; returns its path."""
    path = os.path.join(tmp, "config.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    return path


def train(tmp, tag, np, args):
    """`loom train ARGS` on np ranks (None: one process, no mpirun) writing
    TMP/TAG.jsonl and TMP/TAG.safetensors; returns (metrics, params)."""
    safe = "".join(ch if ch.isalnum() or ch in "_-." else "_" for ch in tag)
    m, p = os.path.join(tmp, safe + ".jsonl"), os.path.join(tmp, safe + ".safetensors")
    run(["train", "--metrics", m, "--save-params", p] + list(args), np=np)
    return m, p


PEAK_RSS = os.path.join(SRC, "tests", "lib", "peak_rss.py")


def peak_rss(tmp, tag, np, args, timeout=600):
    """Run `loom ARGS` on np ranks, each under peak_rss.py; return the list of
    per-rank peak resident bytes as the kernel measured them (ru_maxrss of
    the loom process: its VmHWM), indexed by world rank."""
    prefix = os.path.join(tmp, "rss_" + "".join(ch if ch.isalnum() else "_" for ch in tag))
    cmd = [LOOM_RUN, "-np", str(np), sys.executable, PEAK_RSS, prefix, "--", LOOM]
    p = subprocess.run(cmd + [str(a) for a in args], capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        print("command failed (%d): %s\n%s%s" % (p.returncode, " ".join(cmd + [str(a) for a in args]),
                                                 p.stdout, p.stderr))
        raise SystemExit(1)
    out = []
    for r in range(np):
        with open("%s.rank%d" % (prefix, r)) as f:
            out.append(int(f.read()))
    return out
