"""minfer chat driven through a pseudo-terminal (the real SmolLM2 model).

Checks, each on the terminal exactly as a person would type it:
- line editing: a typo fixed with Backspace, a missing word inserted after
  Left-arrow moves, Home/End; /save then shows the corrected message byte for
  byte, and the model answers the corrected question (Paris);
- history: Up recalls the previous line, Down returns to the typed one;
- Ctrl-C during a long answer stops it, the prompt comes back, and the next
  question is answered (the process lives on); Ctrl-C on typed text clears it;
- /help lists the commands, an unknown /command is named and not sent to the
  model, /clear forgets the conversation, /load replaces it (a later /save
  writes the loaded messages), /load of a broken file keeps the conversation;
- context shift: with -c 100 several turns exceed the context, the session
  says it dropped the oldest turn and keeps answering instead of exiting;
- Ctrl-C at an empty prompt exits with status 0.
"""
import json
import os
import pty
import re
import select
import signal
import sys
import time

BIN = os.environ["MINFER_BIN"]
MODEL = os.environ["MINFER_MODEL"]
TMP = os.environ.get("MINFER_TMP", "/tmp")
fails = []
passed = 0


def check(ok, msg):
    global passed
    if ok:
        passed += 1
    else:
        fails.append(msg)
        print("FAIL:", msg)


class Term:
    def __init__(self, *args):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:
            os.execv(BIN, [BIN, "chat", "-m", MODEL, "--temp", "0", *args])
        self.buf = b""

    def read_until(self, pat, timeout=60.0):
        """Output up to and including the first match of pat after the read
        position; None on timeout (or the process ending first)."""
        rx = re.compile(pat)
        end = time.time() + timeout
        while True:
            m = rx.search(self.buf)
            if m:
                out, self.buf = self.buf[: m.end()], self.buf[m.end():]
                return out
            left = end - time.time()
            if left <= 0:
                return None
            r, _, _ = select.select([self.fd], [], [], left)
            if not r:
                continue
            try:
                data = os.read(self.fd, 4096)
            except OSError:
                return None
            if not data:
                return None
            self.buf += data

    def send(self, s):
        os.write(self.fd, s if isinstance(s, bytes) else s.encode())

    def prompt(self, timeout=60.0):
        # a fresh, empty prompt right after a line of output (redraws while
        # typing always have the prompt after "\r" only)
        return self.read_until(rb"\n\r> \x1b\[K", timeout)

    def wait(self, timeout=20.0):
        end = time.time() + timeout
        while time.time() < end:
            pid, st = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                return os.waitstatus_to_exitcode(st)
            r, _, _ = select.select([self.fd], [], [], 0.05)
            if r:  # drain without blocking: a child that neither writes nor exits
                try:  # must end in the kill below, not a read that never returns
                    os.read(self.fd, 4096)
                except OSError:
                    pass
        os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)
        return None

    def kill(self):
        try:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass


LEFT, RIGHT, UP, DOWN, HOME, END = b"\x1b[D", b"\x1b[C", b"\x1b[A", b"\x1b[B", b"\x1b[H", b"\x1b[F"
save1 = os.path.join(TMP, f"chat_pty_{os.getpid()}_1.json")
save2 = os.path.join(TMP, f"chat_pty_{os.getpid()}_2.json")
bad = os.path.join(TMP, f"chat_pty_{os.getpid()}_bad.json")
loadf = os.path.join(TMP, f"chat_pty_{os.getpid()}_load.json")


def saved(path):
    try:
        with open(path) as f:
            return json.load(f)["messages"]
    except (OSError, ValueError, KeyError) as e:
        return f"unreadable: {e}"


