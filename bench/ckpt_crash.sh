#!/bin/sh
# ckpt_crash.sh - the long crash test of docs/checkpoints.md: kill -9 a
# random rank at random moments during checkpoint saves, N times (default
# 50), checking after each that --resume picks a complete checkpoint whose
# hashes verify and that no earlier checkpoint was lost.
#   bench/ckpt_crash.sh [N] [SEED]     (after building build/loom)
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
exec /usr/bin/python3 "$here/tests/train/ckpt_crash.py" --iterations "${1:-50}" --seed "${2:-$(date +%s)}"
