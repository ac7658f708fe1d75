/* cmd_inspect.c - `minfer inspect FILE [--json] [--no-tensors]`: a GGUF
 * file's metadata, tensor table and totals, as text or one JSON object. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "gguf/gguf.h"
#include "quant/quant.h"
#include "tools.h"

#define ARRAY_HEAD 8 /* array elements shown */

static const char *vtype_name(mf_gguf_vtype t) {
    static const char *names[MF_GGUF_VTYPE_COUNT] = {
        "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "str", "arr", "u64", "i64", "f64",
    };
    return (unsigned)t < MF_GGUF_VTYPE_COUNT ? names[t] : "?";
}

/* ---- JSON output helpers ---------------------------------------------------------- */

/* Writes s (len bytes, maybe not valid UTF-8) as a JSON string literal.
 * Control bytes are escaped; valid UTF-8 sequences pass through and an
 * invalid byte becomes U+FFFD, so the output is always valid JSON text. */
static void json_str(FILE *f, const char *s, uint64_t len) {
    fputc('"', f);
    const unsigned char *p = (const unsigned char *)s;
    for (uint64_t i = 0; i < len; i++) {
        unsigned c = p[i];
        if (c == '"' || c == '\\') {
            fputc('\\', f);
            fputc((int)c, f);
        } else if (c == '\n') {
            fputs("\\n", f);
        } else if (c == '\r') {
            fputs("\\r", f);
        } else if (c == '\t') {
            fputs("\\t", f);
        } else if (c < 0x20 || c == 0x7f) {
            fprintf(f, "\\u%04x", c);
        } else if (c < 0x80) {
            fputc((int)c, f);
        } else {
            /* validate one UTF-8 sequence; copy it whole or emit U+FFFD */
            int n = (c >= 0xc2 && c < 0xe0) ? 2 : (c >= 0xe0 && c < 0xf0) ? 3
                    : (c >= 0xf0 && c < 0xf5) ? 4 : 0;
            bool ok = n > 0 && i + (uint64_t)n <= len;
            for (int k = 1; ok && k < n; k++)
                ok = (p[i + k] & 0xc0) == 0x80;
            if (ok) {
                fwrite(p + i, 1, (size_t)n, f);
                i += (uint64_t)n - 1;
            } else {
                fputs("\\ufffd", f);
            }
        }
    }
    fputc('"', f);
}

static void json_double(FILE *f, double v) {
    if (!isfinite(v))
        fputs("null", f);
    else
        fprintf(f, "%.9g", v);
}

static bool is_int_type(mf_gguf_vtype t) {
    return t == MF_GGUF_UINT8 || t == MF_GGUF_INT8 || t == MF_GGUF_UINT16 ||
           t == MF_GGUF_INT16 || t == MF_GGUF_UINT32 || t == MF_GGUF_INT32 ||
           t == MF_GGUF_UINT64 || t == MF_GGUF_INT64;
}

/* One element of array handle kv, as JSON (or as text when json is false). */
static void print_elem(FILE *f, const mf_gguf *g, int64_t kv, uint64_t i, bool json) {
    mf_gguf_vtype et = mf_gguf_arr_type(g, kv);
    if (et == MF_GGUF_STRING) {
        mf_str s = mf_gguf_arr_str(g, kv, i);
        json_str(f, s.ptr, s.len);
    } else if (et == MF_GGUF_ARRAY) {
        int64_t sub = mf_gguf_arr_sub(g, kv, i);
        if (json)
            fprintf(f, "{\"array\": \"%s\", \"n\": %" PRIu64 "}", vtype_name(mf_gguf_arr_type(g, sub)),
                    mf_gguf_arr_n(g, sub));
        else
            fprintf(f, "[%" PRIu64 " %s]", mf_gguf_arr_n(g, sub), vtype_name(mf_gguf_arr_type(g, sub)));
    } else if (et == MF_GGUF_BOOL) {
        fputs(mf_gguf_arr_int(g, kv, i) ? "true" : "false", f);
    } else if (et == MF_GGUF_UINT64) {
        fprintf(f, "%" PRIu64, (uint64_t)mf_gguf_arr_int(g, kv, i));
    } else if (is_int_type(et)) {
        fprintf(f, "%" PRId64, mf_gguf_arr_int(g, kv, i));
    } else {
        json_double(f, mf_gguf_arr_float(g, kv, i));
    }
}

