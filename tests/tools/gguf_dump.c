/* gguf_dump.c - test helper for the GGUF reader and writer.
 *
 *   gguf_dump json FILE [--hash]   prints the file as JSON: header facts, every kv
 *                                  with its full value (nested arrays included),
 *                                  every tensor (and an FNV-1a 64 hash of its
 *                                  bytes with --hash)
 *   gguf_dump copy IN OUT [ALIGN]  rewrites IN as OUT with our writer: every kv
 *                                  through mf_gguf_writer_copy_kv, tensor data
 *                                  streamed in uneven chunks
 *
 * Exit status 0 on success; on failure prints the reader's error and exits 1,
 * so tests can check error messages of the real open path too. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf/gguf.h"
#include "quant/quant.h"

static void json_str(const char *s, uint64_t n) {
    putchar('"');
    for (uint64_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\')
            printf("\\%c", c);
        else if (c < 32 || c == 127)
            printf("\\u%04x", c);
        else
            putchar(c);
    }
    putchar('"');
}

static void json_double(double f, int digits) {
    if (f != f)
        printf("NaN");
    else if (f > 1e308 * 10)
        printf("Infinity");
    else if (f < -1e308 * 10)
        printf("-Infinity");
    else
        printf("%.*g", digits, f);
}

/* Prints array node kv as a JSON list (recursing into nested arrays). */
static void json_arr(const mf_gguf *g, int64_t kv) {
    mf_gguf_vtype et = mf_gguf_arr_type(g, kv);
    uint64_t n = mf_gguf_arr_n(g, kv);
    putchar('[');
    for (uint64_t i = 0; i < n; i++) {
        if (i)
            putchar(',');
        if (et == MF_GGUF_STRING) {
            mf_str s = mf_gguf_arr_str(g, kv, i);
            json_str(s.ptr, s.len);
        } else if (et == MF_GGUF_ARRAY) {
            json_arr(g, mf_gguf_arr_sub(g, kv, i));
        } else if (et == MF_GGUF_FLOAT32 || et == MF_GGUF_FLOAT64) {
            json_double(mf_gguf_arr_float(g, kv, i), et == MF_GGUF_FLOAT32 ? 9 : 17);
        } else if (et == MF_GGUF_BOOL) {
            printf("%s", mf_gguf_arr_int(g, kv, i) ? "true" : "false");
        } else if (et == MF_GGUF_UINT64) {
            printf("%llu", (unsigned long long)(uint64_t)mf_gguf_arr_int(g, kv, i));
        } else {
            printf("%lld", (long long)mf_gguf_arr_int(g, kv, i));
        }
    }
    putchar(']');
}

static const char *vtype_name(mf_gguf_vtype t) {
    static const char *const names[] = {"uint8", "int8", "uint16", "int16", "uint32", "int32", "float32",
                                        "bool", "string", "array", "uint64", "int64", "float64"};
    return (unsigned)t < sizeof names / sizeof names[0] ? names[t] : "?";
}

