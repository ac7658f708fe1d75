/* metal_api_drift: checks the stand-in <Metal/Metal.h> against the pinned
 * list of Apple's API (apple_api.txt, extracted from metal-cpp): every
 * method and property the header declares must exist in Apple's list for
 * that protocol/class with the same selector, return type and argument
 * types; every enum constant must have Apple's value; the one function too.
 * Prints each mismatch and "N declarations checked, M mismatches"; exits 1
 * when M > 0. Usage: metal_api_drift <apple_api.txt> <Metal.h> */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_API 8192

typedef struct api {
    char kind[8];
    char cls[96];
    char sel[256];
    char ret[96];
    char args[512];
    long long value;
} api;

static api g_api[MAX_API];
static int g_napi;
static int g_checked, g_bad;

static char *read_all(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    fclose(f);
    if (b) b[n] = 0;
    return b;
}

static void trim(char *s)
{
    size_t n = strlen(s);
    while (n && isspace((unsigned char)s[n - 1])) s[--n] = 0;
    size_t i = 0;
    while (s[i] && isspace((unsigned char)s[i])) i++;
    memmove(s, s + i, strlen(s + i) + 1);
}

static int load_api(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[2048];
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '#' || line[0] == '\n') continue;
        if (g_napi >= MAX_API) break;
        api *a = &g_api[g_napi];
        memset(a, 0, sizeof *a);
        if (strncmp(line, "const ", 6) == 0) {
            if (sscanf(line, "const %95s %lld", a->cls, &a->value) == 2) {
                strcpy(a->kind, "const");
                g_napi++;
            }
            continue;
        }
        char *p1 = strchr(line, '|');
        char *p2 = p1 ? strchr(p1 + 1, '|') : NULL;
        if (!p1 || !p2) continue;
        *p1 = 0;
        *p2 = 0;
        if (sscanf(line, "%7s %95s %255s", a->kind, a->cls, a->sel) != 3) continue;
        snprintf(a->ret, sizeof a->ret, "%s", p1 + 1);
        snprintf(a->args, sizeof a->args, "%s", p2 + 1);
        trim(a->ret);
        trim(a->args);
        g_napi++;
    }
    fclose(f);
    return 0;
}

/* The canonical spelling (the same rules as extract_apple_api.py's canon):
 * no const / nullability / __autoreleasing, id<X> -> X*, generics dropped,
 * blocks -> block, no spaces. */
static void canon(const char *in, char *out, size_t cap)
{
    if (strchr(in, '^') || strstr(in, "Handler")) {
        snprintf(out, cap, "block");
        return;
    }
    char t[512];
    snprintf(t, sizeof t, "%s", in);
    static const char *drop[] = { "const", "_Nullable", "_Nonnull", "nullable", "nonnull", "__autoreleasing",
                                  "__kindof", "struct" };
    for (size_t d = 0; d < sizeof drop / sizeof drop[0]; d++) {
        size_t n = strlen(drop[d]);
        for (char *p = strstr(t, drop[d]); p; p = strstr(p, drop[d])) {
            int lb = p == t || !(isalnum((unsigned char)p[-1]) || p[-1] == '_');
            int rb = !(isalnum((unsigned char)p[n]) || p[n] == '_');
            if (lb && rb) memset(p, ' ', n);
            p += n;
        }
    }
    /* id<X> -> X*; Foo<...> -> Foo */
    char u[512];
    size_t j = 0;
    for (size_t i = 0; t[i] && j + 2 < sizeof u; i++) {
        if (t[i] == '<') {
            int is_id = j >= 2 && u[j - 2] == 'i' && u[j - 1] == 'd' && (j == 2 || !isalnum((unsigned char)u[j - 3]));
            size_t k = i + 1;
            int depth = 1;
            char inner[128];
            size_t q = 0;
            while (t[k] && depth) {
                if (t[k] == '<') depth++;
                else if (t[k] == '>') depth--;
                if (depth && q + 1 < sizeof inner) inner[q++] = t[k];
                k++;
            }
            inner[q] = 0;
            if (is_id) {
                j -= 2;
                for (size_t z = 0; inner[z] && j + 2 < sizeof u; z++)
                    if (!isspace((unsigned char)inner[z])) u[j++] = inner[z];
                u[j++] = '*';
            }
            i = k - 1;
            continue;
        }
        if (!isspace((unsigned char)t[i])) u[j++] = t[i];
    }
    u[j] = 0;
    snprintf(out, cap, "%s", u);
}

