#!/bin/sh
# ckpt_crash.sh - the long crash test of docs/checkpoints.md: kill -9 a
# random rank, or mpirun (a quarter of the kills of multi-rank jobs), at
# random moments during checkpoint saves and between them, N times (default
# 50), checking after each that --resume picks the newest complete checkpoint
# whose hashes verify, that no earlier checkpoint was lost, that every loss
# printed after a resume is the straight run's, and at the end that a SIGTERM
# through loomrun exits 75 with latest on the newest verified step.
#   bench/ckpt_crash.sh [N] [SEED] [--layouts 1,dp2z2,tp2,pp2,dp2z1,dp2tp2z3,pp2zb] [--mpirun-kills F]
#   (after building build/loom)
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
n=${1:-50}
seed=${2:-$(date +%s)}
[ "$#" -gt 0 ] && shift
[ "$#" -gt 0 ] && shift
exec /usr/bin/python3 "$here/tests/train/ckpt_crash.py" --iterations "$n" --seed "$seed" "$@"
