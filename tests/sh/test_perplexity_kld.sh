#!/usr/bin/env bash
# minfer perplexity: llama.cpp's "Final estimate: PPL = X +/- Y" line, and
# KL divergence against saved base log-probs: the same model and settings
# give KLD 0 and 100% same top token; a q8_0 KV cache gives a small positive
# KLD with most tops the same; a base saved for other settings is refused.
set -u
. "$(dirname "$0")/lib.sh" --model
EXPECT_ICASE=1
EXPECT_STDOUT=any
P=("$BIN" perplexity -m "$MODEL" -f "$SRC/tests/golden/ppl_english.txt" -c 128 --chunks 2)
B=$TMP/base.kld
"${P[@]}" --kl-divergence-base "$B" >"$TMP/base" 2>"$TMP/base.err" && pass || fail "saving the base: $(cat "$TMP/base.err")"
grep -qE '^Final estimate: PPL = [0-9]+\.[0-9]+ \+/- [0-9]+\.[0-9]+$' "$TMP/base" && pass ||
    fail "no Final estimate line: $(cat "$TMP/base")"
[ -s "$B" ] && pass || fail "no base file written"
"${P[@]}" --kl-divergence-base "$B" --kl-divergence >"$TMP/same" 2>"$TMP/same.err" && pass || fail "compare: $(cat "$TMP/same.err")"
grep -qx 'Mean KLD: 0.000000 +/- 0.000000' "$TMP/same" && grep -q '^Same top p: 100.000' "$TMP/same" && pass ||
    fail "same model is not KLD 0 / 100%: $(cat "$TMP/same")"
"${P[@]}" --kl-divergence-base "$B" --kl-divergence -ctk q8_0 >"$TMP/q8" 2>"$TMP/q8.err" && pass || fail "q8_0: $(cat "$TMP/q8.err")"
kld=$(sed -n 's/^Mean KLD: \([0-9.]*\) .*/\1/p' "$TMP/q8"); top=$(sed -n 's/^Same top p: \([0-9.]*\) .*/\1/p' "$TMP/q8")
awk -v k="${kld:-0}" -v t="${top:-0}" 'BEGIN { exit !(k > 0 && k < 0.1 && t > 80 && t <= 100) }' && pass ||
    fail "q8_0 KV: KLD '$kld' (want 0 < x < 0.1), same top '$top' (want > 80)"
expect_fail 1 "another run" "$BIN" perplexity -m "$MODEL" -f "$SRC/tests/golden/ppl_english.txt" -c 64 --chunks 2 \
    --kl-divergence-base "$B" --kl-divergence
expect_fail 2 "needs --kl-divergence-base" "${P[@]}" --kl-divergence
printf 'junk' >"$TMP/junk"
expect_fail 1 "not a minfer KL" "${P[@]}" --kl-divergence-base "$TMP/junk" --kl-divergence
finish