static const api *find_sel(const char *cls, const char *sel)
{
    for (int i = 0; i < g_napi; i++)
        if (strcmp(g_api[i].kind, "sel") == 0 && strcmp(g_api[i].cls, cls) == 0 && strcmp(g_api[i].sel, sel) == 0)
            return &g_api[i];
    return NULL;
}

static void check_method(const char *cls, const char *sel, const char *ret, const char *args, int line)
{
    g_checked++;
    const api *a = find_sel(cls, sel);
    if (!a) {
        printf("Metal.h:%d: %s %s: not in Apple's API\n", line, cls, sel);
        g_bad++;
        return;
    }
    if (strcmp(a->ret, ret) != 0) {
        printf("Metal.h:%d: %s %s: returns %s, Apple %s\n", line, cls, sel, ret, a->ret);
        g_bad++;
    }
    if (strcmp(a->args, args) != 0) {
        printf("Metal.h:%d: %s %s: arguments (%s), Apple (%s)\n", line, cls, sel, args, a->args);
        g_bad++;
    }
}

static int line_of(const char *base, const char *p)
{
    int l = 1;
    for (const char *q = base; q < p; q++) l += *q == '\n';
    return l;
}

/* "(type)" at *pp: copies the canonical type, advances past ')' */
static int paren_type(const char **pp, char *out, size_t cap)
{
    const char *p = *pp;
    while (isspace((unsigned char)*p)) p++;
    if (*p != '(') return -1;
    int depth = 0;
    const char *b = p + 1;
    for (; *p; p++) {
        if (*p == '(') depth++;
        else if (*p == ')' && --depth == 0) break;
    }
    if (!*p) return -1;
    char raw[512];
    snprintf(raw, sizeof raw, "%.*s", (int)(p - b), b);
    canon(raw, out, cap);
    *pp = p + 1;
    return 0;
}

static void parse_method(const char *base, const char *p, const char *cls)
{
    int line = line_of(base, p);
    p++; /* '-' or '+' */
    char ret[128], sel[256] = "", args[512] = "", t[128];
    if (paren_type(&p, ret, sizeof ret) != 0) return;
    for (;;) {
        while (isspace((unsigned char)*p)) p++;
        const char *b = p;
        while (isalnum((unsigned char)*p) || *p == '_') p++;
        if (p == b) break;
        char part[128];
        snprintf(part, sizeof part, "%.*s", (int)(p - b), b);
        if (*p != ':') {
            if (!sel[0]) snprintf(sel, sizeof sel, "%s", part);
            break;
        }
        p++;
        strncat(sel, part, sizeof sel - strlen(sel) - 2);
        strcat(sel, ":");
        if (paren_type(&p, t, sizeof t) != 0) return;
        if (args[0]) strncat(args, " ", sizeof args - strlen(args) - 1);
        strncat(args, t, sizeof args - strlen(args) - 1);
        while (isspace((unsigned char)*p)) p++;
        while (isalnum((unsigned char)*p) || *p == '_') p++; /* the argument name */
    }
    check_method(cls, sel, ret, args, line);
}

static void parse_property(const char *base, const char *p, const char *cls)
{
    int line = line_of(base, p);
    const char *e = strchr(p, ';');
    if (!e) return;
    p += strlen("@property");
    while (isspace((unsigned char)*p)) p++;
    int readonly = 0;
    char getter[96] = "";
    if (*p == '(') {
        const char *q = strchr(p, ')');
        char attrs[256];
        snprintf(attrs, sizeof attrs, "%.*s", (int)(q - p - 1), p + 1);
        readonly = strstr(attrs, "readonly") != NULL;
        const char *g = strstr(attrs, "getter=");
        if (g) sscanf(g + 7, "%95[A-Za-z0-9_]", getter);
        p = q + 1;
    }
    /* type then name: the name is the last identifier before ';' */
    const char *ne = e;
    while (ne > p && isspace((unsigned char)ne[-1])) ne--;
    const char *nb = ne;
    while (nb > p && (isalnum((unsigned char)nb[-1]) || nb[-1] == '_')) nb--;
    char name[96], raw[256], type[128];
    snprintf(name, sizeof name, "%.*s", (int)(ne - nb), nb);
    snprintf(raw, sizeof raw, "%.*s", (int)(nb - p), p);
    canon(raw, type, sizeof type);
    check_method(cls, getter[0] ? getter : name, type, "", line);
    if (!readonly) {
        char sel[128];
        snprintf(sel, sizeof sel, "set%c%s:", toupper((unsigned char)name[0]), name + 1);
        check_method(cls, sel, "void", type, line);
    }
}

