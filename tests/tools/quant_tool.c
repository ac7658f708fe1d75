/* quant_tool.c - drives the reference quantizers from tests.
 *
 *   quant_tool quantize   TYPE N_PER_ROW IN.f32 OUT.bin   raw f32 -> quantized rows
 *   quant_tool dequantize TYPE N_PER_ROW IN.bin OUT.f32   quantized rows -> raw f32
 *   quant_tool types                                      one line per known type:
 *                                                         id name block_size type_size
 *                                                         is_quantized can_dequant can_quant
 *
 * TYPE is a name as mf_type_from_name reads it ("q4_K", "Q8_0"). The input
 * must hold a whole number of rows; anything else is refused with a message
 * naming the sizes (exit status 1). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant/quant.h"

static int fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "quant_tool: ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return 1;
}

/* Reads a whole file into a malloc'd buffer; returns NULL on failure. */
static void *read_file(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    if (fseek(f, 0, SEEK_END) != 0) {
        fclose(f);
        return NULL;
    }
    long n = ftell(f);
    if (n < 0 || fseek(f, 0, SEEK_SET) != 0) {
        fclose(f);
        return NULL;
    }
    void *buf = malloc((size_t)n + 1);
    if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        fclose(f);
        return NULL;
    }
    fclose(f);
    *size = (size_t)n;
    return buf;
}

static int write_file(const char *path, const void *buf, size_t size) {
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    size_t w = fwrite(buf, 1, size, f);
    int rc = fclose(f);
    return (w == size && rc == 0) ? 0 : -1;
}

int main(int argc, char **argv) {
    if (argc == 2 && strcmp(argv[1], "types") == 0) {
        for (uint32_t t = 0; t < MF_TYPE_COUNT; t++) {
            const mf_type_traits *tr = mf_type_get(t);
            if (tr)
                printf("%u %s %lld %zu %d %d %d\n", t, tr->name, (long long)tr->block_size, tr->type_size,
                       tr->is_quantized, tr->to_float != NULL, tr->from_float != NULL);
        }
        return 0;
    }
    if (argc != 6 || (strcmp(argv[1], "quantize") != 0 && strcmp(argv[1], "dequantize") != 0)) {
        fprintf(stderr, "usage: quant_tool quantize|dequantize TYPE N_PER_ROW IN OUT | quant_tool types\n");
        return 2;
    }
    const int quantize = strcmp(argv[1], "quantize") == 0;
    const int type = mf_type_from_name(argv[2]);
    const mf_type_traits *tr = type >= 0 ? mf_type_get((uint32_t)type) : NULL;
    if (!tr)
        return fail("unknown type '%s'", argv[2]);
    char *end = NULL;
    const long long n = strtoll(argv[3], &end, 10);
    if (!end || *end || n <= 0 || n % tr->block_size != 0)
        return fail("type %s: row length %lld is not a positive multiple of block size %lld", tr->name, n,
                    (long long)tr->block_size);
    if (quantize ? !tr->from_float : !tr->to_float)
        return fail("type %s: no reference %s", tr->name, quantize ? "quantizer" : "dequantizer");

    size_t in_size = 0;
    void *in = read_file(argv[4], &in_size);
    if (!in)
        return fail("cannot read '%s'", argv[4]);
    const size_t row_q = mf_type_row_size((uint32_t)type, n);
    const size_t row_f = (size_t)n * sizeof(float);
    const size_t in_row = quantize ? row_f : row_q, out_row = quantize ? row_q : row_f;
    if (in_size == 0 || in_size % in_row != 0) {
        free(in);
        return fail("input '%s': %lld bytes is not a whole number of %lld-byte rows", argv[4],
                    (long long)in_size, (long long)in_row);
    }
    const int64_t nrows = (int64_t)(in_size / in_row);
    void *out = malloc((size_t)nrows * out_row);
    if (!out) {
        free(in);
        return fail("out of memory for '%s' (%lld rows of %lld bytes)", argv[5], (long long)nrows, (long long)out_row);
    }
    if (quantize)
        mf_quantize_rows((uint32_t)type, in, out, nrows, n);
    else
        mf_dequantize_rows((uint32_t)type, in, out, nrows, n);
    int rc = write_file(argv[5], out, (size_t)nrows * out_row);
    free(in);
    free(out);
    if (rc != 0)
        return fail("cannot write '%s'", argv[5]);
    return 0;
}
