#!/usr/bin/env bash
# The main job, from a fresh Debian machine (run as root): install the build
# tools, fetch SmolLM2-135M-Instruct, build minfer and generate text.
# Extra arguments go to `minfer run` (default prompt below).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bash scripts/deps.sh
bash scripts/fetch-model.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" --target minfer
if [ $# -eq 0 ]; then
    set -- -p "Write a short poem about the sea." --chat -n 128
fi
exec ./build/minfer run "$@"
