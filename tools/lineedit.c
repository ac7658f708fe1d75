/* lineedit.c - the chat prompt's line editor (see lineedit.h). */
#include "lineedit.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <termios.h>
#include <unistd.h>

#define LE_HISTORY 200

struct mf_lineedit {
    int in, out;
    char **hist;
    int n_hist;
    char *buf;      /* the line being edited */
    size_t len, cap, cur; /* bytes; cur is the cursor's byte offset */
};

/* The terminal's state before raw mode; restored at exit too, so a crash or
 * exit() while editing does not leave the shell in raw mode. */
static struct termios saved;
static int saved_fd = -1;

static void restore(void) {
    if (saved_fd >= 0)
        tcsetattr(saved_fd, TCSAFLUSH, &saved);
    saved_fd = -1;
}

static int raw_on(int fd) {
    static bool registered;
    struct termios t;
    if (tcgetattr(fd, &saved) != 0)
        return -1;
    if (!registered) {
        atexit(restore);
        registered = true;
    }
    t = saved;
    t.c_iflag &= ~(tcflag_t)(BRKINT | ICRNL | INPCK | ISTRIP | IXON);
    t.c_cflag |= CS8;
    t.c_lflag &= ~(tcflag_t)(ECHO | ICANON | IEXTEN | ISIG);
    t.c_cc[VMIN] = 1;
    t.c_cc[VTIME] = 0;
    if (tcsetattr(fd, TCSAFLUSH, &t) != 0)
        return -1;
    saved_fd = fd;
    return 0;
}

mf_lineedit *mf_le_new(int in_fd, int out_fd) {
    mf_lineedit *le = calloc(1, sizeof *le);
    if (!le)
        return NULL;
    le->in = in_fd;
    le->out = out_fd;
    le->hist = calloc(LE_HISTORY, sizeof *le->hist);
    if (!le->hist) {
        free(le);
        return NULL;
    }
    return le;
}

void mf_le_free(mf_lineedit *le) {
    if (!le)
        return;
    for (int i = 0; i < le->n_hist; i++)
        free(le->hist[i]);
    free(le->hist);
    free(le->buf);
    free(le);
}

void mf_le_history_add(mf_lineedit *le, const char *line) {
    if (!*line || (le->n_hist && !strcmp(le->hist[le->n_hist - 1], line)))
        return;
    char *c = strdup(line);
    if (!c)
        return;
    if (le->n_hist == LE_HISTORY) {
        free(le->hist[0]);
        memmove(le->hist, le->hist + 1, (LE_HISTORY - 1) * sizeof *le->hist);
        le->n_hist--;
    }
    le->hist[le->n_hist++] = c;
}

