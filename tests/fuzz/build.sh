#!/bin/sh
# build.sh - build the libFuzzer harnesses with clang (Debian's clang ships
# libFuzzer): tests/fuzz/build.sh OUTDIR. Each harness links only the
# reader it tests, with -fsanitize=fuzzer,address,undefined. Exit 69 when
# clang or its libFuzzer is not installed (scripts/setup.sh installs it).
set -eu
src=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:?usage: build.sh OUTDIR}
CC=${LOOM_FUZZ_CC:-clang}
command -v "$CC" >/dev/null 2>&1 || { echo "build.sh: $CC not found (apt-get install clang)" >&2; exit 69; }
mkdir -p "$out"
flags="-g -O1 -std=c11 -D_GNU_SOURCE -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -I$src/include -I$src/src"
build() { # name sources...
    name=$1; shift
    [ "$out/$name" -nt "$src/tests/fuzz/$name.c" ] && newer=1 || newer=0
    for s in "$@" tests/fuzz/fuzz_input.h; do [ "$src/$s" -nt "$out/$name" ] && newer=0; done
    [ "$newer" = 1 ] && return 0
    $CC $flags -o "$out/$name" "$src/tests/fuzz/$name.c" $(for s in "$@"; do printf '%s ' "$src/$s"; done) -lcjson -lm
}
build fuzz_safetensors src/io/safetensors.c src/core/status.c
build fuzz_config src/model/config.c src/model/config_hf.c src/model/moe_config.c src/core/status.c
build fuzz_manifest src/train/ckpt_manifest.c src/core/sha256.c src/core/status.c
build fuzz_tokens src/io/data.c src/core/rng.c src/core/status.c src/core/log.c
