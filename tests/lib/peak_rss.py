#!/usr/bin/env python3
"""Run a command and record its peak resident memory as the kernel counts it.

    peak_rss.py PREFIX -- COMMAND [ARGS...]

Runs COMMAND as a child, waits for it, and writes the child's peak resident set
size in bytes (getrusage(RUSAGE_CHILDREN).ru_maxrss, the kernel's high-water
mark of the child's RSS, VmHWM) to PREFIX.rank<R>, R being the MPI rank from
the launcher's environment (Open MPI or MPICH/Hydra), 0 outside MPI. Exits
with the child's status (128 + N for a signal), so a failing rank still fails.

This is the independent instrument for memory tests: loom does not compute it,
so a test can check loom's own accounting (and what a strategy saves) against
it. Launch it as the program on each rank: mpirun -np 4 peak_rss.py P -- loom ...
"""
import os
import resource
import subprocess
import sys


def mpi_rank():
    for var in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0


def wrapper_args(argv):
    """(PREFIX, COMMAND list) of a per-rank wrapper's `NAME PREFIX -- COMMAND
    [ARGS...]`, or None after printing the usage."""
    if len(argv) < 4 or argv[2] != "--":
        sys.stderr.write("usage: %s PREFIX -- COMMAND [ARGS...]\n" % os.path.basename(argv[0]))
        return None
    return argv[1], argv[3:]


def main(argv):
    args = wrapper_args(argv)
    if args is None:
        return 64
    prefix, cmd = args
    code = subprocess.call(cmd)
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # KiB on Linux
    with open("%s.rank%d" % (prefix, mpi_rank()), "w") as f:
        f.write("%d\n" % (peak_kib * 1024))
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main(sys.argv))
