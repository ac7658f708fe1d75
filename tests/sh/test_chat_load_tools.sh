#!/usr/bin/env bash
# minfer chat has no tools mode: /load of a conversation carrying tool_calls
# (or a tool message) is refused with the reason, the chat goes on.
set -u
T=${MINFER_TMP:-/tmp}/chat_load_tools.$$
mkdir -p "$T"
trap 'rm -rf "$T"' EXIT
printf '%s' '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "",
  "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]}' >"$T/calls.json"
printf '%s' '{"messages": [{"role": "tool", "content": "r", "tool_call_id": "c1"}]}' >"$T/tool.json"
fail=0
for f in calls tool; do
    err=$(printf '/load %s\n/exit\n' "$T/$f.json" | timeout 120 "$MINFER_BIN" chat -m "$MINFER_MODEL" -n 1 -t 2 2>&1 >/dev/null)
    rc=$?
    case $f in
        calls) want="a field other than role and content" ;;
        tool) want="a role that is not system, user or assistant" ;;
    esac
    if [ $rc -eq 0 ] && printf '%s' "$err" | grep -q "chat: /load: .*$want"; then
        echo "ok: /load $f refused: $want"
    else
        echo "FAIL: /load $f (rc $rc): $err"
        fail=1
    fi
done
exit $fail
