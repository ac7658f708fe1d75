#!/usr/bin/env bash
# llama.cpp's flag spellings on minfer run (docs/CLI.md), each checked for
# the behaviour it names, on the real SmolLM2 model with greedy sampling.
set -u
. "$(dirname "$0")/lib.sh" --model
EXPECT_ICASE=1
R=("$BIN" run -m "$MODEL" --temp 0 -c 256)
Q="What is the capital of France?"

# -e is on by default: \n in -p is a newline; --no-escape keeps it literal
"${R[@]}" -p 'one\ntwo' -n 0 >"$TMP/e" 2>/dev/null
[ "$(head -n 1 "$TMP/e")" = one ] && pass || fail "-p 'one\\ntwo' was not split: $(cat "$TMP/e")"
"${R[@]}" -p 'one\ntwo' -n 0 --no-escape >"$TMP/ne" 2>/dev/null
grep -qF 'one\ntwo' "$TMP/ne" && pass || fail "--no-escape changed the prompt: $(cat "$TMP/ne")"
# -f - reads the prompt from stdin: same text as -p
echo -n "$Q" | "${R[@]}" --chat -f - -n 12 >"$TMP/stdin" 2>/dev/null
"${R[@]}" --chat -p "$Q" -n 12 >"$TMP/p" 2>/dev/null
cmp -s "$TMP/stdin" "$TMP/p" && grep -q Paris "$TMP/p" && pass || fail "-f - differs from -p: $(cat "$TMP/stdin")"
# -ngl 99 means all layers (this CPU build: nothing to offload, so it runs); a partial count is refused
"${R[@]}" -p hi -n 2 -ngl 99 --device cpu >/dev/null 2>"$TMP/err" && pass || fail "-ngl 99: $(cat "$TMP/err")"
# ... and says so when no GPU takes them (as llama.cpp warns); -ngl 0 and the default say nothing
grep -q "asks for the GPU, but no GPU backend is in use" "$TMP/err" && pass || fail "-ngl 99 on the CPU without a warning: $(cat "$TMP/err")"
"${R[@]}" -p hi -n 2 --device cpu >/dev/null 2>"$TMP/err0"
grep -q "asks for the GPU" "$TMP/err0" && fail "warned without -ngl: $(cat "$TMP/err0")" || pass
expect_fail 1 "partial offload" "${R[@]}" -p hi -n 2 -ngl 7
"${R[@]}" -p hi -n 2 -ngl 0 >/dev/null 2>&1 && pass || fail "-ngl 0 failed"
# -fa on / auto accepted, off runs the unfused attention (same greedy text), junk refused
"${R[@]}" -p "$Q" -n 8 -fa on >"$TMP/fa_on" 2>/dev/null && "${R[@]}" -p "$Q" -n 8 --flash-attn auto >"$TMP/fa_auto" 2>&1 &&
    pass || fail "-fa on/auto refused"
"${R[@]}" -p "$Q" -n 8 -fa off >"$TMP/fa_off" 2>"$TMP/err" && cmp -s "$TMP/fa_on" "$TMP/fa_off" &&
    pass || fail "-fa off: $(cat "$TMP/fa_off" "$TMP/err")"
expect_fail 2 "not on, off or auto" "${R[@]}" -p hi -fa maybe
# -ctk q8_0 -ctv f16: separate K and V types, the report names both and the smaller cache
"${R[@]}" -p "$Q" -n 8 -c 512 -ctk q8_0 -ctv f16 >"$TMP/kv_mixed" 2>"$TMP/err" &&
    grep -q "KV cache K q8_0 + V f16 8.61 MiB" "$TMP/err" && pass || fail "-ctk q8_0 -ctv f16: $(cat "$TMP/err")"
expect_fail 1 "V cache type 'q9_0'" "${R[@]}" -p hi -ctk q8_0 -ctv q9_0
# --ignore-eos: exactly -n tokens even where greedy output ends early
"${R[@]}" --chat -p "Say OK." -n 60 >/dev/null 2>"$TMP/eos"
"${R[@]}" --chat -p "Say OK." -n 60 --ignore-eos >/dev/null 2>"$TMP/noeos"
g1=$(grep -oE 'generated [0-9]+' "$TMP/eos" | grep -oE '[0-9]+'); g2=$(grep -oE 'generated [0-9]+' "$TMP/noeos" | grep -oE '[0-9]+')
[ "${g1:-99}" -lt 60 ] && [ "${g2:-0}" -eq 60 ] && pass || fail "--ignore-eos: without $g1, with $g2 tokens (want < 60, 60)"
# -r stops once the output contains the reverse prompt
"${R[@]}" --chat -p "$Q" -n 40 -r "Paris" >"$TMP/r" 2>"$TMP/r.err"
grep -q "reverse prompt" "$TMP/r.err" && [ "$(grep -o Paris "$TMP/r" | wc -l)" -eq 1 ] &&
    [ "$(tail -c 6 "$TMP/r" | tr -d '\n')" = "Paris" ] && pass || fail "-r Paris: $(cat "$TMP/r")"