static void print_array(FILE *f, const mf_gguf *g, int64_t kv, bool json) {
    uint64_t n = mf_gguf_arr_n(g, kv);
    uint64_t show = n < ARRAY_HEAD ? n : ARRAY_HEAD;
    if (json)
        fprintf(f, "{\"array\": \"%s\", \"n\": %" PRIu64 ", \"head\": [",
                vtype_name(mf_gguf_arr_type(g, kv)), n);
    else
        fprintf(f, "arr[%s,%" PRIu64 "] [", vtype_name(mf_gguf_arr_type(g, kv)), n);
    for (uint64_t i = 0; i < show; i++) {
        if (i)
            fputs(", ", f);
        print_elem(f, g, kv, i, json);
    }
    if (!json && show < n)
        fputs(", ...", f);
    fputs(json ? "]}" : "]", f);
}

/* A scalar kv as JSON: strings through json_str, numbers through the
 * reader's own formatting (checked to be a finite number). */
static void json_scalar(FILE *f, const mf_gguf *g, int64_t i) {
    mf_gguf_vtype t = mf_gguf_kv_type(g, i);
    mf_str key = mf_gguf_kv_key(g, i);
    if (t == MF_GGUF_STRING) {
        mf_str s = {0};
        if (mf_gguf_get_str(g, key.ptr, &s, NULL) == 0)
            json_str(f, s.ptr, s.len);
        else
            fputs("null", f);
        return;
    }
    char buf[128];
    mf_gguf_kv_format(g, i, buf, sizeof buf);
    if (t == MF_GGUF_BOOL) {
        fputs(strstr(buf, "true") ? "true" : "false", f);
        return;
    }
    char *end = NULL;
    double v = strtod(buf, &end);
    if (end != buf && *end == '\0' && isfinite(v))
        fputs(buf, f);
    else
        fputs("null", f);
}

/* ---- the command ------------------------------------------------------------------- */

typedef struct totals {
    uint64_t bytes, params;
} totals;

static void shape_text(const mf_gguf_tensor *t, char *buf, size_t n) {
    size_t o = 0;
    buf[0] = '\0';
    for (uint32_t d = 0; d < t->n_dims && o < n; d++)
        o += (size_t)snprintf(buf + o, n - o, "%s%" PRId64, d ? "x" : "", t->ne[d]);
}

