/* cmd_tokenize.c - `minfer tokenize` (text -> ids/pieces) and `minfer
 * detokenize` (ids -> text), over the model's own vocab. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "gguf/gguf.h"
#include "tokenizer/tokenizer.h"
#include "tools.h"

static const char *tokenize_help =
    "usage: minfer tokenize [-m MODEL] (-p TEXT | -f FILE) [options]\n"
    "\n"
    "Prints the tokens of TEXT (or of FILE's bytes; '-' reads stdin), one per\n"
    "line as 'ID<TAB>PIECE' (control characters in pieces escaped).\n"
    "\n"
    "  -m, --model MODEL  GGUF model (default $MINFER_MODEL, else " MF_DEFAULT_MODEL ")\n"
    "  -p, --prompt TEXT  text to tokenize\n"
    "  -f, --file FILE    read the text from FILE\n"
    "      --ids          print only the ids\n"
    "      --pieces       print only the pieces\n"
    "      --json         print one JSON object {\"ids\": [...], \"pieces\": [...]}\n"
    "                     (with --ids: just the array of ids)\n"
    "      --no-special   special-token texts (e.g. <|im_start|>) are plain text\n"
    "      --no-bos       do not add BOS/EOS even when the model asks for them\n"
    "      --batch        the input holds several texts separated by NUL bytes;\n"
    "                     print one JSON array of ids per text, one per line\n"
    "  -h, --help         this text\n";

static const char *detokenize_help =
    "usage: minfer detokenize [-m MODEL] [--no-special] [--no-newline] [IDS...]\n"
    "\n"
    "Prints the text of the token ids given as arguments, or read from stdin\n"
    "(separated by spaces, commas or newlines) when there are none, followed by\n"
    "one newline (not part of the text; --no-newline omits it, for a byte-exact\n"
    "round trip). Bytes that do not form valid UTF-8 are printed as U+FFFD.\n"
    "\n"
    "  -m, --model MODEL  GGUF model (default $MINFER_MODEL, else " MF_DEFAULT_MODEL ")\n"
    "      --no-special   omit the text of control tokens (BOS, <|im_end|>, ...)\n"
    "      --no-newline   do not end the output with a newline\n"
    "  -h, --help         this text\n";


/* Opens the model and builds its tokenizer; prints the error and returns -1. */
static int load_tokenizer(const char *cmd, const char *path, mf_gguf **g, mf_tokenizer **t) {
    mf_error err = {{0}};
    if (mf_gguf_open(path, g, &err)) {
        fprintf(stderr, "%s: %s\n", cmd, err.msg);
        return -1;
    }
    if (mf_tokenizer_from_gguf(*g, t, &err)) {
        fprintf(stderr, "%s: %s: %s\n", cmd, path, err.msg);
        mf_gguf_close(*g);
        return -1;
    }
    return 0;
}

/* Reads a whole file ("-" = stdin). Returns a malloc'd buffer or NULL. */
static char *read_all(const char *path, size_t *len) {
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!f)
        return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = mf_malloc(cap);
    for (;;) {
        if (n == cap)
            buf = mf_realloc(buf, cap *= 2);
        size_t r = fread(buf + n, 1, cap - n, f);
        n += r;
        if (r == 0)
            break;
    }
    bool bad = ferror(f);
    if (f != stdin)
        fclose(f);
    if (bad) {
        free(buf);
        return NULL;
    }
    *len = n;
    return buf;
}

static void print_escaped(FILE *f, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\n')
            fputs("\\n", f);
        else if (c == '\r')
            fputs("\\r", f);
        else if (c == '\t')
            fputs("\\t", f);
        else if (c == '\\')
            fputs("\\\\", f);
        else if (c < 0x20 || c == 0x7f)
            fprintf(f, "\\x%02x", c);
        else
            fputc(c, f);
    }
}

/* A JSON string literal of s; bytes that are not valid UTF-8 become U+FFFD
 * (through the detokenizer's own validation). */
static void print_json_str(FILE *f, const char *s, size_t n) {
    fputc('"', f);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            fputc('\\', f);
            fputc(c, f);
        } else if (c < 0x20 || c == 0x7f) {
            fprintf(f, "\\u%04x", c);
        } else if (c < 0x80) {
            fputc(c, f);
        } else {
            int len = (c >= 0xc2 && c < 0xe0) ? 2 : (c >= 0xe0 && c < 0xf0) ? 3
                    : (c >= 0xf0 && c < 0xf5) ? 4 : 0;
            bool ok = len > 0 && i + (size_t)len <= n;
            for (int k = 1; ok && k < len; k++)
                ok = ((unsigned char)s[i + k] & 0xc0) == 0x80;
            if (ok) {
                fwrite(s + i, 1, (size_t)len, f);
                i += (size_t)len - 1;
            } else {
                fputs("\\ufffd", f);
            }
        }
    }
    fputc('"', f);
}

