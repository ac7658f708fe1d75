/* gbnf.c - GBNF text -> compiled grammar. Repetitions and groups become
 * generated rules (x* -> R ::= x R | ; x{m,n} -> m copies then nested
 * optionals, so a count is matched one way only). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar_impl.h"

typedef struct seq {
    gel *v;
    int32_t n, cap;
} seq;

typedef struct prule {
    char *name;
    seq *alts;
    int32_t n_alts, cap_alts;
    bool defined;
    int line, col; /* first reference, for "undefined rule" */
} prule;

typedef struct gparser {
    const char *s;
    size_t n, i;
    prule *rules;
    int32_t n_rules, cap_rules;
    uint32_t *ranges;
    int32_t n_ranges, cap_ranges;
    gclass *classes;
    int32_t n_classes, cap_classes;
    int n_gen;
    mf_error *err;
} gparser;

static void where(const gparser *P, size_t off, int *line, int *col) {
    int l = 1, c = 1;
    for (size_t k = 0; k < off && k < P->n; k++) {
        if (P->s[k] == '\n') {
            l++;
            c = 1;
        } else {
            c++;
        }
    }
    *line = l;
    *col = c;
}

static int fail_at(gparser *P, size_t off, const char *what) {
    int l, c;
    where(P, off, &l, &c);
    return mf_errorf(P->err, "grammar: %d:%d: %s", l, c, what);
}

static void seq_push(seq *q, gel e) {
    if (q->n == q->cap) {
        q->cap = q->cap ? q->cap * 2 : 8;
        q->v = mf_realloc(q->v, (size_t)q->cap * sizeof *q->v);
    }
    q->v[q->n++] = e;
}

static void rule_add_alt(prule *r, seq q) {
    if (r->n_alts == r->cap_alts) {
        r->cap_alts = r->cap_alts ? r->cap_alts * 2 : 4;
        r->alts = mf_realloc(r->alts, (size_t)r->cap_alts * sizeof *r->alts);
    }
    r->alts[r->n_alts++] = q;
}

static int32_t rule_id(gparser *P, const char *name, size_t len, size_t at) {
    for (int32_t i = 0; i < P->n_rules; i++)
        if (strlen(P->rules[i].name) == len && !memcmp(P->rules[i].name, name, len))
            return i;
    if (P->n_rules == P->cap_rules) {
        P->cap_rules = P->cap_rules ? P->cap_rules * 2 : 16;
        P->rules = mf_realloc(P->rules, (size_t)P->cap_rules * sizeof *P->rules);
    }
    prule *r = &P->rules[P->n_rules];
    memset(r, 0, sizeof *r);
    r->name = mf_malloc(len + 1);
    memcpy(r->name, name, len);
    r->name[len] = 0;
    where(P, at, &r->line, &r->col);
    return P->n_rules++;
}

static int32_t new_rule(gparser *P) {
    char nm[32];
    snprintf(nm, sizeof nm, "_gen%d", P->n_gen++);
    int32_t id = rule_id(P, nm, strlen(nm), P->i);
    P->rules[id].defined = true;
    return id;
}

static int32_t add_class(gparser *P, const uint32_t *r, int32_t n, bool neg) {
    if (P->n_ranges + 2 * n > P->cap_ranges) {
        P->cap_ranges = (P->n_ranges + 2 * n) * 2 + 16;
        P->ranges = mf_realloc(P->ranges, (size_t)P->cap_ranges * sizeof *P->ranges);
    }
    memcpy(P->ranges + P->n_ranges, r, (size_t)n * 2 * sizeof *r);
    if (P->n_classes == P->cap_classes) {
        P->cap_classes = P->cap_classes ? P->cap_classes * 2 : 32;
        P->classes = mf_realloc(P->classes, (size_t)P->cap_classes * sizeof *P->classes);
    }
    P->classes[P->n_classes] = (gclass){.off = P->n_ranges, .n = n, .neg = neg};
    P->n_ranges += 2 * n;
    return P->n_classes++;
}

/* Spaces, tabs, comments; newlines too when nested (inside parentheses or
 * after '|'). */
static void skip_space(gparser *P, bool newlines) {
    while (P->i < P->n) {
        char c = P->s[P->i];
        if (c == ' ' || c == '\t' || (newlines && (c == '\n' || c == '\r'))) {
            P->i++;
        } else if (c == '#') {
            while (P->i < P->n && P->s[P->i] != '\n')
                P->i++;
        } else {
            break;
        }
    }
}

static bool name_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_';
}