# --no-mmap and --mlock give the same text as the mapped file
"${R[@]}" -p "$Q" -n 8 --no-mmap >"$TMP/nm" 2>/dev/null; "${R[@]}" -p "$Q" -n 8 >"$TMP/mm" 2>/dev/null
cmp -s "$TMP/nm" "$TMP/mm" && pass || fail "--no-mmap text differs"
MINFER_LOG=debug "${R[@]}" -p hi -n 1 --no-mmap 2>&1 >/dev/null | grep -q "gguf: read" && pass || fail "--no-mmap did not read the file"
"${R[@]}" -p "$Q" -n 8 --mlock >"$TMP/ml" 2>/dev/null && cmp -s "$TMP/ml" "$TMP/mm" && pass || fail "--mlock"
# -v prints debug lines, --log-disable prints none of session/stats, --log-file takes stderr
"${R[@]}" -p hi -n 1 -v 2>&1 >/dev/null | grep -q "debug: engine: graph build" && pass || fail "-v: no debug lines"
"${R[@]}" -p hi -n 1 --log-disable >/dev/null 2>"$TMP/ld"; [ ! -s "$TMP/ld" ] && pass || fail "--log-disable printed: $(cat "$TMP/ld")"
"${R[@]}" -p hi -n 1 --log-file "$TMP/log" >/dev/null 2>"$TMP/lf"
[ ! -s "$TMP/lf" ] && grep -q "generated 1 tokens" "$TMP/log" && pass || fail "--log-file: $(cat "$TMP/lf")"
# MINFER_LOG=debug prints more than info
d=$(MINFER_LOG=debug "${R[@]}" -p hi -n 1 2>&1 >/dev/null | wc -l); i=$(MINFER_LOG=info "${R[@]}" -p hi -n 1 2>&1 >/dev/null | wc -l)
[ "$d" -gt "$i" ] && pass || fail "MINFER_LOG=debug ($d lines) is not more than info ($i)"
# --verbose-prompt lists the prompt's tokens
"${R[@]}" -p "hello world" -n 1 --verbose-prompt 2>&1 >/dev/null | grep -q "prompt: 2 tokens" && pass || fail "--verbose-prompt"
# the random seed is printed and repeats the text with -s
"$BIN" run -m "$MODEL" -c 256 -p "Once upon a time" -n 16 >"$TMP/s1" 2>"$TMP/s1.err"
seed=$(grep -oE '^seed: [0-9]+' "$TMP/s1.err" | grep -oE '[0-9]+')
[ -n "$seed" ] && "$BIN" run -m "$MODEL" -c 256 -p "Once upon a time" -n 16 -s "$seed" >"$TMP/s2" 2>/dev/null &&
    cmp -s "$TMP/s1" "$TMP/s2" && pass || fail "printed seed '$seed' does not repeat the text"
# --keep: a context that fills shifts instead of stopping
"$BIN" run -m "$MODEL" --temp 0 -c 48 -p "Count: 1, 2, 3," -n 80 --ignore-eos --keep 4 >/dev/null 2>"$TMP/k"
grep -q "generated 80 tokens" "$TMP/k" && ! grep -q "context full" "$TMP/k" && pass || fail "--keep: $(tail -1 "$TMP/k")"
"$BIN" run -m "$MODEL" --temp 0 -c 48 -p "Count: 1, 2, 3," -n 80 --ignore-eos >/dev/null 2>"$TMP/k2"
grep -q "context full" "$TMP/k2" && pass || fail "without --keep the context did not stop: $(tail -1 "$TMP/k2")"
# -ub caps the physical batch; --color wraps the echoed prompt
"${R[@]}" -p "$Q" -n 8 -ub 3 >"$TMP/ub" 2>/dev/null && cmp -s "$TMP/ub" "$TMP/mm" && pass || fail "-ub 3 text differs"
"${R[@]}" -p hi -n 1 --color 2>/dev/null | grep -q $'\x1b\[33mhi' && pass || fail "--color: no colour"
# -cnv: conversation mode of run, -p as the system message
printf '%s\n' "$Q" | "${R[@]}" -cnv -p "You are a helpful assistant." -n 24 >"$TMP/cnv" 2>/dev/null
grep -q Paris "$TMP/cnv" && pass || fail "run -cnv: $(cat "$TMP/cnv")"
# --version: version and commit, then the compiled backends (cpu always one of
# them); every --help device line lists the same names
"$BIN" --version >"$TMP/ver"
head -n 1 "$TMP/ver" | grep -qE '^minfer [0-9.]+ \(commit [^)]+\)$' && pass || fail "--version: $(cat "$TMP/ver")"
BE=$(sed -n 's/^backends: //p' "$TMP/ver")
case ", $BE," in *", cpu,"*) pass ;; *) fail "--version backends line: $(cat "$TMP/ver")" ;; esac
for c in run chat serve bench perplexity; do
    "$BIN" $c --help | grep -qF -- "--device NAME" || { fail "$c --help: no --device line"; continue; }
    "$BIN" $c --help | grep -F -- "--device NAME" | grep -qF "$BE or auto" && pass ||
        fail "$c --help device line is not '$BE or auto': $("$BIN" $c --help | grep -F -- --device)"
done
finish
