#!/usr/bin/env bash
# The example program and the engine's MINFER_* levers on the real model:
# example_simple prints a continuation; MINFER_GRAPH_TRACE=1 prints each graph
# build with its split table and op x backend census (2: also every node);
# MINFER_OP_PROFILE=1 prints the per-op time table at exit; the session
# reserves its n_batch graph at creation; MINFER_NO_FUSE_QKV=1 makes decode use
# the QKV_BIAS_ROPE_STORE epilogue with the same greedy text, and
# MINFER_NO_FUSE_QKV_EPILOGUE=1 turns that off too.
set -u
. "$(dirname "$0")/lib.sh" --model
has() { # has FILE PATTERN WHAT
    if grep -qE -- "$2" "$1"; then pass; else fail "$3: no /$2/ in: $(head -c 400 "$1")"; fi
}

# ---- examples/simple.c ----
if [ -x "$BUILD/example_simple" ]; then
    if "$BUILD/example_simple" "$MODEL" "The capital of France is" >"$TMP/ex" 2>"$TMP/ex.err"; then
        pass
    else
        fail "example_simple exited non-zero: $(cat "$TMP/ex.err")"
    fi
    has "$TMP/ex" '^The capital of France is' "example_simple echoes the prompt"
    # the continuation: at least 5 words after the prompt, then the count line
    words=$(head -n -1 "$TMP/ex" | sed 's/^The capital of France is//' | wc -w)
    [ "$words" -ge 5 ] && pass || fail "example_simple continuation has $words words: $(cat "$TMP/ex")"
    has "$TMP/ex" '^\(32 tokens, [0-9.]+ tokens/s\)$' "example_simple count line"
else
    fail "example_simple not built at $BUILD/example_simple"
fi

R=("$BIN" run -m "$MODEL" -p "The capital of France is" -n 4 --temp 0 -c 64 -b 16)

# ---- MINFER_GRAPH_TRACE=1: build lines, split table, census; no node dump ----
MINFER_GRAPH_TRACE=1 "${R[@]}" >"$TMP/t1.out" 2>"$TMP/t1"
has "$TMP/t1" '^graph build 1: [0-9]+ nodes, 1 splits \(n_tokens 16, backends 0x1\)' \
    "trace: the first build is the reserved n_batch graph"
has "$TMP/t1" '^graph build 2: .*\(n_tokens 5,' "trace: the prompt's build"
has "$TMP/t1" '^graph build 3: .*\(n_tokens 1,' "trace: the decode build"
[ "$(grep -c '^graph build' "$TMP/t1")" -eq 3 ] && pass || fail "trace: want 3 builds (reserve, prompt, decode)"
has "$TMP/t1" '^  split 0: cpu nodes [0-9]+-[0-9]+ \([0-9]+ ops, 0 inputs copied in\)' "trace: split table"
has "$TMP/t1" '^  op \\ backend +cpu$' "trace: census header"
has "$TMP/t1" '^  matmul +[1-9][0-9]*$' "trace: census matmul row"
has "$TMP/t1" '^  cpu: [0-9]+ buffers, [0-9.]+ MiB$' "trace: buffer line"
! grep -qE '^ +[0-9]+ input ' "$TMP/t1" && pass || fail "trace=1 dumped nodes"
MINFER_GRAPH_TRACE=2 "${R[@]}" >/dev/null 2>"$TMP/t2"
has "$TMP/t2" '^ +0 input +i32 \[16 1 1 1\].* tokens$' "trace=2: node dump"

# ---- MINFER_OP_PROFILE=1: the per-op table at exit ----
MINFER_OP_PROFILE=1 "${R[@]}" >/dev/null 2>"$TMP/prof"
has "$TMP/prof" '^op profile \(wall time per op' "profile header"
has "$TMP/prof" '^  op +count +total ms +avg us +%$' "profile columns"
has "$TMP/prof" '^  matmul +[1-9][0-9]* +[0-9.]+ +[0-9.]+ +[0-9.]+$' "profile matmul row"
"${R[@]}" >/dev/null 2>"$TMP/noprof"
! grep -q "op profile" "$TMP/noprof" && pass || fail "profile printed without the lever"

# ---- decode through the QKV epilogue: same greedy text ----
"${R[@]}" --no-display-prompt >"$TMP/fused" 2>/dev/null
MINFER_NO_FUSE_QKV=1 MINFER_GRAPH_TRACE=1 "${R[@]}" --no-display-prompt >"$TMP/epi" 2>"$TMP/epi.err"
has "$TMP/epi.err" '^  qkv_bias_rope_store +30$' "MINFER_NO_FUSE_QKV=1: decode uses the epilogue"
grep -q fused_qkv "$TMP/epi.err" && fail "MINFER_NO_FUSE_QKV=1 still emitted fused_qkv" || pass
cmp -s "$TMP/fused" "$TMP/epi" && [ -s "$TMP/fused" ] && pass ||
    fail "epilogue text '$(cat "$TMP/epi")' != fused text '$(cat "$TMP/fused")'"
MINFER_NO_FUSE_QKV=1 MINFER_NO_FUSE_QKV_EPILOGUE=1 MINFER_GRAPH_TRACE=1 "${R[@]}" --no-display-prompt \
    >"$TMP/plain" 2>"$TMP/plain.err"
! grep -q qkv_bias_rope_store "$TMP/plain.err" && pass || fail "MINFER_NO_FUSE_QKV_EPILOGUE=1 ignored"
cmp -s "$TMP/fused" "$TMP/plain" && pass || fail "unfused text differs: '$(cat "$TMP/plain")'"

finish
