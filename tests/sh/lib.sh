# Shared preamble of the CLI tests (tests/sh/test_*.sh); not a test itself.
# A test starts with
#     set -u
#     . "$(dirname "$0")/lib.sh" [--model]
# and ends with `finish`. --model makes MINFER_MODEL mandatory (the script
# stops with a message when it is unset) and sets MODEL.
#
# Sets: BIN (the minfer binary), PY (python), BUILD (the build dir), SRC (the
# source tree), TMP (a fresh scratch dir named after the test, removed at
# exit), and the counters n (passed) and fails.
#
# Contract of the helpers:
#   pass / fail MSG        count one check; fail prints "FAIL: MSG"
#   crashed FILE...        0 when a file holds a crash report
#   expect_fail RC PAT CMD...
#                          CMD (stdin from /dev/null) exits RC (any non-zero
#                          when RC is '-'), writes exactly one stderr line,
#                          containing PAT, no crash report, and by default
#                          nothing on stdout. Its output stays in $TMP/out
#                          and $TMP/err for further checks. A test whose
#                          contract differs sets, before the first call:
#                            EXPECT_ICASE=1    match PAT ignoring case
#                            EXPECT_STDOUT=any stdout may hold text
#   finish                 print "N passed, N failed"; exit 1 on a failure

BIN=${MINFER_BIN:-minfer}
PY=${MINFER_PYTHON:-python3}
BUILD=${MINFER_BUILD:-$(dirname "$BIN")}
SRC=${MINFER_SRC:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
if [ "${1:-}" = --model ]; then
    MODEL=${MINFER_MODEL:?MINFER_MODEL must name the SmolLM2 GGUF}
fi
_lib_name=$(basename "$0" .sh)
TMP=${MINFER_TMP:-/tmp}/${_lib_name#test_}.$$
mkdir -p "$TMP"
trap 'rm -rf "$TMP"' EXIT

fails=0
n=0
EXPECT_ICASE=0
EXPECT_STDOUT=empty

pass() { n=$((n + 1)); }
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
crashed() { grep -qE 'Segmentation|Sanitizer|Aborted|core dumped' "$@"; }

expect_fail() {
    local want=$1 pat=$2 grepf=-qF
    shift 2
    [ "$EXPECT_ICASE" = 1 ] && grepf=-qiF
    "$@" </dev/null >"$TMP/out" 2>"$TMP/err"
    local rc=$?
    local lines
    lines=$(wc -l <"$TMP/err")
    if crashed "$TMP/out" "$TMP/err"; then fail "'$*' crashed: $(cat "$TMP/err")"; return; fi
    if [ $rc -eq 0 ]; then fail "'$*' exited 0"; return; fi
    if [ "$want" != - ] && [ $rc -ne "$want" ]; then
        fail "'$*' exited $rc, want $want: $(cat "$TMP/err")"; return
    fi
    if [ "$lines" -ne 1 ]; then fail "'$*' printed $lines stderr lines:"; cat "$TMP/err"; return; fi
    if ! grep $grepf -- "$pat" "$TMP/err"; then fail "'$*' stderr lacks '$pat': $(cat "$TMP/err")"; return; fi
    if [ "$EXPECT_STDOUT" != any ] && [ -s "$TMP/out" ]; then
        fail "'$*' wrote to stdout: $(head -c 200 "$TMP/out")"; return
    fi
    echo "ok: $* -> $(cat "$TMP/err")"
    pass
}

finish() {
    echo "$n passed, $fails failed"
    [ "$fails" -eq 0 ] || exit 1
    exit 0
}
