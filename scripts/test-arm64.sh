#!/usr/bin/env bash
# test-arm64.sh - the CPU kernels on 64-bit ARM, from an x86 Debian machine.
#
# Installs the cross toolchain and qemu-user when missing (apt, as root),
# cross-builds the unit tests of mf_base, mf_quant and mf_cpu with
# cmake/aarch64.cmake (gcc, -Werror), and runs each under qemu-aarch64 twice:
#   -cpu max         ARMv8.2+ with dotprod/fp16: the NEON kernels are chosen,
#                    and test_cpu_kernels must compare them with scalar;
#   -cpu cortex-a53  ARMv8.0 without dotprod: detection must fall back to the
#                    scalar kernels (no illegal instruction on older cores).
# Prints one line per test and pass, then "arm64: N passed, N failed"; exits
# non-zero on any failure.
#
# Usage: scripts/test-arm64.sh [build-dir]        (default: build-arm64)
#   MINFER_ARM64_TIMEOUT  seconds per test binary under qemu (default 600)
#   MINFER_ARM64_JOBS     build parallelism (default: nproc)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build-arm64}
sysroot=/usr/aarch64-linux-gnu
timeout_s=${MINFER_ARM64_TIMEOUT:-600}
jobs=${MINFER_ARM64_JOBS:-$(nproc)}

# ---- tools -------------------------------------------------------------------
pkgs=()
command -v cmake >/dev/null || pkgs+=(cmake)
command -v make >/dev/null || pkgs+=(make)
command -v python3 >/dev/null || pkgs+=(python3) # tests/CMakeLists.txt looks for it
command -v aarch64-linux-gnu-gcc >/dev/null || pkgs+=(gcc-aarch64-linux-gnu)
[ -f "$sysroot/include/stdio.h" ] || pkgs+=(libc6-dev-arm64-cross)
command -v qemu-aarch64 >/dev/null || pkgs+=(qemu-user)
if [ ${#pkgs[@]} -gt 0 ]; then
    if [ "$(id -u)" != 0 ]; then
        echo "test-arm64: missing ${pkgs[*]}; run as root or install them" >&2
        exit 1
    fi
    echo "test-arm64: installing ${pkgs[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null
fi

# ---- cross build ---------------------------------------------------------------
if [ -f "$build/CMakeCache.txt" ] && ! grep -q '^CMAKE_TOOLCHAIN_FILE.*aarch64\.cmake' "$build/CMakeCache.txt"; then
    echo "test-arm64: $build holds a build that is not the aarch64 cross build" >&2
    exit 1
fi
echo "== arm64 cross build ($(aarch64-linux-gnu-gcc -dumpfullversion), $build) =="
cmake -S "$root" -B "$build" -DCMAKE_TOOLCHAIN_FILE="$root/cmake/aarch64.cmake" \
      -DCMAKE_BUILD_TYPE=Release -DMINFER_WERROR=ON -DMINFER_CUDA=OFF -DMINFER_TESTS=ON >/dev/null
tests=()
for src in "$root"/tests/unit/test_base_*.c "$root"/tests/unit/test_quant_*.c "$root"/tests/unit/test_cpu_*.c; do
    [ -f "$src" ] && tests+=("$(basename "$src" .c)")
done
if [ ${#tests[@]} -eq 0 ]; then
    echo "test-arm64: no tests/unit/test_{base,quant,cpu}_*.c found" >&2
    exit 1
fi
targets=()
for t in "${tests[@]}"; do targets+=(--target "$t"); done
logs="$build/arm64-logs"
mkdir -p "$logs"
if ! cmake --build "$build" -j"$jobs" "${targets[@]}" >"$logs/build.log" 2>&1; then
    tail -n 60 "$logs/build.log"
    echo "test-arm64: cross build failed (full log: $logs/build.log)" >&2
    exit 1
fi
echo "  built ${tests[*]}"

# ---- run under qemu -------------------------------------------------------------
passed=0
failed=0

# run_pass CPU EXPECTED_ISA: every test binary under qemu's CPU model.
run_pass() {
    local cpu=$1 isa=$2
    echo "== arm64 tests, qemu -cpu $cpu (expect $isa kernels) =="
    for t in "${tests[@]}"; do
        local log="$logs/$t.$cpu.log" rc=0 t0 ms extra=""
        t0=$(date +%s%N)
        QEMU_CPU=$cpu MINFER_TEST_EXPECT_ISA=$isa MINFER_SRC="$root" \
            timeout "$timeout_s" qemu-aarch64 -L "$sysroot" "$build/tests/$t" >"$log" 2>&1 || rc=$?
        ms=$((($(date +%s%N) - t0) / 1000000))
        # test_cpu_kernels must really have compared NEON with scalar (a
        # dispatch that never picks NEON would pass every other check)
        if [ $rc = 0 ] && [ "$t" = test_cpu_kernels ] && [ "$isa" = neon ]; then
            local n
            n=$(sed -n 's/^ *\([0-9]*\) ISA kernels compared.*/\1/p' "$log")
            extra=" [${n:-0} NEON kernels vs scalar]"
            [ "${n:-0}" -gt 0 ] || { rc=1; extra="$extra: none compared"; }
        fi
        if [ $rc = 0 ]; then
            passed=$((passed + 1))
            printf '  ok    %-22s %4d.%ds  %s%s\n' "$t" $((ms / 1000)) $((ms % 1000 / 100)) "$(tail -n 1 "$log")" "$extra"
        else
            failed=$((failed + 1))
            [ $rc = 124 ] && extra="$extra (timed out after ${timeout_s}s)"
            printf '  FAIL  %-24s rc=%s%s\n' "$t" "$rc" "$extra"
            sed 's/^/        /' "$log" | tail -n 40
        fi
    done
}

run_pass max neon
run_pass cortex-a53 scalar

echo "arm64: $passed passed, $failed failed"
[ $failed = 0 ]