static void check_const(const char *name, long long v, int line)
{
    g_checked++;
    for (int i = 0; i < g_napi; i++)
        if (strcmp(g_api[i].kind, "const") == 0 && strcmp(g_api[i].cls, name) == 0) {
            if (g_api[i].value != v) {
                printf("Metal.h:%d: %s = %lld, Apple %lld\n", line, name, v, g_api[i].value);
                g_bad++;
            }
            return;
        }
    printf("Metal.h:%d: %s: not in Apple's API\n", line, name);
    g_bad++;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: metal_api_drift <apple_api.txt> <Metal.h>\n");
        return 2;
    }
    if (load_api(argv[1]) != 0 || g_napi == 0) {
        fprintf(stderr, "metal_api_drift: cannot read %s\n", argv[1]);
        return 2;
    }
    char *h = read_all(argv[2]);
    if (!h) {
        fprintf(stderr, "metal_api_drift: cannot read %s\n", argv[2]);
        return 2;
    }
    /* strip comments (keep newlines) */
    for (char *p = h; *p; p++) {
        if (p[0] == '/' && p[1] == '*') {
            char *e = strstr(p + 2, "*/");
            char *end = e ? e + 2 : p + strlen(p);
            for (char *q = p; q < end; q++)
                if (*q != '\n') *q = ' ';
            p = end - 1;
        } else if (p[0] == '/' && p[1] == '/') {
            while (*p && *p != '\n') *p++ = ' ';
            if (!*p) break;
        }
    }
    char cls[96] = "";
    int in_enum = 0;
    for (char *p = h; *p;) {
        char *eol = strchr(p, '\n');
        if (!eol) eol = p + strlen(p);
        char save = *eol;
        *eol = 0;
        char *s = p;
        while (isspace((unsigned char)*s)) s++;
        if (strncmp(s, "@protocol ", 10) == 0 || strncmp(s, "@interface ", 11) == 0) {
            if (!strchr(s, ';')) sscanf(strchr(s, ' ') + 1, "%95[A-Za-z0-9_]", cls);
        } else if (strncmp(s, "@end", 4) == 0) {
            cls[0] = 0;
        } else if (cls[0] && (s[0] == '-' || s[0] == '+')) {
            *eol = save;
            parse_method(h, s, cls);
        } else if (cls[0] && strncmp(s, "@property", 9) == 0) {
            *eol = save;
            parse_property(h, s, cls);
        } else if (strstr(s, "NS_ENUM(") || strstr(s, "NS_OPTIONS(")) {
            in_enum = 1;
        } else if (in_enum && s[0] == '}') {
            in_enum = 0;
        } else if (in_enum) {
            char name[128];
            long long v;
            if (sscanf(s, "%127[A-Za-z0-9_] = %lld", name, &v) == 2) check_const(name, v, line_of(h, s));
            else if (*s) {
                printf("Metal.h:%d: enum line not a plain 'Name = value,': %s\n", line_of(h, s), s);
                g_bad++;
            }
        } else if (strstr(s, "MTLCreateSystemDefaultDevice(")) {
            g_checked++;
            int found = 0;
            for (int i = 0; i < g_napi; i++)
                if (strcmp(g_api[i].kind, "func") == 0 && strcmp(g_api[i].sel, "MTLCreateSystemDefaultDevice") == 0)
                    found = strcmp(g_api[i].ret, "MTLDevice*") == 0 && strstr(s, "id<MTLDevice>") != NULL;
            if (!found) {
                printf("Metal.h:%d: MTLCreateSystemDefaultDevice differs from Apple's\n", line_of(h, s));
                g_bad++;
            }
        }
        *eol = save;
        p = *eol ? eol + 1 : eol;
    }
    printf("%d declarations checked, %d mismatches\n", g_checked, g_bad);
    free(h);
    return g_bad ? 1 : 0;
}
