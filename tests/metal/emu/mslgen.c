/* mf_mslgen: turns one .metal file into a C++ translation unit for the MSL
 * emulator. The output is
 *   #include "msl_prelude.h"
 *   #line 1 "<the .metal file>"
 *   <the source, every [[...]] attribute blanked, line structure kept>
 *   a thunk per `kernel void name(...)` that calls it with the bound
 *   pointers and the builtin values, and the kernel's parameter table
 *   (buffer/threadgroup index, const-ness, sizeof/alignof the pointee)
 *   registered with the emulator by a constructor.
 * Usage: mf_mslgen <in.metal> <out.cpp> */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_PARAMS 64
#define MAX_KERNELS 256

typedef struct param {
    char type[256];
    char name[96];
    char attr[96];
    int line;
} param;

typedef struct kern {
    char name[128];
    int line;
    int nparams;
    param p[MAX_PARAMS];
} kern;

static const char *g_path;
static kern g_k[MAX_KERNELS];
static int g_nk;

static void die(int line, const char *msg, const char *what)
{
    fprintf(stderr, "%s:%d: mf_mslgen: %s%s%s\n", g_path, line, msg, what ? ": " : "", what ? what : "");
    exit(1);
}

static char *read_all(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)len + 1);
    if (!b || fread(b, 1, (size_t)len, f) != (size_t)len) {
        fclose(f);
        free(b);
        return NULL;
    }
    fclose(f);
    b[len] = 0;
    *n = (size_t)len;
    return b;
}

/* code[i] = 1 where src[i] is code (not a comment, string or char literal) */
static void mark_code(const char *s, size_t n, char *code)
{
    size_t i = 0;
    while (i < n) {
        if (s[i] == '/' && s[i + 1] == '/') {
            while (i < n && s[i] != '\n') code[i++] = 0;
        } else if (s[i] == '/' && s[i + 1] == '*') {
            code[i++] = 0;
            code[i++] = 0;
            while (i < n && !(s[i] == '*' && s[i + 1] == '/')) code[i++] = 0;
            if (i < n) { code[i++] = 0; code[i++] = 0; }
        } else if (s[i] == '"' || s[i] == '\'') {
            char q = s[i];
            code[i++] = 0;
            while (i < n && s[i] != q) {
                if (s[i] == '\\') code[i++] = 0;
                if (i < n) code[i++] = 0;
            }
            if (i < n) code[i++] = 0;
        } else {
            code[i++] = 1;
        }
    }
}

static int line_at(const char *s, size_t pos)
{
    int l = 1;
    for (size_t i = 0; i < pos; i++) l += s[i] == '\n';
    return l;
}

static int is_id(int c) { return isalnum(c) || c == '_'; }

static void trim_copy(char *dst, size_t cap, const char *b, const char *e)
{
    while (b < e && isspace((unsigned char)*b)) b++;
    while (e > b && isspace((unsigned char)e[-1])) e--;
    size_t j = 0;
    int sp = 0;
    for (const char *p = b; p < e && j + 1 < cap; p++) {
        if (isspace((unsigned char)*p)) { sp = 1; continue; }
        if (sp && j) dst[j++] = ' ';
        sp = 0;
        if (j + 1 < cap) dst[j++] = *p;
    }
    dst[j] = 0;
}

/* One parameter's text (attributes still in it). */
static void parse_param(kern *k, const char *s, const char *b, const char *e)
{
    if (k->nparams >= MAX_PARAMS) die(line_at(s, (size_t)(b - s)), "too many parameters", k->name);
    param *p = &k->p[k->nparams++];
    p->line = line_at(s, (size_t)(b - s));
    const char *a = strstr(b, "[[");
    if (!a || a >= e) die(p->line, "kernel parameter without an attribute", k->name);
    const char *ae = strstr(a, "]]");
    if (!ae || ae > e) die(p->line, "unterminated attribute", k->name);
    trim_copy(p->attr, sizeof p->attr, a + 2, ae);
    /* declaration: the text around the attribute */
    char decl[512];
    size_t j = 0;
    for (const char *q = b; q < e && j + 1 < sizeof decl; q++) {
        if (q >= a && q < ae + 2) { decl[j++] = ' '; continue; }
        decl[j++] = *q;
    }
    decl[j] = 0;
    char t[512];
    trim_copy(t, sizeof t, decl, decl + j);
    size_t n = strlen(t);
    size_t ne = n;
    while (ne > 0 && is_id((unsigned char)t[ne - 1])) ne--;
    if (ne == n) die(p->line, "kernel parameter without a name", t);
    snprintf(p->name, sizeof p->name, "%s", t + ne);
    trim_copy(p->type, sizeof p->type, t, t + ne);
}