static int hexval(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* One character of a literal or class at P->i (escapes, UTF-8). */
static int parse_char(gparser *P, uint32_t *cp) {
    size_t at = P->i;
    unsigned char c = (unsigned char)P->s[P->i];
    if (c == '\\') {
        if (P->i + 1 >= P->n)
            return fail_at(P, at, "unfinished escape");
        char e = P->s[P->i + 1];
        P->i += 2;
        switch (e) {
        case 'n': *cp = '\n'; return 0;
        case 't': *cp = '\t'; return 0;
        case 'r': *cp = '\r'; return 0;
        case '\\': *cp = '\\'; return 0;
        case '"': *cp = '"'; return 0;
        case '\'': *cp = '\''; return 0;
        case '[': *cp = '['; return 0;
        case ']': *cp = ']'; return 0;
        case '-': *cp = '-'; return 0;
        case '^': *cp = '^'; return 0;
        case '/': *cp = '/'; return 0;
        case 'x':
        case 'u':
        case 'U': {
            int nd = e == 'x' ? 2 : e == 'u' ? 4 : 8;
            uint32_t v = 0;
            for (int k = 0; k < nd; k++) {
                int h = P->i < P->n ? hexval(P->s[P->i]) : -1;
                if (h < 0)
                    return fail_at(P, at, "bad hex escape");
                v = v * 16 + (uint32_t)h;
                P->i++;
            }
            if (v > 0x10FFFF)
                return fail_at(P, at, "escape beyond U+10FFFF");
            *cp = v;
            return 0;
        }
        default: {
            char msg[48];
            snprintf(msg, sizeof msg, "unknown escape '\\%c'", e);
            return fail_at(P, at, msg);
        }
        }
    }
    int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (!len || P->i + (size_t)len > P->n)
        return fail_at(P, at, "invalid UTF-8 in the grammar");
    uint32_t v = len == 1 ? c : len == 2 ? c & 0x1F : len == 3 ? c & 0x0F : c & 0x07;
    for (int k = 1; k < len; k++) {
        unsigned char d = (unsigned char)P->s[P->i + (size_t)k];
        if ((d & 0xC0) != 0x80)
            return fail_at(P, at, "invalid UTF-8 in the grammar");
        v = (v << 6) | (d & 0x3F);
    }
    P->i += (size_t)len;
    *cp = v;
    return 0;
}

static int parse_alternates(gparser *P, int32_t rule, bool nested);

/* Moves q->v[from ..) into a new rule's single alternative; returns it. */
static int32_t span_to_rule(gparser *P, seq *q, int32_t from) {
    int32_t r = new_rule(P);
    seq body = {0};
    for (int32_t k = from; k < q->n; k++)
        seq_push(&body, q->v[k]);
    rule_add_alt(&P->rules[r], body);
    q->n = from;
    return r;
}

/* x* as a rule: R ::= x R | (empty). */
static int32_t star_rule(gparser *P, int32_t x) {
    int32_t r = new_rule(P);
    seq a = {0}, b = {0};
    seq_push(&a, (gel){GE_REF, x});
    seq_push(&a, (gel){GE_REF, r});
    rule_add_alt(&P->rules[r], a);
    rule_add_alt(&P->rules[r], b);
    return r;
}

/* Up to k more x: O_k ::= x O_{k-1} | (empty). */
static int32_t upto_rule(gparser *P, int32_t x, int k) {
    int32_t prev = -1;
    for (int i = 1; i <= k; i++) {
        int32_t r = new_rule(P);
        seq a = {0}, b = {0};
        seq_push(&a, (gel){GE_REF, x});
        if (prev >= 0)
            seq_push(&a, (gel){GE_REF, prev});
        rule_add_alt(&P->rules[r], a);
        rule_add_alt(&P->rules[r], b);
        prev = r;
    }
    return prev;
}

static int parse_int(gparser *P, int *out) {
    if (P->i >= P->n || P->s[P->i] < '0' || P->s[P->i] > '9')
        return fail_at(P, P->i, "expected a number in {m,n}");
    long v = 0;
    while (P->i < P->n && P->s[P->i] >= '0' && P->s[P->i] <= '9') {
        v = v * 10 + (P->s[P->i++] - '0');
        if (v > 10000)
            return fail_at(P, P->i, "repetition count over 10000");
    }
    *out = (int)v;
    return 0;
}

static int parse_sequence(gparser *P, seq *q, bool nested) {
    for (;;) {
        skip_space(P, nested);
        if (P->i >= P->n)
            return 0;
        char c = P->s[P->i];
        size_t at = P->i;
        int32_t start = q->n;
        if (c == '"') {
            P->i++;
            while (P->i < P->n && P->s[P->i] != '"') {
                if (P->s[P->i] == '\n')
                    return fail_at(P, at, "unterminated string literal");
                uint32_t cp, rg[2];
                if (parse_char(P, &cp))
                    return -1;
                rg[0] = rg[1] = cp;
                seq_push(q, (gel){GE_CHAR, add_class(P, rg, 1, false)});
            }
            if (P->i >= P->n)
                return fail_at(P, at, "unterminated string literal");
            P->i++;
            if (q->n == start) { /* "" matches the empty string */
                seq e = {0};
                int32_t r = new_rule(P);
                rule_add_alt(&P->rules[r], e);
                seq_push(q, (gel){GE_REF, r});
            }
        } else if (c == '[') {
            P->i++;
            bool neg = P->i < P->n && P->s[P->i] == '^';
            if (neg)
                P->i++;
            uint32_t rg[512];
            int32_t nr = 0;
            while (P->i < P->n && P->s[P->i] != ']') {
                if (P->s[P->i] == '\n')
                    return fail_at(P, at, "expected ']' to close the character class");
                uint32_t lo, hi;
                if (parse_char(P, &lo))
                    return -1;
                hi = lo;
                if (P->i + 1 < P->n && P->s[P->i] == '-' && P->s[P->i + 1] != ']') {
                    P->i++;
                    if (parse_char(P, &hi))
                        return -1;
                    if (hi < lo)
                        return fail_at(P, at, "character range with its end before its start");
                }
                if (nr >= 256)
                    return fail_at(P, at, "character class of more than 256 ranges");
                rg[2 * nr] = lo;
                rg[2 * nr + 1] = hi;
                nr++;
            }
            if (P->i >= P->n)
                return fail_at(P, at, "expected ']' to close the character class");
            P->i++;
            if (!nr && !neg)
                return fail_at(P, at, "empty character class");
            seq_push(q, (gel){GE_CHAR, add_class(P, rg, nr, neg)});
        } else if (c == '.') {
            P->i++;
            uint32_t rg[2] = {'\n', '\n'}; /* any character but a newline, as in llama.cpp */
            seq_push(q, (gel){GE_CHAR, add_class(P, rg, 1, true)});
        } else if (c == '(') {
            P->i++;
            int32_t r = new_rule(P);
            if (parse_alternates(P, r, true))
                return -1;
            skip_space(P, true);
            if (P->i >= P->n || P->s[P->i] != ')')
                return fail_at(P, at, "expected ')' to close the group");
            P->i++;
            seq_push(q, (gel){GE_REF, r});
        } else if (name_char(c)) {
            size_t j = P->i;
            while (j < P->n && name_char(P->s[j]))
                j++;
            /* "name ::=" starts the next rule: this sequence ends here. */
            size_t k = j;
            while (k < P->n && (P->s[k] == ' ' || P->s[k] == '\t'))
                k++;
            if (k + 2 < P->n + 0 && !memcmp(P->s + k, "::=", 3))
                return fail_at(P, at, "a rule definition inside a sequence (missing newline?)");
            int32_t r = rule_id(P, P->s + P->i, j - P->i, P->i);
            P->i = j;
            seq_push(q, (gel){GE_REF, r});
        } else if (c == '|' || c == ')' || c == '\n' || c == '\r') {
            return 0;
        } else if (c == '*' || c == '+' || c == '?' || c == '{') {
            return fail_at(P, at, "a repetition operator with nothing before it");
        } else {
            char msg[48];
            snprintf(msg, sizeof msg, "unexpected character '%c'", c);
            return fail_at(P, at, msg);
        }
        /* postfix operators */
        skip_space(P, false);
        while (P->i < P->n && (P->s[P->i] == '*' || P->s[P->i] == '+' || P->s[P->i] == '?' ||
                               P->s[P->i] == '{')) {
            char op = P->s[P->i++];
            int32_t x = span_to_rule(P, q, start);
            if (op == '*') {
                seq_push(q, (gel){GE_REF, star_rule(P, x)});
            } else if (op == '+') {
                seq_push(q, (gel){GE_REF, x});
                seq_push(q, (gel){GE_REF, star_rule(P, x)});
            } else if (op == '?') {
                seq_push(q, (gel){GE_REF, upto_rule(P, x, 1)});
            } else {
                int m, n = -1;
                skip_space(P, false);
                if (parse_int(P, &m))
                    return -1;
                skip_space(P, false);
                if (P->i < P->n && P->s[P->i] == ',') {
                    P->i++;
                    skip_space(P, false);
                    if (P->i < P->n && P->s[P->i] != '}' && parse_int(P, &n))
                        return -1;
                } else {
                    n = m;
                }
                skip_space(P, false);
                if (P->i >= P->n || P->s[P->i] != '}')
                    return fail_at(P, P->i, "expected '}' to close {m,n}");
                P->i++;
                if (n >= 0 && n < m)
                    return fail_at(P, at, "{m,n} with n < m");
                for (int k = 0; k < m; k++)
                    seq_push(q, (gel){GE_REF, x});
                if (n < 0)
                    seq_push(q, (gel){GE_REF, star_rule(P, x)});
                else if (n > m)
                    seq_push(q, (gel){GE_REF, upto_rule(P, x, n - m)});
                if (m == 0 && n == 0) { /* x{0} matches nothing: an empty rule */
                    int32_t r = new_rule(P);
                    seq e = {0};
                    rule_add_alt(&P->rules[r], e);
                    seq_push(q, (gel){GE_REF, r});
                }
            }
            skip_space(P, false); /* a chained operator applies to all of the above */
        }
    }
}

static int parse_alternates(gparser *P, int32_t rule, bool nested) {
    for (;;) {
        seq q = {0};
        if (parse_sequence(P, &q, nested)) {
            free(q.v);
            return -1;
        }
        rule_add_alt(&P->rules[rule], q);
        skip_space(P, nested);
        if (!nested && P->i < P->n && (P->s[P->i] == '\n' || P->s[P->i] == '\r')) {
            /* a following line that starts with '|' continues the rule */
            size_t k = P->i;
            while (k < P->n && (P->s[k] == '\n' || P->s[k] == '\r' || P->s[k] == ' ' || P->s[k] == '\t'))
                k++;
            if (k < P->n && P->s[k] == '|')
                P->i = k;
        }
        if (P->i < P->n && P->s[P->i] == '|') {
            P->i++;
            skip_space(P, true);
            continue;
        }
        return 0;
    }
}

static int parse_rules(gparser *P) {
    for (;;) {
        skip_space(P, true);
        if (P->i >= P->n)
            return 0;
        size_t at = P->i, j = P->i;
        while (j < P->n && name_char(P->s[j]))
            j++;
        if (j == at)
            return fail_at(P, at, "expected a rule name");
        int32_t r = rule_id(P, P->s + at, j - at, at);
        if (P->rules[r].defined) {
            char msg[160];
            snprintf(msg, sizeof msg, "rule '%s' defined twice", P->rules[r].name);
            return fail_at(P, at, msg);
        }
        P->rules[r].defined = true;
        P->i = j;
        skip_space(P, false);
        if (P->n - P->i < 3 || memcmp(P->s + P->i, "::=", 3))
            return fail_at(P, P->i, "expected '::=' after the rule name");
        P->i += 3;
        skip_space(P, true);
        if (parse_alternates(P, r, false))
            return -1;
        skip_space(P, false);
        if (P->i < P->n && P->s[P->i] != '\n' && P->s[P->i] != '\r') {
            char msg[48];
            snprintf(msg, sizeof msg, "unexpected '%c'", P->s[P->i]);
            return fail_at(P, P->i, msg);
        }
    }
}

/* A rule reachable from itself through references that consume nothing
 * would make the matcher expand forever. */
static int check_left_recursion(const mf_grammar *g, mf_error *err) {
    bool *nullable = mf_calloc((size_t)g->n_rules, 1);
    for (bool changed = true; changed;) {
        changed = false;
        for (int32_t r = 0; r < g->n_rules; r++) {
            if (nullable[r])
                continue;
            for (int32_t a = g->rule_alt0[r]; a < g->rule_alt0[r + 1] && !nullable[r]; a++) {
                int32_t e = g->alts[a];
                while (g->el[e].kind == GE_REF && nullable[g->el[e].arg])
                    e++;
                if (g->el[e].kind == GE_END) {
                    nullable[r] = true;
                    changed = true;
                }
            }
        }
    }
    /* DFS over "starts with" edges; colour 1 = on the path. */
    int8_t *colour = mf_calloc((size_t)g->n_rules, 1);
    int32_t *stack = mf_malloc(((size_t)g->n_rules + 1) * 2 * sizeof *stack);
    int rc = 0;
    for (int32_t s0 = 0; s0 < g->n_rules && !rc; s0++) {
        if (colour[s0])
            continue;
        int32_t sp = 0;
        stack[sp++] = s0;
        stack[sp++] = 0; /* next element cursor: alternative-major encoding below */
        colour[s0] = 1;
        while (sp && !rc) {
            int32_t r = stack[sp - 2], cur = stack[sp - 1];
            /* enumerate refs r starts with: (alt, element) flattened as an element index */
            int32_t found = -1;
            for (int32_t a = g->rule_alt0[r]; a < g->rule_alt0[r + 1] && found < 0; a++) {
                for (int32_t e = g->alts[a]; g->el[e].kind == GE_REF; e++) {
                    if (e >= cur) {
                        found = e;
                        break;
                    }
                    if (!nullable[g->el[e].arg])
                        break;
                }
            }
            if (found < 0) {
                colour[r] = 2;
                sp -= 2;
                continue;
            }
            stack[sp - 1] = found + 1;
            int32_t t = g->el[found].arg;
            if (colour[t] == 1) {
                rc = mf_errorf(err, "grammar: rule '%s' is left-recursive (it can reach itself "
                                    "without consuming input)", g->names[t]);
            } else if (!colour[t]) {
                colour[t] = 1;
                stack[sp++] = t;
                stack[sp++] = 0;
            }
        }
    }
    free(stack);
    free(colour);
    free(nullable);
    return rc;
}

static void free_parser(gparser *P) {
    for (int32_t r = 0; r < P->n_rules; r++) {
        for (int32_t a = 0; a < P->rules[r].n_alts; a++)
            free(P->rules[r].alts[a].v);
        free(P->rules[r].alts);
        free(P->rules[r].name);
    }
    free(P->rules);
    free(P->ranges);
    free(P->classes);
}

int mf_grammar_parse(const char *text, size_t len, const char *root, mf_grammar **out,
                     mf_error *err) {
    *out = NULL;
    gparser P = {.s = text, .n = len, .err = err};
    if (parse_rules(&P)) {
        free_parser(&P);
        return -1;
    }
    int rc = 0;
    for (int32_t r = 0; r < P.n_rules && !rc; r++)
        if (!P.rules[r].defined)
            rc = mf_errorf(err, "grammar: %d:%d: undefined rule '%s'", P.rules[r].line,
                           P.rules[r].col, P.rules[r].name);
    int32_t root_id = -1;
    for (int32_t r = 0; r < P.n_rules; r++)
        if (!strcmp(P.rules[r].name, root ? root : "root"))
            root_id = r;
    if (!rc && root_id < 0)
        rc = mf_errorf(err, "grammar: no rule '%s' (the start rule)", root ? root : "root");
    if (rc) {
        free_parser(&P);
        return -1;
    }
    mf_grammar *g = mf_calloc(1, sizeof *g);
    g->n_rules = P.n_rules;
    g->root = root_id;
    int32_t n_alts = 0, n_el = 0;
    for (int32_t r = 0; r < P.n_rules; r++) {
        n_alts += P.rules[r].n_alts;
        for (int32_t a = 0; a < P.rules[r].n_alts; a++)
            n_el += P.rules[r].alts[a].n + 1;
    }
    g->el = mf_malloc((size_t)n_el * sizeof *g->el);
    g->alts = mf_malloc(((size_t)n_alts + 1) * sizeof *g->alts);
    g->rule_alt0 = mf_malloc(((size_t)P.n_rules + 1) * sizeof *g->rule_alt0);
    g->names = mf_malloc((size_t)P.n_rules * sizeof *g->names);
    int32_t ai = 0, ei = 0;
    for (int32_t r = 0; r < P.n_rules; r++) {
        g->rule_alt0[r] = ai;
        g->names[r] = P.rules[r].name;
        P.rules[r].name = NULL;
        for (int32_t a = 0; a < P.rules[r].n_alts; a++) {
            g->alts[ai++] = ei;
            seq *q = &P.rules[r].alts[a];
            if (q->n)
                memcpy(g->el + ei, q->v, (size_t)q->n * sizeof *q->v);
            ei += q->n;
            g->el[ei++] = (gel){GE_END, 0};
        }
    }
    g->rule_alt0[P.n_rules] = ai;
    g->n_el = n_el;
    g->ranges = P.ranges;
    g->classes = P.classes;
    g->n_classes = P.n_classes;
    P.ranges = NULL;
    P.classes = NULL;
    free_parser(&P);
    if (check_left_recursion(g, err)) {
        mf_grammar_free(g);
        return -1;
    }
    *out = g;
    return 0;
}

void mf_grammar_free(mf_grammar *g) {
    if (!g)
        return;
    for (int32_t r = 0; r < g->n_rules; r++)
        free(g->names[r]);
    free(g->names);
    free(g->el);
    free(g->alts);
    free(g->rule_alt0);
    free(g->ranges);
    free(g->classes);
    free(g);
}

int mf_grammar_n_rules(const mf_grammar *g) { return g->n_rules; }
