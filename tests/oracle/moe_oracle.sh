#!/bin/sh
# The MoE model against PyTorch (float64): top-1 and top-2, dropless and with
# capacity (tokens dropped), renormalised gates or not, every other block MoE
# with a narrower expert. usage: moe_oracle.sh ORACLE_DUMP PYTHON SRC
set -e
dump=$1 py=$2 src=$3
for v in "4 1 0 1" "4 2 0 1" "4 1 1.25 0" "4 2 1.0 1" "8 2 1.0 0 2 48"; do
    echo "== n_expert top_k capacity_factor norm_topk [moe_every expert_hidden]: $v"
    # shellcheck disable=SC2086
    "$dump" moe_oracle.safetensors 2 4 32 67 16 3 11 $v
    "$py" "$src/tests/oracle/check_oracle.py" moe_oracle.safetensors
done