static void find_kernels(const char *s, size_t n, const char *code)
{
    for (size_t i = 0; i + 6 < n; i++) {
        if (!code[i] || strncmp(s + i, "kernel", 6) != 0) continue;
        if ((i > 0 && is_id((unsigned char)s[i - 1])) || is_id((unsigned char)s[i + 6])) continue;
        size_t j = i + 6;
        while (j < n && isspace((unsigned char)s[j])) j++;
        if (strncmp(s + j, "void", 4) != 0 || is_id((unsigned char)s[j + 4]))
            die(line_at(s, i), "a kernel must return void", NULL);
        j += 4;
        while (j < n && isspace((unsigned char)s[j])) j++;
        size_t nb = j;
        while (j < n && is_id((unsigned char)s[j])) j++;
        if (j == nb) die(line_at(s, i), "kernel without a name", NULL);
        if (g_nk >= MAX_KERNELS) die(line_at(s, i), "too many kernels", NULL);
        kern *k = &g_k[g_nk++];
        memset(k, 0, sizeof *k);
        snprintf(k->name, sizeof k->name, "%.*s", (int)(j - nb), s + nb);
        k->line = line_at(s, i);
        while (j < n && isspace((unsigned char)s[j])) j++;
        if (s[j] != '(') die(k->line, "expected '(' after the kernel name (no templates)", k->name);
        size_t pb = ++j;
        int depth = 0, adepth = 0;
        for (; j < n; j++) {
            char c = s[j];
            if (!code[j]) continue;
            if (c == '[') adepth++;
            else if (c == ']') adepth--;
            else if (c == '(' || c == '<') depth++;
            else if ((c == ')' || c == '>') && depth > 0) depth--;
            else if (c == ')' && depth == 0) break;
            else if (c == ',' && depth == 0 && adepth == 0) {
                parse_param(k, s, s + pb, s + j);
                pb = j + 1;
            }
        }
        if (j >= n) die(k->line, "unterminated parameter list", k->name);
        const char *q = s + pb;
        while (q < s + j && isspace((unsigned char)*q)) q++;
        if (q < s + j) parse_param(k, s, s + pb, s + j);
        i = j;
    }
}

static const struct { const char *attr; const char *id; } g_builtins[] = {
    { "thread_position_in_grid", "MF_EMU_B_THREAD_POSITION_IN_GRID" },
    { "threadgroup_position_in_grid", "MF_EMU_B_THREADGROUP_POSITION_IN_GRID" },
    { "thread_position_in_threadgroup", "MF_EMU_B_THREAD_POSITION_IN_THREADGROUP" },
    { "threads_per_threadgroup", "MF_EMU_B_THREADS_PER_THREADGROUP" },
    { "threadgroups_per_grid", "MF_EMU_B_THREADGROUPS_PER_GRID" },
    { "threads_per_grid", "MF_EMU_B_THREADS_PER_GRID" },
    { "thread_index_in_threadgroup", "MF_EMU_B_THREAD_INDEX_IN_THREADGROUP" },
    { "thread_index_in_simdgroup", "MF_EMU_B_THREAD_INDEX_IN_SIMDGROUP" },
    { "simdgroup_index_in_threadgroup", "MF_EMU_B_SIMDGROUP_INDEX_IN_THREADGROUP" },
    { "threads_per_simdgroup", "MF_EMU_B_THREADS_PER_SIMDGROUP" },
    { "thread_execution_width", "MF_EMU_B_THREADS_PER_SIMDGROUP" },
    { "simdgroups_per_threadgroup", "MF_EMU_B_SIMDGROUPS_PER_THREADGROUP" },
};

static int has_word(const char *s, const char *w)
{
    size_t n = strlen(w);
    for (const char *p = strstr(s, w); p; p = strstr(p + 1, w))
        if ((p == s || !is_id((unsigned char)p[-1])) && !is_id((unsigned char)p[n])) return 1;
    return 0;
}

