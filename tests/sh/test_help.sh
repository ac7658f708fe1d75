#!/usr/bin/env bash
# --help tells the truth, for all 9 subcommands: `minfer CMD --help` exits 0,
# and every flag its text lists is accepted by CMD's parser. A flag counts as
# accepted when the parser gets past it (alone, or with a value of the kind its
# help names) and stops at a bogus option placed after it: "unknown option
# '--zz-bogus'", never "unknown option 'FLAG'". Nothing runs: the bogus option
# fails the parse before any work. Also the small truths of audit item 13:
# detokenize's trailing newline (and --no-newline for a byte-exact round trip),
# q2_K in quantize --help, and one warning for -t above 4x the cores.
set -u
. "$(dirname "$0")/lib.sh" --model

BOGUS=--zz-bogus
# Values tried for a flag that takes one, in order (a number, a float, a cache
# type, a device, a template, an output format, a file, a preset, text, a pair).
VALUES=(1 0.5 f16 cpu chatml json "$MODEL" qwen2-0.5b llama hi 8,4)

# accepted CMD FLAG: 0 when the parser gets past FLAG (alone or with a value).
accepted() {
    local cmd=$1 flag=$2 v
    "$BIN" "$cmd" "$flag" "$BOGUS" </dev/null >"$TMP/out" 2>"$TMP/err"
    if [ $? -eq 2 ] && grep -qF -- "'$BOGUS'" "$TMP/err"; then return 0; fi
    for v in "${VALUES[@]}"; do
        "$BIN" "$cmd" "$flag" "$v" "$BOGUS" </dev/null >"$TMP/out" 2>"$TMP/err"
        if [ $? -eq 2 ] && grep -qF -- "'$BOGUS'" "$TMP/err"; then return 0; fi
    done
    return 1
}

CMDS="run chat perplexity bench quantize inspect synth tokenize detokenize serve"
total_flags=0
for cmd in $CMDS; do
    if "$BIN" "$cmd" --help >"$TMP/help.$cmd" 2>"$TMP/err"; then pass; else
        fail "minfer $cmd --help exited non-zero: $(cat "$TMP/err")"; continue; fi
    [ -s "$TMP/help.$cmd" ] && pass || fail "minfer $cmd --help printed nothing on stdout"
    "$BIN" "$cmd" -h >/dev/null 2>&1 && pass || fail "minfer $cmd -h exited non-zero"
    # flags: a dash run starting with a letter, at a line start or after a space,
    # bracket, comma, parenthesis or slash ("--tied/--untied", "[--pure]")
    flags=$(grep -oE '(^|[][ ,(/])--?[a-zA-Z][a-zA-Z0-9-]*' "$TMP/help.$cmd" | sed -E 's/^[][ ,(/]//' |
            grep -vxE -- '-h|--help' | sort -u)
    nf=0
    for f in $flags; do
        nf=$((nf + 1))
        if accepted "$cmd" "$f"; then pass; else
            fail "minfer $cmd: '$f' from --help is not accepted: $(head -c 300 "$TMP/err")"; fi
    done
    [ $nf -ge 2 ] && pass || fail "minfer $cmd --help: only $nf flags found"
    total_flags=$((total_flags + nf))
    echo "ok: $cmd: $nf flags from --help accepted"
done
[ $total_flags -ge 80 ] && pass || fail "only $total_flags flags found over the 9 help texts"

# the checker itself catches a flag the parser does not know
accepted run --no-such-flag && fail "accepted() passed an unknown flag" || pass

# ---- item 13: detokenize's newline, q2_K, -t warning ----
grep -q "newline" "$TMP/help.detokenize" && pass || fail "detokenize --help does not mention the newline"
grep -q "q2_K" "$TMP/help.quantize" && pass || fail "quantize --help does not list q2_K"
text=$'caf\xc3\xa9 na\xc3\xafve \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e  tabs\tand\nnewlines\n'
printf '%s' "$text" >"$TMP/text"
if "$BIN" tokenize -m "$MODEL" -f "$TMP/text" --ids --no-bos >"$TMP/ids" 2>"$TMP/err"; then
    "$BIN" detokenize -m "$MODEL" --no-newline <"$TMP/ids" >"$TMP/back" 2>>"$TMP/err"
    cmp -s "$TMP/text" "$TMP/back" && pass || fail "tokenize | detokenize --no-newline is not byte-exact"
    "$BIN" detokenize -m "$MODEL" <"$TMP/ids" >"$TMP/back_nl" 2>>"$TMP/err"
    { cat "$TMP/text"; printf '\n'; } | cmp -s - "$TMP/back_nl" && pass ||
        fail "detokenize without --no-newline is not the text plus one newline"
else
    fail "tokenize failed: $(cat "$TMP/err")"
fi
cores=$(nproc 2>/dev/null || echo 1)
many=$((4 * cores + 1))
"$BIN" run -m "$MODEL" -p hi -n 1 -c 64 -t "$many" >/dev/null 2>"$TMP/err"
[ "$(grep -c "$many threads on $cores cores" "$TMP/err")" -eq 1 ] && pass ||
    fail "-t $many on $cores cores: want one warning line: $(cat "$TMP/err")"
"$BIN" run -m "$MODEL" -p hi -n 1 -c 64 -t "$cores" >/dev/null 2>"$TMP/err"
! grep -q "threads on" "$TMP/err" && pass || fail "-t $cores warned: $(cat "$TMP/err")"

finish
