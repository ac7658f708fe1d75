/* lineedit.h - a small line editor for `minfer chat` on a terminal.
 *
 * Raw termios mode while a line is read (restored before returning, and on
 * exit): printable text and UTF-8 insert at the cursor; Left/Right, Home/End
 * (also Ctrl-A / Ctrl-E), Backspace, Delete, Ctrl-U (kill to start), Ctrl-K
 * (kill to end), Up/Down walk the history. Enter ends the line. Not GNU
 * readline: only what the chat prompt needs. */
#ifndef MF_TOOLS_LINEEDIT_H
#define MF_TOOLS_LINEEDIT_H

#include <stddef.h>

typedef struct mf_lineedit mf_lineedit;

typedef enum mf_le_status {
    MF_LE_LINE,      /* *line is a malloc'd line (without the newline) */
    MF_LE_EOF,       /* Ctrl-D on an empty line, or end of input */
    MF_LE_INTERRUPT, /* Ctrl-C on an empty line (on typed text it clears the line) */
} mf_le_status;

/* An editor on the terminal behind fd in / out. */
mf_lineedit *mf_le_new(int in_fd, int out_fd);
void mf_le_free(mf_lineedit *le);
/* Reads one line after prompt. */
mf_le_status mf_le_read(mf_lineedit *le, const char *prompt, char **line);
/* Adds a line to the history (empty lines and repeats of the last are not). */
void mf_le_history_add(mf_lineedit *le, const char *line);

#endif
