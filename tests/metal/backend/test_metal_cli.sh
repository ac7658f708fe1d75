#!/bin/bash
# The minfer command on the Metal backend (emulated build): the registry
# picks metal first under --device auto, prints the start-up line, and the
# greedy continuation of a tiny model is the same in two runs (not compared
# with the CPU's: the CPU quantizes activations, the GPU path does not, so
# near-ties of a random-weight model may flip); MINFER_DISABLE_METAL=1 leaves
# it out (auto gives the CPU's text, an explicit --device metal fails).
set -u
BIN=${MINFER_BIN:?}
TMP=${MINFER_TMP:-$(mktemp -d)}
M=$TMP/metal_cli_qwen2_q8_0.gguf
fail=0
[ -f "$M" ] || "$BIN" synth --arch qwen2 --dim 256 --layers 2 --ff 512 --heads 4 --kv-heads 2 --vocab 512 \
    --type q8_0 --pure --seed 3 -o "$M" >/dev/null 2>&1 || { echo "FAIL synth"; exit 1; }
run() { MINFER_LOG=info "$BIN" run -m "$M" -p "hello world" -n 8 --temp 0 -c 64 --no-display-prompt "$@"; }
auto_out=$(run 2>"$TMP/metal_cli.err") || { echo "FAIL auto run"; cat "$TMP/metal_cli.err"; fail=1; }
grep -q "using Metal on .* (unified: yes)" "$TMP/metal_cli.err" || { echo "FAIL no start-up line"; fail=1; }
grep -q "on metal" "$TMP/metal_cli.err" || { echo "FAIL auto did not pick metal"; cat "$TMP/metal_cli.err"; fail=1; }
again=$(run --device metal 2>/dev/null) || { echo "FAIL second metal run"; fail=1; }
[ -n "$auto_out" ] && [ "$auto_out" = "$again" ] || { echo "FAIL metal runs differ: '$auto_out' vs '$again'"; fail=1; }
cpu_out=$(run --device cpu 2>/dev/null) || { echo "FAIL cpu run"; fail=1; }
off=$(MINFER_DISABLE_METAL=1 run 2>"$TMP/metal_cli.err") || { echo "FAIL disabled auto run"; fail=1; }
grep -q "on metal" "$TMP/metal_cli.err" && { echo "FAIL MINFER_DISABLE_METAL=1 still ran on metal"; fail=1; }
[ "$off" = "$cpu_out" ] || { echo "FAIL disabled run differs"; fail=1; }
if MINFER_DISABLE_METAL=1 run --device metal >/dev/null 2>"$TMP/metal_cli.err"; then
    echo "FAIL --device metal with MINFER_DISABLE_METAL=1 succeeded"; fail=1
fi
grep -q "MINFER_DISABLE_METAL" "$TMP/metal_cli.err" || { echo "FAIL no reason given:"; cat "$TMP/metal_cli.err"; fail=1; }
# The KV cache type when none is named (seed §3.3): f32 for the small
# model, f16 from n_layers * kv_dim >= 8192 on Metal, f32 for the same
# model on the CPU, and -ctk wins.
run >/dev/null 2>"$TMP/metal_cli.err"
grep -q "KV cache K f32 + V f32" "$TMP/metal_cli.err" || { echo "FAIL small model not f32:"; cat "$TMP/metal_cli.err"; fail=1; }
B=$TMP/metal_cli_deep.gguf
[ -f "$B" ] || "$BIN" synth --arch qwen2 --dim 512 --layers 16 --ff 512 --heads 4 --kv-heads 4 --vocab 512 \
    --type q8_0 --pure --seed 4 -o "$B" >/dev/null 2>&1 || { echo "FAIL synth deep"; exit 1; }
deep() { MINFER_LOG=info "$BIN" run -m "$B" -p "hi" -n 1 --temp 0 -c 32 --no-display-prompt "$@"; }
deep >/dev/null 2>"$TMP/metal_cli.err"
grep -q "KV cache K f16 + V f16" "$TMP/metal_cli.err" || { echo "FAIL 16 x 512 KV on metal not f16:"; cat "$TMP/metal_cli.err"; fail=1; }
deep --device cpu >/dev/null 2>"$TMP/metal_cli.err"
grep -q "KV cache K f32 + V f32" "$TMP/metal_cli.err" || { echo "FAIL deep model on the cpu not f32"; fail=1; }
deep -ctk f32 >/dev/null 2>"$TMP/metal_cli.err"
grep -q "KV cache K f32 + V f32" "$TMP/metal_cli.err" || { echo "FAIL -ctk f32 not honoured on metal"; fail=1; }
# What Metal cannot do is refused at session creation, the error line (the
# last; info lines come first) naming it: K and V of different types, a
# 4/5-bit type, -fa off; the CPU runs them.
for args in "-ctk q8_0 -ctv f16|K q8_0 and V f16 differ" "-ctk q4_0|has no q4_0 KV cache" \
            "-fa off|only fused attention"; do
    flags=${args%%|*} want=${args#*|}
    if run --device metal $flags >/dev/null 2>"$TMP/metal_cli.err"; then
        echo "FAIL metal accepted $flags"; fail=1
    elif ! tail -n 1 "$TMP/metal_cli.err" | grep -q "^run: session: metal.*$want"; then
        echo "FAIL metal $flags: want an error line with '$want':"; cat "$TMP/metal_cli.err"; fail=1
    fi
    run --device cpu $flags >/dev/null 2>"$TMP/metal_cli.err" || { echo "FAIL cpu $flags:"; cat "$TMP/metal_cli.err"; fail=1; }
done
[ $fail = 0 ] && echo "ok metal cli"
exit $fail