static void print_text(const char *path, const mf_gguf *g, bool tensors, totals tot) {
    int64_t nkv = mf_gguf_n_kv(g), nt = mf_gguf_n_tensors(g);
    printf("file: %s\n", path);
    printf("gguf v%u, alignment %u, data offset %" PRIu64 ", %u part%s, %" PRIu64 " bytes\n",
           mf_gguf_version(g), mf_gguf_alignment(g), mf_gguf_data_offset(g), mf_gguf_n_parts(g),
           mf_gguf_n_parts(g) == 1 ? "" : "s", mf_gguf_file_size(g));
    printf("\nmetadata (%" PRId64 " keys):\n", nkv);
    /* Every file string is printed escaped (mf_escape): a key or tensor name
     * holding ESC or a newline must not drive the terminal or fake lines. */
    size_t w = 0;
    for (int64_t i = 0; i < nkv; i++) {
        mf_str k = mf_gguf_kv_key(g, i);
        size_t l = strlen(MF_ESCN(k.ptr, (size_t)k.len));
        w = l > w ? l : w;
    }
    for (int64_t i = 0; i < nkv; i++) {
        mf_str k = mf_gguf_kv_key(g, i);
        mf_gguf_vtype t = mf_gguf_kv_type(g, i);
        printf("  %-*s  ", (int)w, MF_ESCN(k.ptr, (size_t)k.len));
        if (t == MF_GGUF_ARRAY) {
            print_array(stdout, g, i, false);
        } else if (t == MF_GGUF_STRING) {
            mf_str s = {0};
            mf_gguf_get_str(g, k.ptr, &s, NULL);
            /* long strings (chat templates) are cut to one line */
            printf("str    ");
            const uint64_t max = 100;
            char esc[4 * 100 + 8];
            fputs(mf_escape(s.ptr, (size_t)(s.len < max ? s.len : max), esc, sizeof esc), stdout);
            if (s.len > max)
                printf("... (%" PRIu64 " bytes)", s.len);
        } else {
            char buf[128];
            mf_gguf_kv_format(g, i, buf, sizeof buf);
            printf("%-6s %s", vtype_name(t), buf);
        }
        putchar('\n');
    }
    if (tensors) {
        printf("\ntensors (%" PRId64 "):\n", nt);
        size_t nw = 4;
        for (int64_t i = 0; i < nt; i++) {
            mf_str nm = mf_gguf_tensor_at(g, i)->name;
            size_t l = strlen(MF_ESCN(nm.ptr, (size_t)nm.len));
            nw = l > nw ? l : nw;
        }
        printf("  %5s  %-*s  %-5s  %-20s  %12s  %12s\n", "#", (int)nw, "name", "type", "shape",
               "offset", "bytes");
        for (int64_t i = 0; i < nt; i++) {
            const mf_gguf_tensor *t = mf_gguf_tensor_at(g, i);
            char shape[96];
            shape_text(t, shape, sizeof shape);
            printf("  %5" PRId64 "  %-*s  %-5s  %-20s  %12" PRIu64 "  %12" PRIu64 "%s\n", i,
                   (int)nw, MF_ESCN(t->name.ptr, (size_t)t->name.len), mf_type_name(t->type), shape,
                   t->offset, t->nbytes,
                   t->part ? " (part)" : "");
        }
    }
    printf("\ntotals: %" PRId64 " tensors, %" PRIu64 " bytes (%.2f MiB), %" PRIu64
           " parameters (%.1fM), %.3f bits per weight, file %" PRIu64 " bytes in %u part%s\n",
           nt, tot.bytes, (double)tot.bytes / (1024.0 * 1024.0), tot.params,
           (double)tot.params / 1e6, tot.params ? 8.0 * (double)tot.bytes / (double)tot.params : 0.0,
           mf_gguf_file_size(g), mf_gguf_n_parts(g), mf_gguf_n_parts(g) == 1 ? "" : "s");
}

