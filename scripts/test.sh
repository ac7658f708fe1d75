#!/usr/bin/env bash
# The whole test suite, from a fresh Debian machine (run as root):
#   1. dependencies (apt, .venv) and the SmolLM2 model
#   2. Release build with gcc, warnings as errors, the CUDA backend compiled
#      when nvcc is present; every ctest test
#   3. clang build with ASan + UBSan: the unit tests, then each libFuzzer
#      target for MINFER_FUZZ_SECONDS (default 45) seconds (six targets)
#   4. ARM64: the base/quant/cpu unit tests cross-built with Debian's aarch64
#      gcc and run under qemu-user (NEON kernels against their scalar twins)
#   5. Metal on Linux: clang build of the Metal backend against the stand-in
#      framework and the MSL emulator (tests/metal), `ctest -L metal`; the
#      emulator's and the stand-in's own tests again under ASan+UBSan
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
jobs=$(nproc)
fuzz_seconds=${MINFER_FUZZ_SECONDS:-45}

bash scripts/deps.sh --test
bash scripts/fetch-model.sh

if command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; then
    export PATH="$PATH:/usr/local/cuda/bin"
fi

echo "== build (gcc, -Werror) =="
cmake -S . -B build-test -DCMAKE_BUILD_TYPE=Release -DMINFER_WERROR=ON \
      -DMINFER_PYTHON="$root/.venv/bin/python" >/dev/null
cmake --build build-test -j"$jobs"
echo "== tests =="
ctest --test-dir build-test --output-on-failure -j"$jobs" -LE gpu

echo "== sanitizer build (clang, ASan+UBSan, libFuzzer) =="
CC=clang cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMINFER_WERROR=ON \
      -DMINFER_SANITIZE=ON -DMINFER_FUZZ=ON -DMINFER_CUDA=OFF \
      -DMINFER_PYTHON="$root/.venv/bin/python" >/dev/null
cmake --build build-asan -j"$jobs"
echo "== unit tests under ASan+UBSan =="
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --test-dir build-asan -L unit -LE gpu --output-on-failure -j"$jobs"

echo "== fuzzing (${fuzz_seconds}s per target) =="
for f in build-asan/fuzz_*; do
    [ -x "$f" ] || continue
    name=$(basename "$f")
    corpus="build-asan/corpus-$name"
    mkdir -p "$corpus"
    seeds="fuzz/corpus/${name#fuzz_}"
    [ -d "$seeds" ] && cp -n "$seeds"/* "$corpus"/ 2>/dev/null || true
    echo "-- $name"
    MINFER_MODEL="$root/models/SmolLM2-135M-Instruct.Q4_1.gguf" \
        "$f" -max_total_time="$fuzz_seconds" -rss_limit_mb=2048 -print_final_stats=1 "$corpus" \
        2>&1 | tail -n 12
done
echo "== Metal on Linux (clang: stand-in Metal framework + MSL emulator) =="
CC=clang CXX=clang++ OBJC=clang cmake -S . -B build-metal -DCMAKE_BUILD_TYPE=Release \
      -DMINFER_WERROR=ON -DMINFER_CUDA=OFF -DMINFER_METAL=ON -DMINFER_METAL_EMU=ON \
      -DMINFER_PYTHON="$root/.venv/bin/python" >/dev/null
cmake --build build-metal -j"$jobs"
ctest --test-dir build-metal -L metal --output-on-failure -j"$jobs"
echo "== the MSL emulator and the stand-in framework under ASan+UBSan =="
CC=clang CXX=clang++ OBJC=clang cmake -S . -B build-metal-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DMINFER_WERROR=ON -DMINFER_SANITIZE=ON -DMINFER_CUDA=OFF -DMINFER_METAL_EMU=ON \
      -DMINFER_PYTHON="$root/.venv/bin/python" >/dev/null
cmake --build build-metal-asan -j"$jobs" --target test_metal_emu test_metal_standin
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
    LSAN_OPTIONS=suppressions="$root/tests/metal/lsan.supp" \
    ctest --test-dir build-metal-asan -R '^metal_(emu_|standin)' --output-on-failure -j"$jobs"

echo "== ARM64 (cross gcc + qemu-user) =="
bash scripts/test-arm64.sh build-arm64

echo "== all tests passed =="