static uint64_t fnv1a(const void *p, uint64_t n) {
    const unsigned char *b = p;
    uint64_t h = 1469598103934665603ull;
    for (uint64_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

static int cmd_json(const char *path, int hash) {
    mf_gguf *g;
    mf_error err;
    if (mf_gguf_open(path, &g, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    printf("{\"version\":%u,\"alignment\":%u,\"data_offset\":%llu,\"n_parts\":%u,\"file_size\":%llu,\n",
           mf_gguf_version(g), mf_gguf_alignment(g), (unsigned long long)mf_gguf_data_offset(g),
           mf_gguf_n_parts(g), (unsigned long long)mf_gguf_file_size(g));
    printf("\"kv\":[\n");
    for (int64_t i = 0; i < mf_gguf_n_kv(g); i++) {
        mf_str k = mf_gguf_kv_key(g, i);
        mf_gguf_vtype t = mf_gguf_kv_type(g, i);
        char text[256];
        mf_gguf_kv_format(g, i, text, sizeof text);
        printf("%s{\"key\":", i ? ",\n" : "");
        json_str(k.ptr, k.len);
        printf(",\"type\":\"%s\"", vtype_name(t));
        if (t == MF_GGUF_ARRAY)
            printf(",\"elem\":\"%s\"", vtype_name(mf_gguf_arr_type(g, i)));
        printf(",\"text\":");
        json_str(text, strlen(text));
        printf(",\"value\":");
        if (t == MF_GGUF_ARRAY) {
            json_arr(g, i);
        } else if (t == MF_GGUF_STRING) {
            mf_str s;
            mf_gguf_get_str(g, k.ptr, &s, &err);
            json_str(s.ptr, s.len);
        } else {
            /* the display text of a scalar is valid JSON except for non-finite floats */
            if (t == MF_GGUF_FLOAT32 || t == MF_GGUF_FLOAT64) {
                float f;
                mf_gguf_get_f32(g, k.ptr, &f, &err);
                if (f != f || f - f != 0)
                    json_double(f, 9);
                else
                    printf("%s", text);
            } else {
                printf("%s", text);
            }
        }
        putchar('}');
    }
    printf("],\n\"tensors\":[\n");
    for (int64_t i = 0; i < mf_gguf_n_tensors(g); i++) {
        const mf_gguf_tensor *t = mf_gguf_tensor_at(g, i);
        printf("%s{\"name\":", i ? ",\n" : "");
        json_str(t->name.ptr, t->name.len);
        printf(",\"type\":%u,\"type_name\":\"%s\",\"ne\":[", t->type, mf_type_name(t->type));
        for (uint32_t d = 0; d < t->n_dims; d++)
            printf("%s%lld", d ? "," : "", (long long)t->ne[d]);
        printf("],\"offset\":%llu,\"nbytes\":%llu,\"part\":%u", (unsigned long long)t->offset,
               (unsigned long long)t->nbytes, t->part);
        if (hash)
            printf(",\"fnv\":\"%016llx\"", (unsigned long long)fnv1a(t->data, t->nbytes));
        putchar('}');
    }
    printf("]}\n");
    mf_gguf_close(g);
    return 0;
}

static int cmd_copy(const char *in, const char *outp, uint32_t align) {
    mf_gguf *g;
    mf_error err;
    if (mf_gguf_open(in, &g, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    mf_gguf_writer *w = mf_gguf_writer_new();
    if (align)
        mf_gguf_writer_set_alignment(w, align);
    for (int64_t i = 0; i < mf_gguf_n_kv(g); i++)
        mf_gguf_writer_copy_kv(w, g, i);
    int rc = 0;
    for (int64_t i = 0; i < mf_gguf_n_tensors(g) && rc == 0; i++) {
        const mf_gguf_tensor *t = mf_gguf_tensor_at(g, i);
        rc = mf_gguf_writer_add_tensor(w, t->name.ptr, t->type, t->n_dims, t->ne, &err) < 0;
    }
    if (rc == 0)
        rc = mf_gguf_writer_begin(w, outp, &err) != 0;
    for (int64_t i = 0; i < mf_gguf_n_tensors(g) && rc == 0; i++) {
        const mf_gguf_tensor *t = mf_gguf_tensor_at(g, i);
        /* uneven chunks exercise tensors written over several calls */
        const unsigned char *p = t->data;
        uint64_t left = t->nbytes, chunk = 1 + (uint64_t)i * 7 % 61;
        while (left > 0 && rc == 0) {
            uint64_t k = left < chunk ? left : chunk;
            rc = mf_gguf_writer_write(w, p, (size_t)k, &err) != 0;
            p += k;
            left -= k;
            chunk = chunk * 3 + 5;
        }
    }
    if (rc == 0)
        rc = mf_gguf_writer_finish(w, &err) != 0;
    if (rc)
        fprintf(stderr, "%s\n", err.msg);
    mf_gguf_writer_free(w);
    mf_gguf_close(g);
    return rc;
}

int main(int argc, char **argv) {
    if (argc >= 3 && strcmp(argv[1], "json") == 0)
        return cmd_json(argv[2], argc > 3 && strcmp(argv[3], "--hash") == 0);
    if (argc >= 4 && strcmp(argv[1], "copy") == 0)
        return cmd_copy(argv[2], argv[3], argc > 4 ? (uint32_t)strtoul(argv[4], NULL, 10) : 0);
    fprintf(stderr, "usage: gguf_dump json FILE [--hash] | copy IN OUT [ALIGN]\n");
    return 2;
}