static void print_json(const char *path, const mf_gguf *g, bool tensors, totals tot) {
    FILE *f = stdout;
    int64_t nkv = mf_gguf_n_kv(g), nt = mf_gguf_n_tensors(g);
    fputs("{\"file\": ", f);
    json_str(f, path, strlen(path));
    fprintf(f,
            ", \"version\": %u, \"alignment\": %u, \"data_offset\": %" PRIu64 ", \"n_parts\": %u"
            ", \"file_size\": %" PRIu64 ",\n \"metadata\": {",
            mf_gguf_version(g), mf_gguf_alignment(g), mf_gguf_data_offset(g), mf_gguf_n_parts(g),
            mf_gguf_file_size(g));
    for (int64_t i = 0; i < nkv; i++) {
        mf_str k = mf_gguf_kv_key(g, i);
        fputs(i ? ",\n  " : "\n  ", f);
        json_str(f, k.ptr, k.len);
        fputs(": ", f);
        if (mf_gguf_kv_type(g, i) == MF_GGUF_ARRAY)
            print_array(f, g, i, true);
        else
            json_scalar(f, g, i);
    }
    fputs("},\n \"metadata_types\": {", f);
    for (int64_t i = 0; i < nkv; i++) {
        mf_str k = mf_gguf_kv_key(g, i);
        fputs(i ? ", " : "", f);
        json_str(f, k.ptr, k.len);
        fprintf(f, ": \"%s\"", vtype_name(mf_gguf_kv_type(g, i)));
    }
    fputs("}", f);
    if (tensors) {
        fputs(",\n \"tensors\": [", f);
        for (int64_t i = 0; i < nt; i++) {
            const mf_gguf_tensor *t = mf_gguf_tensor_at(g, i);
            fputs(i ? ",\n  {\"name\": " : "\n  {\"name\": ", f);
            json_str(f, t->name.ptr, t->name.len);
            fprintf(f, ", \"type\": \"%s\", \"shape\": [", mf_type_name(t->type));
            for (uint32_t d = 0; d < t->n_dims; d++)
                fprintf(f, "%s%" PRId64, d ? ", " : "", t->ne[d]);
            fprintf(f, "], \"offset\": %" PRIu64 ", \"bytes\": %" PRIu64 ", \"part\": %u}", t->offset,
                    t->nbytes, t->part);
        }
        fputs("]", f);
    }
    fprintf(f,
            ",\n \"totals\": {\"n_tensors\": %" PRId64 ", \"bytes\": %" PRIu64
            ", \"params\": %" PRIu64 ", \"bpw\": ",
            nt, tot.bytes, tot.params);
    json_double(f, tot.params ? 8.0 * (double)tot.bytes / (double)tot.params : 0.0);
    fprintf(f, ", \"file_size\": %" PRIu64 ", \"n_parts\": %u}}\n", mf_gguf_file_size(g),
            mf_gguf_n_parts(g));
}

static void inspect_usage(FILE *f) {
    fprintf(f, "usage: minfer inspect FILE [--json] [--no-tensors]\n"
               "  prints every metadata key (arrays: type, length, first items), the tensor\n"
               "  table (name, type, shape, offset, bytes) and totals (bytes, parameters,\n"
               "  bits per weight, file size, split parts).\n"
               "  --json        one JSON object instead of text\n"
               "  --no-tensors  leave the tensor table out\n");
}

int mf_cmd_inspect(int argc, char **argv) {
    const char *path = NULL;
    bool json = false, tensors = true;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (mf_arg_is_help(a)) {
            inspect_usage(stdout);
            return 0;
        } else if (!strcmp(a, "--json")) {
            json = true;
        } else if (!strcmp(a, "--no-tensors")) {
            tensors = false;
        } else if (a[0] == '-' && a[1] != '\0') {
            fprintf(stderr, "inspect: unknown option '%s' (see 'minfer inspect --help')\n", a);
            return 2;
        } else if (path) {
            fprintf(stderr, "inspect: one file only ('%s' and '%s')\n", path, a);
            return 2;
        } else {
            path = a;
        }
    }
    if (!path) {
        fprintf(stderr, "inspect: missing FILE (see 'minfer inspect --help')\n");
        return 2;
    }
    mf_error err = {{0}};
    mf_gguf *g = NULL;
    if (mf_gguf_open(path, &g, &err)) {
        fprintf(stderr, "inspect: %s\n", err.msg);
        return 1;
    }
    totals tot = {0, 0};
    for (int64_t i = 0; i < mf_gguf_n_tensors(g); i++) {
        const mf_gguf_tensor *t = mf_gguf_tensor_at(g, i);
        uint64_t p = 1;
        for (uint32_t d = 0; d < t->n_dims; d++)
            p *= (uint64_t)t->ne[d];
        tot.params += p;
        tot.bytes += t->nbytes;
    }
    if (json)
        print_json(path, g, tensors, tot);
    else
        print_text(path, g, tensors, tot);
    mf_gguf_close(g);
    return fflush(stdout) == 0 ? 0 : 1;
}