t = Term("-n", "24", "-sys", "You are a helpful assistant.")
try:
    check(t.prompt() is not None, "no first prompt")
    # typo 'Frx' fixed with Backspace; 'of ' inserted after moving Left over
    # 'France?' (7 characters); Home/End move and typing still lands at the end
    t.send(b"What is the capital Frx\x7fance?")
    t.send(LEFT * 7 + b"of " + HOME + END + b"\r")
    out = t.prompt()
    check(out is not None and b"Paris" in out, f"edited question not answered with Paris: {out!r}")
    t.send(f"/save {save1}\r")
    t.prompt()
    msgs = saved(save1)
    check(isinstance(msgs, list) and len(msgs) == 3 and msgs[0]["role"] == "system"
          and msgs[1] == {"role": "user", "content": "What is the capital of France?"}
          and msgs[2]["role"] == "assistant" and "Paris" in msgs[2]["content"],
          f"/save after editing: {msgs!r}")
    # history: Up Up -> the question again (the /save line is the last entry);
    # Down over the newest entry returns to the typed text
    t.send(b"zz" + UP + DOWN + b"\x7f\x7f" + UP + UP + b"\r")
    out = t.prompt()
    check(out is not None and b"Paris" in out, f"history recall not answered: {out!r}")
    t.send(f"/save {save2}\r")
    t.prompt()
    msgs = saved(save2)
    check(isinstance(msgs, list) and len(msgs) == 5 and msgs[3]["content"] == msgs[1]["content"],
          f"Up did not recall the question: {msgs!r}")
    # /help, unknown command, Ctrl-C on typed text
    t.send(b"/help\r")
    out = t.prompt()
    check(out is not None and b"/save FILE" in out and b"/clear" in out, f"/help: {out!r}")
    t.send(b"/frobnicate\r")
    out = t.prompt()
    check(out is not None and b"unknown command '/frobnicate'" in out, f"unknown command: {out!r}")
    t.send(b"some words\x03")
    out = t.read_until(rb"\^C", 10)
    t.prompt(10)
    t.send(b"/save " + save2.encode() + b"\r")
    t.prompt()
    msgs = saved(save2)
    check(out is not None and isinstance(msgs, list) and len(msgs) == 5,
          f"Ctrl-C on typed text or /frobnicate changed the conversation: {msgs!r}")
    # /load replaces, /clear forgets
    with open(loadf, "w") as f:
        json.dump({"messages": [{"role": "system", "content": "Be brief."},
                                {"role": "user", "content": "Say hi."},
                                {"role": "assistant", "content": "Hi."}]}, f)
    t.send(f"/load {loadf}\r")
    out = t.prompt()
    check(out is not None and b"loaded 3 messages" in out, f"/load: {out!r}")
    t.send(f"/save {save2}\r")
    t.prompt()
    check(saved(save2) == [{"role": "system", "content": "Be brief."},
                           {"role": "user", "content": "Say hi."},
                           {"role": "assistant", "content": "Hi."}],
          f"/save after /load: {saved(save2)!r}")
    with open(bad, "w") as f:
        f.write('{"messages": [{"role": "wizard", "content": "x"}]}')
    t.send(f"/load {bad}\r")
    out = t.prompt()
    check(out is not None and b"wizard" not in out and b"role" in out, f"bad /load: {out!r}")
    t.send(b"/clear\r")
    t.prompt()
    t.send(f"/save {save2}\r")
    t.prompt()
    check(saved(save2) == [{"role": "system", "content": "Be brief."}], f"/clear: {saved(save2)!r}")
    t.send(b"/exit\r")
    check(t.wait() == 0, "/exit did not exit 0")
finally:
    t.kill()

# Ctrl-C during a long answer, then a normal turn, then Ctrl-C at an empty prompt
t = Term("-n", "-1", "--ignore-eos", "-c", "2048")
try:
    t.prompt()
    t.send(b"Write a very long story about a dragon.\r")
    # the editor's own "\r\n" when it takes the line (its redraws while
    # typing never have one): only then is the answer running, and a Ctrl-C
    # a signal rather than a byte the editor is still to read
    t.read_until(rb"\r\n", 30)
    got = t.read_until(rb"(\S+\s+){12}", 60)  # some words of the answer
    t.send(b"\x03")
    out = t.read_until(rb"\[stopped\]", 30)
    check(got is not None and out is not None, f"Ctrl-C did not stop the answer: {out!r}")
    check(t.prompt(30) is not None, "no prompt after Ctrl-C")
    t.send(b"\x03")
    check(t.wait() == 0, "Ctrl-C at an empty prompt did not exit 0")
finally:
    t.kill()

# context shift: a tiny context fills after a few turns; the chat goes on
t = Term("-n", "24", "-c", "100", "-sys", "You are a helpful assistant.")
try:
    t.prompt()
    log = b""
    answered = 0
    for q in ["What is the capital of France?", "What is the capital of Germany?",
              "What is the capital of Italy?", "What is the capital of Spain?",
              "What is the capital of Japan?"]:
        t.send(q.encode() + b"\r")
        out = t.prompt(90)
        if out is None:
            break
        answered += 1
        log += out
    check(answered == 5, f"only {answered} of 5 turns answered with -c 100: {log[-400:]!r}")
    check(b"context shift" in log, f"no context shift said: {log[-400:]!r}")
    check(b"Tokyo" in log, "the last turn (after shifts) is not answered: " + repr(log[-300:]))
    t.send(b"\x04")
    check(t.wait() == 0, "Ctrl-D did not exit 0")
finally:
    t.kill()

for p in (save1, save2, bad, loadf):
    try:
        os.unlink(p)
    except OSError:
        pass
print(f"{passed} passed, {len(fails)} failed")
sys.exit(1 if fails else 0)
