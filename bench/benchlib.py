"""Helpers shared by loom's benchmark scripts: errors, machine description,
running a command, and the warm-up-skipping median every benchmark reports."""
import platform
import statistics
import subprocess

WARMUP = 2


class BenchError(Exception):
    pass


def cpu_model():
    """The CPU's model name from /proc/cpuinfo."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def run(cmd, env=None, what=None):
    """Run cmd; raise BenchError with the command and its output tail on failure."""
    cmd = [str(c) for c in cmd]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        tail = "\n".join((p.stdout + p.stderr).strip().splitlines()[-15:])
        raise BenchError("%s failed (exit %d): %s\n%s" % (what or "command", p.returncode, " ".join(cmd), tail))
    return p


def median_after_warmup(xs, warmup=WARMUP):
    if len(xs) <= warmup:
        raise BenchError("need more than %d steps to skip warm-up, got %d" % (warmup, len(xs)))
    return statistics.median(xs[warmup:])
