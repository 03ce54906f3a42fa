# Thin wrapper over CMake for the README's commands.
NP ?= 4
STEPS ?= 300
.PHONY: all setup build run test test-asan bench clean

all: build

setup:
	./scripts/setup.sh

build:
	cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
	cmake --build build -j$$(nproc)

# The main job: data-parallel training of the default model on the default corpus.
run: setup
	./scripts/loomrun -np $(NP) build/loom train --dp $(NP) --steps $(STEPS) --metrics build/metrics.jsonl --save-params build/params.safetensors

test: build
	cd build && ctest --output-on-failure -j2

# The unit tests under ASan/UBSan; none of them needs the CUDA backend (its
# tests need a GPU or run on the emulation in `make test`), so it is not built.
test-asan:
	cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DLOOM_SANITIZE=ON -DLOOM_CUDA=OFF
	cmake --build build-asan -j$$(nproc)
	cd build-asan && ASAN_OPTIONS=detect_leaks=0 ctest --output-on-failure -L unit -j2

bench: build
	/usr/bin/python3 bench/bench_train.py --loom build/loom

clean:
	rm -rf build build-asan