/* Tokenizes text into *ids (grown as needed). Returns the count or -1. */
static int64_t tokenize_all(const mf_tokenizer *t, const char *text, size_t len, bool add,
                            bool parse, int32_t **ids, int64_t *cap, mf_error *err) {
    int64_t n = mf_tokenize(t, text, len, add, parse, *ids, *cap, err);
    if (n > *cap) {
        *cap = n;
        *ids = mf_realloc(*ids, sizeof **ids * (size_t)n);
        n = mf_tokenize(t, text, len, add, parse, *ids, *cap, err);
    }
    return n;
}

int mf_cmd_tokenize(int argc, char **argv) {
    const char *cmd = "tokenize", *model = mf_default_model(), *prompt = NULL, *file = NULL;
    bool only_ids = false, only_pieces = false, json = false, parse = true, add = true;
    bool batch = false;
    mf_error err = {{0}};
    for (int i = 1; i < argc; i++) {
        const char *v;
        int r;
        if (mf_arg_is_help(argv[i])) {
            fputs(tokenize_help, stdout);
            return 0;
        }
        if ((r = mf_arg_value(argc, argv, &i, "-m", &v, &err)) ||
            (r = mf_arg_value(argc, argv, &i, "--model", &v, &err))) {
            if (r < 0)
                return mf_arg_fail(cmd, &err);
            model = v;
        } else if ((r = mf_arg_value(argc, argv, &i, "-p", &v, &err)) ||
                   (r = mf_arg_value(argc, argv, &i, "--prompt", &v, &err))) {
            if (r < 0)
                return mf_arg_fail(cmd, &err);
            prompt = v;
        } else if ((r = mf_arg_value(argc, argv, &i, "-f", &v, &err)) ||
                   (r = mf_arg_value(argc, argv, &i, "--file", &v, &err))) {
            if (r < 0)
                return mf_arg_fail(cmd, &err);
            file = v;
        } else if (!strcmp(argv[i], "--ids")) {
            only_ids = true;
        } else if (!strcmp(argv[i], "--pieces")) {
            only_pieces = true;
        } else if (!strcmp(argv[i], "--json")) {
            json = true;
        } else if (!strcmp(argv[i], "--no-special")) {
            parse = false;
        } else if (!strcmp(argv[i], "--no-bos")) {
            add = false;
        } else if (!strcmp(argv[i], "--batch")) {
            batch = true;
        } else {
            mf_errorf(&err, "unknown option '%s' (see 'minfer tokenize --help')", argv[i]);
            return mf_arg_fail(cmd, &err);
        }
    }
    if (!prompt == !file) {
        mf_errorf(&err, "give exactly one of -p TEXT and -f FILE");
        return mf_arg_fail(cmd, &err);
    }
    if (only_ids && only_pieces) {
        mf_errorf(&err, "--ids and --pieces exclude each other");
        return mf_arg_fail(cmd, &err);
    }
    size_t len = 0;
    char *owned = NULL;
    const char *text = prompt;
    if (file) {
        owned = read_all(file, &len);
        if (!owned) {
            fprintf(stderr, "%s: cannot read '%s': %s\n", cmd, file, strerror(errno));
            return 1;
        }
        text = owned;
    } else {
        len = strlen(prompt);
    }
    mf_gguf *g;
    mf_tokenizer *t;
    if (load_tokenizer(cmd, model, &g, &t)) {
        free(owned);
        return 1;
    }
    int64_t cap = 256;
    int32_t *ids = mf_malloc(sizeof *ids * (size_t)cap);
    int rc = 0;
    if (batch) {
        size_t start = 0;
        while (start < len || (start == len && len == 0)) {
            const char *end = memchr(text + start, 0, len - start);
            size_t l = end ? (size_t)(end - (text + start)) : len - start;
            int64_t n = tokenize_all(t, text + start, l, add, parse, &ids, &cap, &err);
            if (n < 0) {
                fprintf(stderr, "%s: %s\n", cmd, err.msg);
                rc = 1;
                break;
            }
            fputc('[', stdout);
            for (int64_t k = 0; k < n; k++)
                printf(k ? ",%d" : "%d", ids[k]);
            fputs("]\n", stdout);
            start += l + 1;
            if (!end)
                break;
        }
    } else {
        int64_t n = tokenize_all(t, text, len, add, parse, &ids, &cap, &err);
        if (n < 0) {
            fprintf(stderr, "%s: %s\n", cmd, err.msg);
            rc = 1;
        }
        char piece[1024];
        if (json && n >= 0) {
            if (!only_pieces) {
                fputs(only_ids ? "[" : "{\"ids\": [", stdout);
                for (int64_t k = 0; k < n; k++)
                    printf(k ? ", %d" : "%d", ids[k]);
                fputs(only_ids ? "]\n" : "]", stdout);
            }
            if (!only_ids) {
                fputs(only_pieces ? "{\"pieces\": [" : ", \"pieces\": [", stdout);
                for (int64_t k = 0; k < n; k++) {
                    int l = mf_token_to_piece(t, ids[k], true, piece, sizeof piece);
                    if (k)
                        fputs(", ", stdout);
                    print_json_str(stdout, piece, l > (int)sizeof piece ? sizeof piece : (size_t)l);
                }
                fputs("]}\n", stdout);
            }
        } else {
            for (int64_t k = 0; k < n; k++) {
                int l = mf_token_to_piece(t, ids[k], true, piece, sizeof piece);
                size_t pl = l > (int)sizeof piece ? sizeof piece : (size_t)l;
                if (only_ids) {
                    printf("%d\n", ids[k]);
                } else if (only_pieces) {
                    print_escaped(stdout, piece, pl);
                    fputc('\n', stdout);
                } else {
                    printf("%d\t", ids[k]);
                    print_escaped(stdout, piece, pl);
                    fputc('\n', stdout);
                }
            }
        }
    }
    free(ids);
    free(owned);
    mf_tokenizer_free(t);
    mf_gguf_close(g);
    return rc;
}

