/* test_cpu_batch_tiles.c - the multi-token matmul (batched decode, prefill
 * tiles) gives every (row, token) the bits of the one-token dot kernel of
 * the same ISA: a sequence decoded in a batch of B gets the logits it gets
 * alone. Checked at the models' real widths, with batch sizes that leave
 * every remainder of the eight-token groups and the 16-token tiles, row
 * counts that leave partial 16-row tiles, on 1 and 2 threads. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/kernels.h"
#include "mf_test.h"
#include "quant/quant.h"

static uint32_t rng = 12345;
static float frand(void) {
    rng = rng * 1664525u + 1013904223u;
    return (float)((rng >> 8) & 0xffff) / 32768.0f - 1.0f;
}

/* Quantized random weights, some rows scaled up so the scales vary. */
static void make_weights(uint32_t wt, void *w, int64_t n_in, int64_t rows) {
    float *f = malloc(sizeof(float) * (size_t)(n_in * rows));
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < n_in; i++)
            f[r * n_in + i] = frand() * (r % 3 == 0 ? 0.5f : 0.05f);
    mf_quantize_rows(wt, f, w, rows, n_in);
    free(f);
}

MF_TEST(batch_matmul_equals_one_token_dot) {
    const uint32_t types[] = {MF_TYPE_Q4_0, MF_TYPE_Q4_1, MF_TYPE_Q8_0};
    const int64_t widths[] = {576, 896, 1536, 4864};
    const int64_t nts[] = {2, 5, 7, 8, 13, 16, 21};
    const int64_t n_out = 37;
    mf_cpu_ctx *c1 = mf_cpu_ctx_new(1), *c2 = mf_cpu_ctx_new(2);
    int cases = 0;
    for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++)
        for (size_t wi = 0; wi < sizeof widths / sizeof *widths; wi++) {
            const uint32_t wt = types[ti];
            const int64_t n_in = widths[wi], nt_max = 21;
            const mf_cpu_dot *d = mf_cpu_dot_get(wt, mf_cpu_ctx_isa(c1));
            const size_t wr = mf_type_row_size(wt, n_in), ar = mf_type_row_size(d->act_type, n_in);
            uint8_t *w = malloc(wr * n_out), *a = malloc(ar * nt_max);
            float *x = malloc(sizeof(float) * (size_t)(n_in * nt_max));
            float *y1 = malloc(sizeof(float) * (size_t)(n_out * nt_max));
            float *y2 = malloc(sizeof(float) * (size_t)(n_out * nt_max));
            make_weights(wt, w, n_in, n_out);
            for (int64_t i = 0; i < n_in * nt_max; i++)
                x[i] = frand() * (i % 97 == 0 ? 8.0f : 1.0f);
            for (int64_t t = 0; t < nt_max; t++)
                mf_cpu_quantize_act(d->act_type, x + t * n_in, a + t * ar, n_in, MF_ISA_SCALAR);
            for (size_t ni = 0; ni < sizeof nts / sizeof *nts; ni++) {
                const int64_t nt = nts[ni];
                mf_cpu_matmul(c1, wt, w, n_in, n_out, x, nt, y1);
                mf_cpu_matmul(c2, wt, w, n_in, n_out, x, nt, y2);
                int bad = 0;
                for (int64_t t = 0; t < nt; t++)
                    for (int64_t o = 0; o < n_out; o++) {
                        float s;
                        d->dot(n_in, &s, w + o * wr, a + t * ar);
                        bad += memcmp(&s, &y1[t * n_out + o], sizeof s) != 0;
                        bad += memcmp(&s, &y2[t * n_out + o], sizeof s) != 0;
                    }
                CHECK_MSG(bad == 0, "%s n_in=%lld nt=%lld: %d outputs differ from the one-token dot",
                          mf_type_name(wt), (long long)n_in, (long long)nt, bad);
                cases++;
            }
            free(w);
            free(a);
            free(x);
            free(y1);
            free(y2);
        }
    printf("  %d (type, width, batch) cases bit-equal to the one-token dot (isa %s)\n", cases,
           mf_cpu_isa_name(mf_cpu_ctx_isa(c1)));
    mf_cpu_ctx_free(c1);
    mf_cpu_ctx_free(c2);
}

MF_TEST_MAIN(MF_T(batch_matmul_equals_one_token_dot))