static void put(mf_lineedit *le, const char *s, size_t n) {
    while (n) {
        ssize_t k = write(le->out, s, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return;
        s += k;
        n -= (size_t)k;
    }
}

static size_t n_chars(const char *s, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        c += ((unsigned char)s[i] & 0xC0) != 0x80;
    return c;
}

/* Prompt and line again, the cursor put back where it is in the text. */
static void redraw(mf_lineedit *le, const char *prompt) {
    put(le, "\r", 1);
    put(le, prompt, strlen(prompt));
    put(le, le->buf, le->len);
    put(le, "\x1b[K", 3);
    size_t back = n_chars(le->buf + le->cur, le->len - le->cur);
    if (back) {
        char seq[32];
        int k = snprintf(seq, sizeof seq, "\x1b[%zuD", back);
        put(le, seq, (size_t)k);
    }
}

static bool reserve(mf_lineedit *le, size_t extra) {
    if (le->len + extra + 1 <= le->cap)
        return true;
    size_t cap = (le->len + extra + 1) * 2;
    char *nb = realloc(le->buf, cap);
    if (!nb)
        return false;
    le->buf = nb;
    le->cap = cap;
    return true;
}

static void set_text(mf_lineedit *le, const char *s) {
    size_t n = strlen(s);
    le->len = le->cur = 0;
    if (!reserve(le, n))
        return;
    memcpy(le->buf, s, n);
    le->len = le->cur = n;
}

static void insert(mf_lineedit *le, char c) {
    if (!reserve(le, 1))
        return;
    memmove(le->buf + le->cur + 1, le->buf + le->cur, le->len - le->cur);
    le->buf[le->cur++] = c;
    le->len++;
}

/* Byte offsets of the character before / after the cursor. */
static size_t prev_char(const mf_lineedit *le, size_t at) {
    if (at == 0)
        return 0;
    at--;
    while (at > 0 && ((unsigned char)le->buf[at] & 0xC0) == 0x80)
        at--;
    return at;
}

static size_t next_char(const mf_lineedit *le, size_t at) {
    if (at >= le->len)
        return le->len;
    at++;
    while (at < le->len && ((unsigned char)le->buf[at] & 0xC0) == 0x80)
        at++;
    return at;
}

static void erase(mf_lineedit *le, size_t from, size_t to) {
    memmove(le->buf + from, le->buf + to, le->len - to);
    le->len -= to - from;
    if (le->cur > to)
        le->cur -= to - from;
    else if (le->cur > from)
        le->cur = from;
}

static int get_byte(mf_lineedit *le) {
    unsigned char c;
    for (;;) {
        ssize_t k = read(le->in, &c, 1);
        if (k == 1)
            return c;
        if (k < 0 && errno == EINTR)
            continue;
        return -1;
    }
}

/* Reads what follows ESC and returns a key code: 'A'..'D' arrows, 'H' home,
 * 'F' end, 'X' delete, 0 for anything else (consumed and ignored). */
static int escape_key(mf_lineedit *le) {
    int c = get_byte(le);
    if (c != '[' && c != 'O')
        return 0;
    int d = get_byte(le);
    if (d >= '0' && d <= '9') {
        int num = d - '0', e;
        while ((e = get_byte(le)) >= '0' && e <= '9')
            num = num * 10 + (e - '0');
        if (e != '~')
            return 0;
        return num == 1 || num == 7 ? 'H' : num == 4 || num == 8 ? 'F' : num == 3 ? 'X' : 0;
    }
    return d == 'A' || d == 'B' || d == 'C' || d == 'D' || d == 'H' || d == 'F' ? d : 0;
}

static mf_le_status finish(mf_lineedit *le, mf_le_status st, char **line) {
    put(le, "\r\n", 2);
    restore();
    if (st != MF_LE_LINE)
        return st;
    *line = malloc(le->len + 1);
    if (!*line)
        return MF_LE_EOF;
    memcpy(*line, le->buf ? le->buf : "", le->len);
    (*line)[le->len] = 0;
    return MF_LE_LINE;
}

mf_le_status mf_le_read(mf_lineedit *le, const char *prompt, char **line) {
    *line = NULL;
    le->len = le->cur = 0;
    if (!reserve(le, 64))
        return MF_LE_EOF;
    if (raw_on(le->in) != 0) {
        /* not a terminal after all: read a plain line */
        put(le, prompt, strlen(prompt));
        for (int c; (c = get_byte(le)) >= 0 && c != '\n';)
            if (reserve(le, 1))
                le->buf[le->len++] = (char)c;
        if (le->len == 0)
            return MF_LE_EOF;
        *line = strndup(le->buf, le->len);
        return *line ? MF_LE_LINE : MF_LE_EOF;
    }
    int hist_at = le->n_hist; /* n_hist: the line being typed */
    char *typed = NULL;       /* that line while the history is shown */
    redraw(le, prompt);
    mf_le_status st = MF_LE_LINE;
    for (;;) {
        int c = get_byte(le);
        if (c < 0) {
            st = MF_LE_EOF;
            break;
        }
        if (c == '\r' || c == '\n')
            break;
        if (c == 3) { /* Ctrl-C: drops typed text; on an empty line it is the way out */
            if (le->len == 0) {
                st = MF_LE_INTERRUPT;
                break;
            }
            le->len = le->cur = 0;
            put(le, "^C\r\n", 4);
            redraw(le, prompt);
            continue;
        }
        if (c == 4) { /* Ctrl-D: end of input on an empty line, else delete */
            if (le->len == 0) {
                st = MF_LE_EOF;
                break;
            }
            erase(le, le->cur, next_char(le, le->cur));
        } else if (c == 127 || c == 8) {
            erase(le, prev_char(le, le->cur), le->cur);
        } else if (c == 1) {
            le->cur = 0;
        } else if (c == 5) {
            le->cur = le->len;
        } else if (c == 21) {
            erase(le, 0, le->cur);
        } else if (c == 11) {
            le->len = le->cur;
        } else if (c == 27) {
            int k = escape_key(le);
            if (k == 'D')
                le->cur = prev_char(le, le->cur);
            else if (k == 'C')
                le->cur = next_char(le, le->cur);
            else if (k == 'H')
                le->cur = 0;
            else if (k == 'F')
                le->cur = le->len;
            else if (k == 'X')
                erase(le, le->cur, next_char(le, le->cur));
            else if ((k == 'A' && hist_at > 0) || (k == 'B' && hist_at < le->n_hist)) {
                if (hist_at == le->n_hist) {
                    free(typed);
                    typed = strndup(le->buf, le->len);
                }
                hist_at += k == 'A' ? -1 : 1;
                set_text(le, hist_at < le->n_hist ? le->hist[hist_at] : typed ? typed : "");
            }
        } else if (c >= 32 || c == '\t') {
            insert(le, (char)c);
        }
        redraw(le, prompt);
    }
    free(typed);
    return finish(le, st, line);
}