/* Parses the ids in s (separated by spaces, commas, newlines, brackets).
 * Returns 0, or -1 with err naming the bad text. */
static int parse_ids(const char *s, int32_t **ids, size_t *n, size_t *cap, int32_t n_vocab,
                     mf_error *err) {
    while (*s) {
        if (strchr(" \t\r\n,[]", *s)) {
            s++;
            continue;
        }
        char *end;
        errno = 0;
        long v = strtol(s, &end, 10);
        if (end == s || errno || (*end && !strchr(" \t\r\n,[]", *end))) {
            const char *e = s;
            while (*e && !strchr(" \t\r\n,[]", *e))
                e++;
            return mf_errorf(err, "'%.*s' is not a token id", (int)(e - s > 40 ? 40 : e - s), s);
        }
        if (v < 0 || v >= n_vocab)
            return mf_errorf(err, "token id %ld out of range (vocab %d)", v, n_vocab);
        if (*n == *cap)
            *ids = mf_realloc(*ids, sizeof **ids * (*cap = *cap ? *cap * 2 : 64));
        (*ids)[(*n)++] = (int32_t)v;
        s = end;
    }
    return 0;
}

int mf_cmd_detokenize(int argc, char **argv) {
    const char *cmd = "detokenize", *model = mf_default_model();
    bool render = true, newline = true;
    mf_error err = {{0}};
    int first_id = argc;
    for (int i = 1; i < argc; i++) {
        const char *v;
        int r;
        if (mf_arg_is_help(argv[i])) {
            fputs(detokenize_help, stdout);
            return 0;
        }
        if ((r = mf_arg_value(argc, argv, &i, "-m", &v, &err)) ||
            (r = mf_arg_value(argc, argv, &i, "--model", &v, &err))) {
            if (r < 0)
                return mf_arg_fail(cmd, &err);
            model = v;
        } else if (!strcmp(argv[i], "--no-special")) {
            render = false;
        } else if (!strcmp(argv[i], "--no-newline")) {
            newline = false;
        } else if (argv[i][0] == '-' && argv[i][1] && !(argv[i][1] >= '0' && argv[i][1] <= '9')) {
            mf_errorf(&err, "unknown option '%s' (see 'minfer detokenize --help')", argv[i]);
            return mf_arg_fail(cmd, &err);
        } else {
            first_id = i;
            break;
        }
    }
    mf_gguf *g;
    mf_tokenizer *t;
    if (load_tokenizer(cmd, model, &g, &t))
        return 1;
    int32_t *ids = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    if (first_id < argc) {
        for (int i = first_id; i < argc && !rc; i++)
            if (parse_ids(argv[i], &ids, &n, &cap, mf_tokenizer_n_vocab(t), &err))
                rc = 2;
    } else {
        size_t len;
        char *in = read_all("-", &len);
        if (!in) {
            fprintf(stderr, "%s: cannot read stdin\n", cmd);
            rc = 1;
        } else {
            in = mf_realloc(in, len + 1);
            in[len] = 0;
            if (parse_ids(in, &ids, &n, &cap, mf_tokenizer_n_vocab(t), &err))
                rc = 2;
            free(in);
        }
    }
    if (rc == 2) {
        fprintf(stderr, "%s: %s\n", cmd, err.msg);
    } else if (rc == 0) {
        mf_detok d;
        mf_detok_init(&d);
        d.render_special = render;
        size_t bufsz = mf_detok_max_bytes(t);
        char *buf = mf_malloc(bufsz);
        for (size_t i = 0; i < n; i++) {
            size_t l = mf_detok_push(t, &d, ids[i], buf, bufsz);
            fwrite(buf, 1, l, stdout);
        }
        size_t l = mf_detok_flush(&d, buf, bufsz);
        fwrite(buf, 1, l, stdout);
        free(buf);
        if (newline)
            fputc('\n', stdout);
    }
    free(ids);
    mf_tokenizer_free(t);
    mf_gguf_close(g);
    return rc;
}
