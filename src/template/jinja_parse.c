/* jinja_parse.c - template source -> syntax tree: a lexer that applies
 * whitespace control (-, trim_blocks, lstrip_blocks) while cutting the text
 * between tags, and a recursive-descent parser following jinja2's operator
 * precedence (or < and < not < comparisons < + - < ~ < * / // % < ** <
 * unary minus < filters and tests < postfix). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "template/jinja_impl.h"

/* ---- tokens ------------------------------------------------------------------ */

typedef enum tkind {
    T_TEXT, T_BLOCK, T_VAR, T_END, /* T_END closes a block or a variable tag */
    T_NAME, T_STR, T_INT, T_FLOAT, T_OP, T_EOF
} tkind;

typedef struct tok {
    tkind k;
    int line, col;
    const char *p; /* T_NAME / T_OP text; T_STR / T_TEXT decoded bytes */
    size_t n;
    int64_t i;
    double f;
} tok;

typedef struct lexer {
    const char *s;
    size_t n, pos;
    int line, col;
    mf_arena *a;
    tok *t;
    size_t nt, cap;
    mf_error *err;
} lexer;

static void push_tok(lexer *L, tok t) {
    if (L->nt == L->cap) {
        L->cap = L->cap ? L->cap * 2 : 256;
        L->t = mf_realloc(L->t, L->cap * sizeof *L->t);
    }
    L->t[L->nt++] = t;
}

/* Line and column (1-based) of byte offset off. */
static void where(const lexer *L, size_t off, int *line, int *col) {
    int ln = 1, c = 1;
    for (size_t i = 0; i < off && i < L->n; i++) {
        if (L->s[i] == '\n') {
            ln++;
            c = 1;
        } else {
            c++;
        }
    }
    *line = ln;
    *col = c;
}

static int lex_fail(lexer *L, size_t off, const char *what) {
    int ln, c;
    where(L, off, &ln, &c);
    return mf_errorf(L->err, "template: %d:%d: %s", ln, c, what);
}

static bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
static bool is_ident0(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
static bool is_digit(char c) { return c >= '0' && c <= '9'; }

/* Decodes a quoted string at s[i] (Python escapes); *end: past the quote. */
static int lex_string(lexer *L, size_t i, size_t *end, tok *t) {
    char q = L->s[i++];
    mf_jbuf b = {0};
    mf_jbuf_add(&b, "", 0);
    while (i < L->n && L->s[i] != q) {
        char c = L->s[i];
        if (c == '\\' && i + 1 < L->n) {
            char e = L->s[i + 1], o = 0;
            i += 2;
            switch (e) {
            case 'n': o = '\n'; break;
            case 't': o = '\t'; break;
            case 'r': o = '\r'; break;
            case '\\': o = '\\'; break;
            case '\'': o = '\''; break;
            case '"': o = '"'; break;
            case '0': o = 0; break;
            case 'u':
            case 'x': {
                int nd = e == 'u' ? 4 : 2;
                uint32_t cp = 0;
                for (int k = 0; k < nd; k++, i++) {
                    char h = i < L->n ? L->s[i] : 0;
                    int v = is_digit(h) ? h - '0' : (h >= 'a' && h <= 'f') ? h - 'a' + 10
                            : (h >= 'A' && h <= 'F') ? h - 'A' + 10 : -1;
                    if (v < 0) {
                        free(b.p);
                        return lex_fail(L, i, "bad escape in a string");
                    }
                    cp = cp * 16 + (uint32_t)v;
                }
                char u[4];
                size_t un;
                if (cp < 0x80) {
                    u[0] = (char)cp;
                    un = 1;
                } else if (cp < 0x800) {
                    u[0] = (char)(0xC0 | (cp >> 6));
                    u[1] = (char)(0x80 | (cp & 0x3F));
                    un = 2;
                } else {
                    u[0] = (char)(0xE0 | (cp >> 12));
                    u[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
                    u[2] = (char)(0x80 | (cp & 0x3F));
                    un = 3;
                }
                mf_jbuf_add(&b, u, un);
                continue;
            }
            default: /* unknown escapes stay as written, as in Python */
                mf_jbuf_add(&b, "\\", 1);
                o = e;
            }
            mf_jbuf_add(&b, &o, 1);
            continue;
        }
        mf_jbuf_add(&b, &c, 1);
        i++;
    }
    if (i >= L->n) {
        free(b.p);
        return lex_fail(L, *end, "unterminated string");
    }
    t->k = T_STR;
    t->p = mf_arena_strndup(L->a, b.p, b.n);
    t->n = b.n;
    free(b.p);
    *end = i + 1;
    return 0;
}

/* Tokens of one tag's inside, from L->pos up to its closer; kind is 'b'
 * ({% %}) or 'v' ({{ }}). Returns with L->pos past the closer and *strip_after
 * set when the closer had '-'. */
static int lex_tag(lexer *L, char kind, bool *strip_after) {
    const char close = kind == 'b' ? '%' : '}';
    size_t i = L->pos;
    for (;;) {
        while (i < L->n && is_space(L->s[i]))
            i++;
        if (i >= L->n)
            return lex_fail(L, L->pos, kind == 'b' ? "unclosed '{%'" : "unclosed '{{'");
        char c = L->s[i];
        if (c == '-' && i + 2 < L->n + 0 && L->s[i + 1] == close && L->s[i + 2] == '}') {
            *strip_after = true;
            L->pos = i + 3;
            break;
        }
        if (c == close && i + 1 < L->n && L->s[i + 1] == '}') {
            *strip_after = false;
            L->pos = i + 2;
            break;
        }
        tok t = {0};
        where(L, i, &t.line, &t.col);
        size_t j = i;
        if (is_ident0(c)) {
            while (j < L->n && (is_ident0(L->s[j]) || is_digit(L->s[j])))
                j++;
            t.k = T_NAME;
            t.p = L->s + i;
            t.n = j - i;
        } else if (is_digit(c)) {
            while (j < L->n && (is_digit(L->s[j]) || L->s[j] == '_'))
                j++;
            bool fl = false;
            if (j + 1 < L->n && L->s[j] == '.' && is_digit(L->s[j + 1])) {
                fl = true;
                j++;
                while (j < L->n && is_digit(L->s[j]))
                    j++;
            }
            if (j < L->n && (L->s[j] == 'e' || L->s[j] == 'E')) {
                size_t k = j + 1;
                if (k < L->n && (L->s[k] == '+' || L->s[k] == '-'))
                    k++;
                if (k < L->n && is_digit(L->s[k])) {
                    fl = true;
                    j = k;
                    while (j < L->n && is_digit(L->s[j]))
                        j++;
                }
            }
            char tmp[64];
            size_t l = 0;
            for (size_t k = i; k < j && l < sizeof tmp - 1; k++)
                if (L->s[k] != '_')
                    tmp[l++] = L->s[k];
            tmp[l] = 0;
            if (fl) {
                t.k = T_FLOAT;
                t.f = strtod(tmp, NULL);
            } else {
                t.k = T_INT;
                t.i = strtoll(tmp, NULL, 10);
            }
        } else if (c == '\'' || c == '"') {
            if (lex_string(L, i, &j, &t))
                return -1;
        } else {
            static const char *const ops[] = {"**", "//", "==", "!=", "<=", ">=", "+", "-", "*",
                                              "/", "%", "~", "<", ">", "=", "(", ")", "[", "]",
                                              "{", "}", ",", ".", ":", "|"};
            size_t k = 0;
            for (; k < sizeof ops / sizeof *ops; k++) {
                size_t l = strlen(ops[k]);
                if (L->n - i >= l && !memcmp(L->s + i, ops[k], l))
                    break;
            }
            if (k == sizeof ops / sizeof *ops) {
                char msg[64];
                snprintf(msg, sizeof msg, "unexpected character '%c'", c);
                return lex_fail(L, i, msg);
            }
            t.k = T_OP;
            t.p = ops[k];
            t.n = strlen(ops[k]);
            j = i + t.n;
        }
        push_tok(L, t);
        i = j;
    }
    tok e = {.k = T_END};
    where(L, L->pos, &e.line, &e.col);
    push_tok(L, e);
    return 0;
}

static int lex(lexer *L) {
    bool strip_next = false;  /* the previous tag ended with '-' */
    bool trim_next = false;   /* the previous block/comment tag: drop one newline */
    while (L->pos <= L->n) {
        /* The next tag opener. */
        size_t o = L->pos;
        char kind = 0;
        for (; o + 1 < L->n; o++)
            if (L->s[o] == '{' && (L->s[o + 1] == '{' || L->s[o + 1] == '%' || L->s[o + 1] == '#')) {
                kind = L->s[o + 1] == '{' ? 'v' : L->s[o + 1] == '%' ? 'b' : 'c';
                break;
            }
        if (!kind)
            o = L->n;
        size_t ts = L->pos, te = o;
        if (strip_next)
            while (ts < te && is_space(L->s[ts]))
                ts++;
        else if (trim_next && ts < te && L->s[ts] == '\n')
            ts++;
        else if (trim_next && ts + 1 < te && L->s[ts] == '\r' && L->s[ts + 1] == '\n')
            ts += 2;
        bool minus = kind && o + 2 < L->n && L->s[o + 2] == '-';
        bool plus = kind && o + 2 < L->n && L->s[o + 2] == '+';
        if (minus) {
            while (te > ts && is_space(L->s[te - 1]))
                te--;
        } else if ((kind == 'b' || kind == 'c') && !plus) {
            /* lstrip_blocks: spaces and tabs from the line start to the tag. */
            size_t k = te;
            while (k > ts && (L->s[k - 1] == ' ' || L->s[k - 1] == '\t'))
                k--;
            if ((k > ts && L->s[k - 1] == '\n') || (k == ts && (k == 0 || L->s[k - 1] == '\n')))
                te = k;
        }
        if (te > ts) {
            tok t = {.k = T_TEXT, .p = L->s + ts, .n = te - ts};
            where(L, ts, &t.line, &t.col);
            push_tok(L, t);
        }
        if (!kind)
            break;
        L->pos = o + 2 + (minus || plus);
        strip_next = trim_next = false;
        if (kind == 'c') {
            size_t k = L->pos;
            while (k + 1 < L->n && !(L->s[k] == '#' && L->s[k + 1] == '}'))
                k++;
            if (k + 1 >= L->n)
                return lex_fail(L, o, "unclosed comment '{#'");
            strip_next = k > L->pos && L->s[k - 1] == '-';
            trim_next = !strip_next;
            L->pos = k + 2;
            continue;
        }
        tok t = {.k = kind == 'b' ? T_BLOCK : T_VAR};
        where(L, o, &t.line, &t.col);
        push_tok(L, t);
        bool sa = false;
        if (lex_tag(L, kind, &sa))
            return -1;
        strip_next = sa;
        trim_next = !sa && kind == 'b';
    }
    tok e = {.k = T_EOF};
    where(L, L->n, &e.line, &e.col);
    push_tok(L, e);
    return 0;
}

/* ---- parser ------------------------------------------------------------------- */

typedef struct parser {
    tok *t;
    size_t nt, i;
    mf_arena *a;
    mf_error *err;
} parser;

static tok *peek(parser *P) { return &P->t[P->i]; }
static tok *peek2(parser *P) { return &P->t[P->i + 1 < P->nt ? P->i + 1 : P->i]; }

static bool is_op(const tok *t, const char *op) {
    return t->k == T_OP && t->n == strlen(op) && !memcmp(t->p, op, t->n);
}
static bool is_name(const tok *t, const char *w) {
    return t->k == T_NAME && t->n == strlen(w) && !memcmp(t->p, w, t->n);
}

static int perr(parser *P, const tok *t, const char *fmt, const char *arg) {
    char msg[256];
    snprintf(msg, sizeof msg, fmt, arg);
    return mf_errorf(P->err, "template: %d:%d: %s", t->line, t->col, msg);
}

static const char *tok_desc(parser *P, const tok *t) {
    switch (t->k) {
    case T_END: return "end of tag";
    case T_EOF: return "end of template";
    case T_TEXT: return "text";
    case T_BLOCK: return "'{%'";
    case T_VAR: return "'{{'";
    case T_STR: return "a string";
    case T_INT:
    case T_FLOAT: return "a number";
    default: return mf_arena_strndup(P->a, t->p, t->n);
    }
}

static jnode *mk(parser *P, jkind k, const tok *at) {
    jnode *n = mf_arena_alloc(P->a, sizeof *n);
    n->kind = k;
    n->line = at->line;
    n->col = at->col;
    return n;
}

typedef struct nvec {
    jnode **v;
    int n, cap;
} nvec;

static void nv_push(parser *P, nvec *v, jnode *x) {
    if (v->n == v->cap) {
        int cap = v->cap ? v->cap * 2 : 4;
        jnode **nn = mf_arena_alloc(P->a, (size_t)cap * sizeof *nn);
        if (v->n)
            memcpy(nn, v->v, (size_t)v->n * sizeof *nn);
        v->v = nn;
        v->cap = cap;
    }
    v->v[v->n++] = x;
}

static int expect_op(parser *P, const char *op) {
    if (!is_op(peek(P), op)) {
        char msg[96];
        snprintf(msg, sizeof msg, "expected '%s', found %s", op, tok_desc(P, peek(P)));
        return perr(P, peek(P), "%s", msg);
    }
    P->i++;
    return 0;
}

static const char *take_name(parser *P) {
    tok *t = peek(P);
    if (t->k != T_NAME)
        return NULL;
    P->i++;
    return mf_arena_strndup(P->a, t->p, t->n);
}

static jnode *parse_expr(parser *P, bool allow_cond);
static jnode *parse_or(parser *P);
static jnode *parse_unary(parser *P, bool with_filter);

/* Call arguments after '(' up to ')': positional then name=value. */
static int parse_args(parser *P, jnode *n) {
    nvec pos = {0}, kwv = {0};
    const char **kwn = NULL;
    int nkw = 0, capkw = 0;
    while (!is_op(peek(P), ")")) {
        if (peek(P)->k == T_NAME && is_op(peek2(P), "=")) {
            const char *k = take_name(P);
            P->i++;
            jnode *v = parse_expr(P, true);
            if (!v)
                return -1;
            if (nkw == capkw) {
                capkw = capkw ? capkw * 2 : 4;
                const char **nk = mf_arena_alloc(P->a, (size_t)capkw * sizeof *nk);
                if (nkw)
                    memcpy(nk, kwn, (size_t)nkw * sizeof *nk);
                kwn = nk;
            }
            kwn[nkw++] = k;
            nv_push(P, &kwv, v);
        } else {
            jnode *v = parse_expr(P, true);
            if (!v)
                return -1;
            nv_push(P, &pos, v);
        }
        if (is_op(peek(P), ","))
            P->i++;
        else if (!is_op(peek(P), ")"))
            return perr(P, peek(P), "expected ',' or ')' in arguments, found %s", tok_desc(P, peek(P)));
    }
    P->i++;
    n->args = pos.v;
    n->n_args = pos.n;
    n->kwn = kwn;
    n->kwv = kwv.v;
    n->n_kw = nkw;
    return 0;
}

static jnode *parse_primary(parser *P) {
    tok *t = peek(P);
    jnode *n;
    if (t->k == T_NAME) {
        P->i++;
        if (is_name(t, "true") || is_name(t, "True") || is_name(t, "false") || is_name(t, "False")) {
            n = mk(P, J_LIT, t);
            n->lit = mf_jv_bool(t->p[0] == 't' || t->p[0] == 'T');
        } else if (is_name(t, "none") || is_name(t, "None")) {
            n = mk(P, J_LIT, t);
            n->lit = mf_jv_none();
        } else {
            n = mk(P, J_NAME, t);
            n->name = mf_arena_strndup(P->a, t->p, t->n);
        }
        return n;
    }
    if (t->k == T_STR) {
        /* Adjacent literals concatenate, as in Python. */
        mf_jbuf b = {0};
        mf_jbuf_add(&b, "", 0);
        while (peek(P)->k == T_STR) {
            mf_jbuf_add(&b, peek(P)->p, peek(P)->n);
            P->i++;
        }
        n = mk(P, J_LIT, t);
        n->lit = mf_jv_str(P->a, b.p, b.n);
        free(b.p);
        return n;
    }
    if (t->k == T_INT || t->k == T_FLOAT) {
        P->i++;
        n = mk(P, J_LIT, t);
        n->lit = t->k == T_INT ? mf_jv_int(t->i) : mf_jv_float(t->f);
        return n;
    }
    if (is_op(t, "(")) {
        P->i++;
        jnode *e = parse_expr(P, true);
        if (!e)
            return NULL;
        if (is_op(peek(P), ",")) { /* a tuple: a list to us */
            nvec items = {0};
            nv_push(P, &items, e);
            while (is_op(peek(P), ",")) {
                P->i++;
                if (is_op(peek(P), ")"))
                    break;
                jnode *x = parse_expr(P, true);
                if (!x)
                    return NULL;
                nv_push(P, &items, x);
            }
            e = mk(P, J_LISTLIT, t);
            e->args = items.v;
            e->n_args = items.n;
        }
        return expect_op(P, ")") ? NULL : e;
    }
    if (is_op(t, "[")) {
        P->i++;
        nvec items = {0};
        while (!is_op(peek(P), "]")) {
            jnode *x = parse_expr(P, true);
            if (!x)
                return NULL;
            nv_push(P, &items, x);
            if (is_op(peek(P), ","))
                P->i++;
            else if (!is_op(peek(P), "]"))
                return perr(P, peek(P), "expected ',' or ']' in a list, found %s", tok_desc(P, peek(P))), NULL;
        }
        P->i++;
        n = mk(P, J_LISTLIT, t);
        n->args = items.v;
        n->n_args = items.n;
        return n;
    }
    if (is_op(t, "{")) {
        P->i++;
        nvec keys = {0}, vals = {0};
        while (!is_op(peek(P), "}")) {
            jnode *k = parse_expr(P, true);
            if (!k || expect_op(P, ":"))
                return NULL;
            jnode *v = parse_expr(P, true);
            if (!v)
                return NULL;
            nv_push(P, &keys, k);
            nv_push(P, &vals, v);
            if (is_op(peek(P), ","))
                P->i++;
            else if (!is_op(peek(P), "}"))
                return perr(P, peek(P), "expected ',' or '}' in a dict, found %s", tok_desc(P, peek(P))), NULL;
        }
        P->i++;
        n = mk(P, J_DICTLIT, t);
        n->args = keys.v;
        n->n_args = keys.n;
        n->kwv = vals.v;
        n->n_kw = vals.n;
        return n;
    }
    perr(P, t, "expected an expression, found %s", tok_desc(P, t));
    return NULL;
}

static jnode *parse_postfix(parser *P, jnode *n) {
    for (;;) {
        tok *t = peek(P);
        if (is_op(t, ".")) {
            P->i++;
            tok *nt = peek(P);
            jnode *x = mk(P, J_ATTR, t);
            x->a = n;
            if (nt->k == T_NAME) {
                x->name = take_name(P);
            } else if (nt->k == T_INT) { /* x.0 is x[0] */
                P->i++;
                x->kind = J_ITEM;
                x->b = mk(P, J_LIT, nt);
                x->b->lit = mf_jv_int(nt->i);
            } else {
                perr(P, nt, "expected an attribute name after '.', found %s", tok_desc(P, nt));
                return NULL;
            }
            n = x;
        } else if (is_op(t, "[")) {
            P->i++;
            jnode *parts[3] = {0};
            int np = 0;
            bool slice = false;
            for (;;) {
                if (is_op(peek(P), ":")) {
                    slice = true;
                    P->i++;
                    np++;
                    if (np > 2) {
                        perr(P, peek(P), "too many ':' in a slice%s", "");
                        return NULL;
                    }
                    continue;
                }
                if (is_op(peek(P), "]"))
                    break;
                jnode *x = parse_expr(P, true);
                if (!x)
                    return NULL;
                parts[np] = x;
                if (!is_op(peek(P), ":") && !is_op(peek(P), "]")) {
                    perr(P, peek(P), "expected ']' found %s", tok_desc(P, peek(P)));
                    return NULL;
                }
            }
            P->i++;
            jnode *x = mk(P, slice ? J_SLICE : J_ITEM, t);
            x->a = n;
            if (slice) {
                x->b = parts[0];
                x->c = parts[1];
                x->d = parts[2];
            } else {
                if (!parts[0]) {
                    perr(P, t, "empty subscript%s", "");
                    return NULL;
                }
                x->b = parts[0];
            }
            n = x;
        } else if (is_op(t, "(")) {
            P->i++;
            jnode *x = mk(P, J_CALL, t);
            x->a = n;
            if (parse_args(P, x))
                return NULL;
            n = x;
        } else {
            return n;
        }
    }
}

static bool ends_test_arg(const tok *t) {
    static const char *const kw[] = {"and", "or", "else", "if", "in", "is", "not", "for", "recursive"};
    if (t->k == T_STR || t->k == T_INT || t->k == T_FLOAT)
        return false;
    if (t->k != T_NAME)
        return true;
    for (size_t k = 0; k < sizeof kw / sizeof *kw; k++)
        if (is_name(t, kw[k]))
            return true;
    return false;
}

/* Filters (| name(args)) and tests (is [not] name args) after a unary. */
static jnode *parse_filters(parser *P, jnode *n) {
    for (;;) {
        tok *t = peek(P);
        if (is_op(t, "|")) {
            P->i++;
            jnode *x = mk(P, J_FILTER, peek(P));
            x->a = n;
            if (!(x->name = take_name(P))) {
                perr(P, peek(P), "expected a filter name after '|', found %s", tok_desc(P, peek(P)));
                return NULL;
            }
            /* dotted filter names do not occur in chat templates */
            if (is_op(peek(P), "(")) {
                P->i++;
                if (parse_args(P, x))
                    return NULL;
            }
            n = x;
        } else if (is_name(t, "is")) {
            P->i++;
            jnode *x = mk(P, J_TEST, t);
            x->a = n;
            if (is_name(peek(P), "not")) {
                P->i++;
                x->op = 1;
            }
            tok *nt = peek(P);
            if (is_name(nt, "none") || is_name(nt, "true") || is_name(nt, "false")) {
                P->i++;
                x->name = mf_arena_strndup(P->a, nt->p, nt->n);
            } else if (!(x->name = take_name(P))) {
                perr(P, nt, "expected a test name after 'is', found %s", tok_desc(P, nt));
                return NULL;
            }
            if (is_op(peek(P), "(")) {
                P->i++;
                if (parse_args(P, x))
                    return NULL;
            } else if (!ends_test_arg(peek(P)) && peek(P)->k != T_END && peek(P)->k != T_OP) {
                jnode *arg = parse_unary(P, false);
                if (!arg)
                    return NULL;
                x->args = mf_arena_alloc(P->a, sizeof *x->args);
                x->args[0] = arg;
                x->n_args = 1;
            }
            n = x;
        } else {
            return n;
        }
    }
}

static jnode *parse_unary(parser *P, bool with_filter) {
    tok *t = peek(P);
    jnode *n;
    if (is_op(t, "-") || is_op(t, "+")) {
        P->i++;
        jnode *x = parse_unary(P, false);
        if (!x)
            return NULL;
        if (is_op(t, "+")) {
            n = x;
        } else {
            n = mk(P, J_NEG, t);
            n->a = x;
        }
    } else {
        n = parse_primary(P);
        if (!n)
            return NULL;
        n = parse_postfix(P, n);
        if (!n)
            return NULL;
    }
    return with_filter ? parse_filters(P, n) : n;
}

static jnode *bin(parser *P, const tok *t, int op, jnode *a, jnode *b) {
    jnode *n = mk(P, J_BIN, t);
    n->op = op;
    n->a = a;
    n->b = b;
    return n;
}

static jnode *parse_pow(parser *P) {
    jnode *a = parse_unary(P, true);
    while (a && is_op(peek(P), "**")) {
        tok *t = peek(P);
        P->i++;
        jnode *b = parse_unary(P, true);
        a = b ? bin(P, t, OP_POW, a, b) : NULL;
    }
    return a;
}

static jnode *parse_mul(parser *P) {
    jnode *a = parse_pow(P);
    for (;;) {
        tok *t = peek(P);
        int op = is_op(t, "*") ? OP_MUL : is_op(t, "/") ? OP_DIV : is_op(t, "//") ? OP_FDIV
                 : is_op(t, "%") ? OP_MOD : 0;
        if (!a || !op)
            return a;
        P->i++;
        jnode *b = parse_pow(P);
        a = b ? bin(P, t, op, a, b) : NULL;
    }
}

static jnode *parse_cat(parser *P) {
    jnode *a = parse_mul(P);
    while (a && is_op(peek(P), "~")) {
        tok *t = peek(P);
        P->i++;
        jnode *b = parse_mul(P);
        a = b ? bin(P, t, OP_CAT, a, b) : NULL;
    }
    return a;
}

static jnode *parse_add(parser *P) {
    jnode *a = parse_cat(P);
    for (;;) {
        tok *t = peek(P);
        int op = is_op(t, "+") ? OP_ADD : is_op(t, "-") ? OP_SUB : 0;
        if (!a || !op)
            return a;
        P->i++;
        jnode *b = parse_cat(P);
        a = b ? bin(P, t, op, a, b) : NULL;
    }
}

static jnode *parse_compare(parser *P) {
    jnode *a = parse_add(P);
    for (;;) {
        tok *t = peek(P);
        int op = is_op(t, "==") ? OP_EQ : is_op(t, "!=") ? OP_NE : is_op(t, "<") ? OP_LT
                 : is_op(t, "<=") ? OP_LE : is_op(t, ">") ? OP_GT : is_op(t, ">=") ? OP_GE
                 : is_name(t, "in") ? OP_IN : 0;
        if (!op && is_name(t, "not") && is_name(peek2(P), "in")) {
            op = OP_NOTIN;
            P->i++;
        }
        if (!a || !op)
            return a;
        P->i++;
        jnode *b = parse_add(P);
        a = b ? bin(P, t, op, a, b) : NULL;
    }
}

static jnode *parse_not(parser *P) {
    tok *t = peek(P);
    if (is_name(t, "not")) {
        P->i++;
        jnode *x = parse_not(P);
        if (!x)
            return NULL;
        jnode *n = mk(P, J_NOT, t);
        n->a = x;
        return n;
    }
    return parse_compare(P);
}

static jnode *parse_and(parser *P) {
    jnode *a = parse_not(P);
    while (a && is_name(peek(P), "and")) {
        tok *t = peek(P);
        P->i++;
        jnode *b = parse_not(P);
        if (!b)
            return NULL;
        jnode *n = mk(P, J_AND, t);
        n->a = a;
        n->b = b;
        a = n;
    }
    return a;
}

static jnode *parse_or(parser *P) {
    jnode *a = parse_and(P);
    while (a && is_name(peek(P), "or")) {
        tok *t = peek(P);
        P->i++;
        jnode *b = parse_and(P);
        if (!b)
            return NULL;
        jnode *n = mk(P, J_OR, t);
        n->a = a;
        n->b = b;
        a = n;
    }
    return a;
}

static jnode *parse_expr(parser *P, bool allow_cond) {
    jnode *a = parse_or(P);
    while (a && allow_cond && is_name(peek(P), "if")) {
        tok *t = peek(P);
        P->i++;
        jnode *cond = parse_or(P);
        if (!cond)
            return NULL;
        jnode *n = mk(P, J_COND, t);
        n->a = cond;
        n->b = a;
        if (is_name(peek(P), "else")) {
            P->i++;
            if (!(n->c = parse_expr(P, true)))
                return NULL;
        }
        a = n;
    }
    return a;
}

/* ---- statements ------------------------------------------------------------------ */

static int expect_end(parser *P, const char *tag) {
    if (peek(P)->k != T_END) {
        char msg[128];
        snprintf(msg, sizeof msg, "expected the end of '%s', found %s", tag, tok_desc(P, peek(P)));
        return perr(P, peek(P), "%s", msg);
    }
    P->i++;
    return 0;
}

/* Parses statements until a block tag whose name is one of ends (NULL
 * terminated; ends NULL: until the end of the template). *which: the index
 * of the end tag met; the parser stands after its name. */
static int parse_body(parser *P, const char *const *ends, nvec *out, int *which, const tok *opener);

static int parse_names(parser *P, const char ***names, int *n) {
    int cap = 4;
    *names = mf_arena_alloc(P->a, (size_t)cap * sizeof **names);
    *n = 0;
    for (;;) {
        const char *nm = take_name(P);
        if (!nm)
            return perr(P, peek(P), "expected a name, found %s", tok_desc(P, peek(P)));
        if (*n == cap)
            return perr(P, peek(P), "more than 4 targets%s", "");
        (*names)[(*n)++] = nm;
        if (!is_op(peek(P), ","))
            return 0;
        P->i++;
    }
}

/* Macro parameters after the '(' up to and including the ')': names in
 * n->kwn, defaults (NULL = required) in n->kwv. */
static int parse_params(parser *P, jnode *n) {
    nvec defs = {0};
    int cap = 0;
    while (!is_op(peek(P), ")")) {
        const char *pn = take_name(P);
        if (!pn) {
            perr(P, peek(P), "expected a parameter name, found %s", tok_desc(P, peek(P)));
            return -1;
        }
        jnode *def = NULL;
        if (is_op(peek(P), "=")) {
            P->i++;
            if (!(def = parse_expr(P, true)))
                return -1;
        }
        if (n->n_kw == cap) {
            cap = cap ? cap * 2 : 4;
            const char **nk = mf_arena_alloc(P->a, (size_t)cap * sizeof *nk);
            if (n->n_kw)
                memcpy(nk, n->kwn, (size_t)n->n_kw * sizeof *nk);
            n->kwn = nk;
        }
        n->kwn[n->n_kw++] = pn;
        nv_push(P, &defs, def);
        if (is_op(peek(P), ","))
            P->i++;
        else if (!is_op(peek(P), ")")) {
            perr(P, peek(P), "expected ',' or ')' in macro parameters, found %s", tok_desc(P, peek(P)));
            return -1;
        }
    }
    P->i++;
    n->kwv = defs.v;
    return 0;
}

static jnode *parse_stmt(parser *P, tok *at) {
    tok *t = peek(P);
    if (t->k != T_NAME) {
        perr(P, t, "expected a tag name, found %s", tok_desc(P, t));
        return NULL;
    }
    jnode *n;
    int which;
    nvec body = {0}, els = {0};
    if (is_name(t, "if") || is_name(t, "elif")) {
        P->i++;
        n = mk(P, J_IF, at);
        if (!(n->a = parse_expr(P, true)) || expect_end(P, "if"))
            return NULL;
        static const char *const ends[] = {"elif", "else", "endif", NULL};
        if (parse_body(P, ends, &body, &which, at))
            return NULL;
        n->body = body.v;
        n->n_body = body.n;
        if (which == 0) {
            P->i--; /* re-read "elif" as a nested if */
            tok *et = peek(P);
            jnode *sub = parse_stmt(P, et);
            if (!sub)
                return NULL;
            nv_push(P, &els, sub);
        } else if (which == 1) {
            if (expect_end(P, "else"))
                return NULL;
            static const char *const ends2[] = {"endif", NULL};
            if (parse_body(P, ends2, &els, &which, at) || expect_end(P, "endif"))
                return NULL;
        } else if (expect_end(P, "endif")) {
            return NULL;
        }
        n->els = els.v;
        n->n_els = els.n;
        return n;
    }
    if (is_name(t, "for")) {
        P->i++;
        n = mk(P, J_FOR, at);
        if (parse_names(P, &n->names, &n->n_names))
            return NULL;
        if (!is_name(peek(P), "in")) {
            perr(P, peek(P), "expected 'in' in a for tag, found %s", tok_desc(P, peek(P)));
            return NULL;
        }
        P->i++;
        if (!(n->b = parse_expr(P, false)))
            return NULL;
        if (is_name(peek(P), "if")) {
            P->i++;
            if (!(n->c = parse_expr(P, false)))
                return NULL;
        }
        if (is_name(peek(P), "recursive")) {
            P->i++;
            n->op = 1;
        }
        if (expect_end(P, "for"))
            return NULL;
        static const char *const ends[] = {"else", "endfor", NULL};
        if (parse_body(P, ends, &body, &which, at) || expect_end(P, which ? "endfor" : "else"))
            return NULL;
        if (which == 0) {
            static const char *const ends2[] = {"endfor", NULL};
            if (parse_body(P, ends2, &els, &which, at) || expect_end(P, "endfor"))
                return NULL;
        }
        n->body = body.v;
        n->n_body = body.n;
        n->els = els.v;
        n->n_els = els.n;
        return n;
    }
    if (is_name(t, "set")) {
        P->i++;
        n = mk(P, J_SET, at);
        if (peek(P)->k == T_NAME && is_op(peek2(P), ".")) {
            tok *nt = peek(P);
            jnode *obj = mk(P, J_NAME, nt);
            obj->name = take_name(P);
            P->i++;
            jnode *tgt = mk(P, J_ATTR, nt);
            tgt->a = obj;
            if (!(tgt->name = take_name(P))) {
                perr(P, peek(P), "expected an attribute name, found %s", tok_desc(P, peek(P)));
                return NULL;
            }
            n->a = tgt;
        } else if (parse_names(P, &n->names, &n->n_names)) {
            return NULL;
        }
        if (peek(P)->k == T_END && !n->a && n->n_names == 1) {
            P->i++;
            n->kind = J_SETBLOCK;
            static const char *const ends[] = {"endset", NULL};
            if (parse_body(P, ends, &body, &which, at) || expect_end(P, "endset"))
                return NULL;
            n->body = body.v;
            n->n_body = body.n;
            return n;
        }
        if (expect_op(P, "="))
            return NULL;
        if (!(n->b = parse_expr(P, true)))
            return NULL;
        if (is_op(peek(P), ",")) { /* set a, b = x, y */
            jnode *l = mk(P, J_LISTLIT, t);
            nvec items = {0};
            nv_push(P, &items, n->b);
            while (is_op(peek(P), ",")) {
                P->i++;
                jnode *x = parse_expr(P, true);
                if (!x)
                    return NULL;
                nv_push(P, &items, x);
            }
            l->args = items.v;
            l->n_args = items.n;
            n->b = l;
        }
        return expect_end(P, "set") ? NULL : n;
    }
    if (is_name(t, "macro")) {
        P->i++;
        n = mk(P, J_MACRO, at);
        if (!(n->name = take_name(P)) || expect_op(P, "("))
            return n->name ? NULL : (perr(P, peek(P), "expected a macro name, found %s", tok_desc(P, peek(P))), NULL);
        if (parse_params(P, n))
            return NULL;
        if (expect_end(P, "macro"))
            return NULL;
        static const char *const ends[] = {"endmacro", NULL};
        if (parse_body(P, ends, &body, &which, at) || expect_end(P, "endmacro"))
            return NULL;
        n->body = body.v;
        n->n_body = body.n;
        return n;
    }
    if (is_name(t, "call")) {
        P->i++;
        n = mk(P, J_CALLBLOCK, at);
        jnode *caller = mk(P, J_MACRO, at);
        caller->name = "caller";
        if (is_op(peek(P), "(")) {
            P->i++;
            if (parse_params(P, caller))
                return NULL;
        }
        if (!(n->a = parse_expr(P, false)))
            return NULL;
        if (n->a->kind != J_CALL) {
            perr(P, peek(P), "a call block needs a macro call, as in {%% call m(x) %%}%s", "");
            return NULL;
        }
        if (expect_end(P, "call"))
            return NULL;
        static const char *const ends[] = {"endcall", NULL};
        if (parse_body(P, ends, &body, &which, at) || expect_end(P, "endcall"))
            return NULL;
        caller->body = body.v;
        caller->n_body = body.n;
        n->d = caller;
        return n;
    }
    if (is_name(t, "break") || is_name(t, "continue")) {
        P->i++;
        n = mk(P, is_name(t, "break") ? J_BREAK : J_CONTINUE, at);
        return expect_end(P, "break") ? NULL : n;
    }
    if (is_name(t, "generation")) {
        P->i++;
        n = mk(P, J_BLOCK, at);
        static const char *const ends[] = {"endgeneration", NULL};
        if (expect_end(P, "generation") || parse_body(P, ends, &body, &which, at) ||
            expect_end(P, "endgeneration"))
            return NULL;
        n->body = body.v;
        n->n_body = body.n;
        return n;
    }
    perr(P, t, "unknown tag '%s'", mf_arena_strndup(P->a, t->p, t->n));
    return NULL;
}

static int parse_body(parser *P, const char *const *ends, nvec *out, int *which, const tok *opener) {
    for (;;) {
        tok *t = peek(P);
        if (t->k == T_EOF) {
            if (!ends)
                return 0;
            char msg[128];
            snprintf(msg, sizeof msg, "unclosed block: expected '%s' before the end of the template",
                     ends[0]);
            return mf_errorf(P->err, "template: %d:%d: %s", opener->line, opener->col, msg);
        }
        if (t->k == T_TEXT) {
            P->i++;
            jnode *n = mk(P, J_TEXT, t);
            n->lit = mf_jv_str(P->a, t->p, t->n);
            nv_push(P, out, n);
            continue;
        }
        if (t->k == T_VAR) {
            P->i++;
            jnode *n = mk(P, J_OUT, t);
            if (!(n->a = parse_expr(P, true)))
                return -1;
            if (peek(P)->k != T_END)
                return perr(P, peek(P), "expected '}}', found %s", tok_desc(P, peek(P)));
            P->i++;
            nv_push(P, out, n);
            continue;
        }
        if (t->k != T_BLOCK)
            return perr(P, t, "unexpected %s", tok_desc(P, t));
        tok *nt = peek2(P);
        for (int k = 0; ends && ends[k]; k++)
            if (is_name(nt, ends[k])) {
                P->i += 2;
                *which = k;
                return 0;
            }
        if (nt->k == T_NAME && (is_name(nt, "endif") || is_name(nt, "endfor") || is_name(nt, "else") ||
                                is_name(nt, "elif") || is_name(nt, "endmacro") || is_name(nt, "endset") ||
                                is_name(nt, "endcall")))
            return perr(P, nt, "unexpected '%s'", mf_arena_strndup(P->a, nt->p, nt->n));
        P->i++;
        jnode *n = parse_stmt(P, t);
        if (!n)
            return -1;
        nv_push(P, out, n);
    }
}

int mf_jinja_parse(const char *src, size_t len, mf_jinja **out, mf_error *err) {
    *out = NULL;
    /* jinja2 drops one trailing newline of the source (keep_trailing_newline off). */
    if (len && src[len - 1] == '\n')
        len -= len > 1 && src[len - 2] == '\r' ? 2 : 1;
    mf_arena *a = mf_arena_new();
    lexer L = {.s = src, .n = len, .a = a, .err = err};
    if (lex(&L)) {
        free(L.t);
        mf_arena_free(a);
        return -1;
    }
    parser P = {.t = L.t, .nt = L.nt, .a = a, .err = err};
    nvec body = {0};
    int which = 0;
    int rc = parse_body(&P, NULL, &body, &which, &L.t[0]);
    free(L.t);
    if (rc) {
        mf_arena_free(a);
        return -1;
    }
    mf_jinja *t = mf_calloc(1, sizeof *t);
    t->arena = a;
    t->body = body.v;
    t->n_body = body.n;
    *out = t;
    return 0;
}

void mf_jinja_free(mf_jinja *t) {
    if (!t)
        return;
    mf_arena_free(t->arena);
    free(t);
}
