#!/usr/bin/env python3
"""Run a command as one MPI rank and record how it ended.

    rank_exit.py PREFIX -- COMMAND [ARGS...]

Runs COMMAND as a child and writes its end to PREFIX.rank<R> (R from the
launcher's environment, Open MPI or MPICH/Hydra): "exit N" or "signal N",
then on a second line the time.time() at which the child ended.
Signals the launcher sends to stop the job (SIGTERM, SIGINT, SIGHUP) are passed
on to the child instead of ending this wrapper first, so the record is the
child's own end. Then the wrapper ends the same way as the child (the same exit
code, or killed by the same signal), so the launcher sees and reports the
rank's real fate. This is how the fault tests see every rank's exit: mpirun
reports only its own code.

Open MPI stops a job with SIGCONT, SIGTERM and SIGKILL, waiting
odls_base_sigkill_timeout (1 s by default) between them. At 1 s a wrapper on a
loaded machine was sometimes SIGKILLed before it wrote its record (1 run in 3
here), so the fault tests set 3 s; the rank end times they print include that
wait.
"""
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from peak_rss import mpi_rank, wrapper_args  # noqa: E402  (shared with the RSS wrapper)


def main(argv):
    args = wrapper_args(argv)
    if args is None:
        return 64
    prefix, cmd = args
    child = subprocess.Popen(cmd)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda s, _f: child.send_signal(s))
    code = child.wait()
    t_end = time.time()
    with open("%s.rank%d" % (prefix, mpi_rank()), "w") as f:
        f.write("signal %d\n" % -code if code < 0 else "exit %d\n" % code)
        f.write("%.3f\n" % t_end)
    if code < 0:
        if -code != signal.SIGKILL:
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv))