static void emit_kernel(FILE *o, const kern *k)
{
    fprintf(o, "static void mf_emu_thunk_%s(void *const *mf_b) {\n    (void)mf_b;\n    %s(", k->name, k->name);
    for (int i = 0; i < k->nparams; i++) {
        const param *p = &k->p[i];
        int idx;
        char ty[256];
        snprintf(ty, sizeof ty, "%s", p->type);
        size_t tl = strlen(ty);
        if (i) fprintf(o, ",");
        fprintf(o, "\n        ");
        if (sscanf(p->attr, "buffer ( %d )", &idx) == 1 || sscanf(p->attr, "buffer(%d)", &idx) == 1 ||
            sscanf(p->attr, "threadgroup ( %d )", &idx) == 1 || sscanf(p->attr, "threadgroup(%d)", &idx) == 1) {
            if (tl && ty[tl - 1] == '&') {
                ty[tl - 1] = 0;
                fprintf(o, "*(%s *)mf_b[%d]", ty, i);
            } else if (tl && ty[tl - 1] == '*') {
                fprintf(o, "(%s)mf_b[%d]", ty, i);
            } else {
                die(p->line, "buffer/threadgroup parameter must be a pointer or a reference", p->name);
            }
            continue;
        }
        int found = 0;
        for (size_t b = 0; b < sizeof g_builtins / sizeof g_builtins[0]; b++)
            if (strcmp(p->attr, g_builtins[b].attr) == 0) {
                fprintf(o, "mf_emu_bi<%s>(%s)", ty, g_builtins[b].id);
                found = 1;
                break;
            }
        if (!found) die(p->line, "unsupported parameter attribute", p->attr);
    }
    fprintf(o, ");\n}\n");
    fprintf(o, "static const mf_emu_arg mf_emu_args_%s[] = {\n", k->name);
    for (int i = 0; i < k->nparams; i++) {
        const param *p = &k->p[i];
        int idx;
        char pointee[256];
        snprintf(pointee, sizeof pointee, "%s", p->type);
        size_t tl = strlen(pointee);
        int is_ref = tl && pointee[tl - 1] == '&';
        if (tl && (pointee[tl - 1] == '&' || pointee[tl - 1] == '*')) pointee[tl - 1] = 0;
        int is_const = has_word(p->type, "const") || has_word(p->type, "constant");
        if (sscanf(p->attr, "buffer ( %d )", &idx) == 1 || sscanf(p->attr, "buffer(%d)", &idx) == 1) {
            if (idx < 0 || idx >= 31) die(p->line, "buffer index outside 0..30", p->name);
            fprintf(o, "    { MF_EMU_ARG_BUFFER, %d, %d, %d, sizeof(%s), alignof(%s), \"%s\", \"%s\" },\n", idx, is_ref,
                    is_const, pointee, pointee, p->name, p->type);
        } else if (sscanf(p->attr, "threadgroup ( %d )", &idx) == 1 || sscanf(p->attr, "threadgroup(%d)", &idx) == 1) {
            if (idx < 0 || idx >= 31) die(p->line, "threadgroup index outside 0..30", p->name);
            fprintf(o, "    { MF_EMU_ARG_THREADGROUP, %d, %d, 0, sizeof(%s), alignof(%s), \"%s\", \"%s\" },\n", idx,
                    is_ref, pointee, pointee, p->name, p->type);
        } else {
            const char *id = "0";
            for (size_t b = 0; b < sizeof g_builtins / sizeof g_builtins[0]; b++)
                if (strcmp(p->attr, g_builtins[b].attr) == 0) id = g_builtins[b].id;
            fprintf(o, "    { MF_EMU_ARG_BUILTIN, %s, 0, 1, sizeof(%s), alignof(%s), \"%s\", \"%s\" },\n", id, p->type,
                    p->type, p->name, p->type);
        }
    }
    fprintf(o, "};\n");
    fprintf(o, "static mf_emu_kernel mf_emu_kernel_%s = { \"%s\", \"%s\", %d, %d, mf_emu_args_%s, mf_emu_thunk_%s, 0, 0 };\n",
            k->name, k->name, g_path, k->line, k->nparams, k->name, k->name);
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: mf_mslgen <in.metal> <out.cpp>\n");
        return 2;
    }
    g_path = argv[1];
    size_t n;
    char *s = read_all(argv[1], &n);
    if (!s) {
        fprintf(stderr, "mf_mslgen: cannot read %s\n", argv[1]);
        return 1;
    }
    char *code = malloc(n + 2);
    if (!code) return 1;
    mark_code(s, n, code);
    find_kernels(s, n, code);
    /* blank attributes (code only), keep newlines */
    char *out = malloc(n + 1);
    if (!out) return 1;
    memcpy(out, s, n + 1);
    for (size_t i = 0; i + 1 < n; i++) {
        if (!code[i] || s[i] != '[' || s[i + 1] != '[') continue;
        size_t j = i + 2;
        while (j + 1 < n && !(s[j] == ']' && s[j + 1] == ']')) j++;
        if (j + 1 >= n) die(line_at(s, i), "unterminated [[", NULL);
        for (size_t q = i; q <= j + 1; q++)
            if (out[q] != '\n') out[q] = ' ';
        i = j + 1;
    }
    FILE *o = fopen(argv[2], "wb");
    if (!o) {
        fprintf(stderr, "mf_mslgen: cannot write %s\n", argv[2]);
        return 1;
    }
    fprintf(o, "#include \"msl_prelude.h\"\n#line 1 \"%s\"\n", g_path);
    fputs(out, o);
    if (n && s[n - 1] != '\n') fputc('\n', o);
    fprintf(o, "// ---- generated by mf_mslgen ----\n");
    for (int i = 0; i < g_nk; i++) emit_kernel(o, &g_k[i]);
    fprintf(o, "__attribute__((constructor)) static void mf_emu_register_file(void) {\n");
    for (int i = 0; i < g_nk; i++) fprintf(o, "    mf_emu_register(&mf_emu_kernel_%s);\n", g_k[i].name);
    fprintf(o, "}\n");
    if (fclose(o) != 0) {
        fprintf(stderr, "mf_mslgen: cannot write %s\n", argv[2]);
        return 1;
    }
    free(out);
    free(code);
    free(s);
    return 0;
}
