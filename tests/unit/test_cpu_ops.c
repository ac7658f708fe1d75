/* test_cpu_ops.c - rmsnorm, rope, elementwise ops, KV cache rows and attention
 * against float64 references written from the math in semantics.md. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/kernels.h"
#include "backend/cpu/kernels_isa.h"
#include "mf_test.h"

static uint64_t rng_state = 0x243f6a8885a308d3ull;
static float rng_uniform(void) {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (float)((z >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}
static void rand_floats(float *x, int64_t n, float s) {
    for (int64_t i = 0; i < n; i++)
        x[i] = rng_uniform() * s;
}

MF_TEST(rmsnorm_vs_f64) {
    const int64_t n = 4864, rows = 9;
    float *x = malloc(sizeof(float) * n * rows), *w = malloc(sizeof(float) * n);
    float *y = malloc(sizeof(float) * n * rows), *x2 = malloc(sizeof(float) * n * rows);
    rand_floats(x, n * rows, 40.0f);
    rand_floats(w, n, 2.0f);
    memcpy(x2, x, sizeof(float) * n * rows);
    mf_cpu_ctx *c = mf_cpu_ctx_new(2);
    mf_cpu_rmsnorm(c, x, w, y, n, rows, 1e-5f);
    mf_cpu_rmsnorm(c, x2, w, x2, n, rows, 1e-5f); /* in place */
    CHECK(memcmp(x2, y, sizeof(float) * n * rows) == 0);
    double maxrel = 0;
    for (int64_t r = 0; r < rows; r++) {
        double ss = 0;
        for (int64_t i = 0; i < n; i++)
            ss += (double)x[r * n + i] * x[r * n + i];
        const double inv = 1.0 / sqrt(ss / n + 1e-5);
        for (int64_t i = 0; i < n; i++) {
            const double ref = x[r * n + i] * inv * w[i];
            maxrel = fmax(maxrel, fabs(y[r * n + i] - ref) / (fabs(ref) + 1e-6));
        }
    }
    CHECK_MSG(maxrel < 1e-6, "max rel err %g", maxrel);
    /* no weight */
    mf_cpu_rmsnorm(c, x, NULL, y, n, 1, 1e-6f);
    double ss = 0;
    for (int64_t i = 0; i < n; i++)
        ss += (double)y[i] * y[i];
    CHECK_NEAR(ss / n, 1.0, 1e-4);
    mf_cpu_ctx_free(c);
    free(x);
    free(w);
    free(y);
    free(x2);
}

static void rope_ref(double *v, int head_dim, int n_rot, int pos, int neox, double theta, double fs) {
    (void)head_dim;
    for (int i = 0; i < n_rot / 2; i++) {
        const double a = pos * fs * pow(theta, -2.0 * i / n_rot);
        const int i0 = neox ? i : 2 * i, i1 = neox ? i + n_rot / 2 : 2 * i + 1;
        const double x0 = v[i0], x1 = v[i1];
        v[i0] = x0 * cos(a) - x1 * sin(a);
        v[i1] = x0 * sin(a) + x1 * cos(a);
    }
}

MF_TEST(rope_both_modes) {
    const int nt = 5, n_head = 3, head_dim = 64;
    const int32_t pos[5] = {0, 1, 17, 500, 4095};
    const int rots[2] = {64, 32};
    for (int mode = 0; mode <= 2; mode += 2)
        for (int ri = 0; ri < 2; ri++) {
            const int n_rot = rots[ri];
            float x[5 * 3 * 64], x0[5 * 3 * 64];
            rand_floats(x, nt * n_head * head_dim, 1.0f);
            memcpy(x0, x, sizeof x);
            mf_cpu_rope(NULL, x, nt, n_head, head_dim, n_rot, pos, mode, 10000.0f, 0.5f);
            double maxerr = 0;
            int passthrough_ok = 1;
            for (int t = 0; t < nt; t++)
                for (int h = 0; h < n_head; h++) {
                    double v[64];
                    const int off = (t * n_head + h) * head_dim;
                    for (int i = 0; i < head_dim; i++)
                        v[i] = x0[off + i];
                    rope_ref(v, head_dim, n_rot, pos[t], mode == 2, 10000.0, 0.5);
                    for (int i = 0; i < head_dim; i++)
                        maxerr = fmax(maxerr, fabs(x[off + i] - v[i]));
                    for (int i = n_rot; i < head_dim; i++)
                        passthrough_ok &= x[off + i] == x0[off + i];
                }
            CHECK_MSG(maxerr < 2e-6, "mode %d n_rot %d: max err %g", mode, n_rot, maxerr);
            CHECK(passthrough_ok);
        }
    /* the two modes differ (a mode mix-up would pass a one-mode test) */
    float a[64], b[64];
    const int32_t p = 7;
    rand_floats(a, 64, 1.0f);
    memcpy(b, a, sizeof a);
    mf_cpu_rope(NULL, a, 1, 1, 64, 64, &p, 0, 10000.0f, 1.0f);
    mf_cpu_rope(NULL, b, 1, 1, 64, 64, &p, 2, 10000.0f, 1.0f);
    CHECK(memcmp(a, b, sizeof a) != 0);
}

MF_TEST(elementwise) {
    float a[37], b[37], y[37];
    rand_floats(a, 37, 6.0f);
    rand_floats(b, 37, 3.0f);
    mf_cpu_add(a, b, y, 37);
    for (int i = 0; i < 37; i++)
        CHECK(y[i] == a[i] + b[i]);
    mf_cpu_mul(a, b, y, 37);
    for (int i = 0; i < 37; i++)
        CHECK(y[i] == a[i] * b[i]);
    mf_cpu_scale(a, 0.25f, y, 37);
    for (int i = 0; i < 37; i++)
        CHECK(y[i] == a[i] * 0.25f);
    mf_cpu_silu(a, y, 37);
    for (int i = 0; i < 37; i++)
        CHECK_NEAR(y[i], a[i] / (1.0 + exp(-(double)a[i])), 1e-6 * (1 + fabs(a[i])));
    mf_cpu_swiglu(a, b, y, 37);
    for (int i = 0; i < 37; i++)
        CHECK_NEAR(y[i], a[i] / (1.0 + exp(-(double)a[i])) * b[i], 1e-6 * (1 + fabs(a[i] * b[i])));
    /* the pooled swiglu: the same bits as one thread, in place too */
    {
        const int64_t n = 70001;
        float *g = malloc(sizeof(float) * n), *u = malloc(sizeof(float) * n);
        float *y1 = malloc(sizeof(float) * n), *y2 = malloc(sizeof(float) * n);
        rand_floats(g, n, 8.0f);
        rand_floats(u, n, 2.0f);
        mf_cpu_ctx *c2 = mf_cpu_ctx_new(2);
        mf_cpu_swiglu(g, u, y1, n);
        mf_cpu_swiglu_mt(c2, g, u, y2, n);
        CHECK(memcmp(y1, y2, sizeof(float) * n) == 0);
        mf_cpu_swiglu_mt(c2, g, u, g, n);
        CHECK(memcmp(y1, g, sizeof(float) * n) == 0);
        mf_cpu_ctx_free(c2);
        free(g);
        free(u);
        free(y1);
        free(y2);
    }
    float s[37];
    memcpy(s, a, sizeof s);
    mf_cpu_softmax(s, 37, 0.7f);
    double mx = -1e30, sum = 0;
    for (int i = 0; i < 37; i++)
        mx = fmax(mx, 0.7 * a[i]);
    for (int i = 0; i < 37; i++)
        sum += exp(0.7 * a[i] - mx);
    for (int i = 0; i < 37; i++)
        CHECK_NEAR(s[i], exp(0.7 * a[i] - mx) / sum, 1e-6);
}

#if defined(__x86_64__)
/* The AVX-512 exp / silu / swiglu / rmsnorm (ops_avx512.c) against float64:
 * exp within 3 ulp over its whole range (plus 0 below the denormals, inf
 * above 88.72, NaN kept), silu / swiglu within a few ulp at every length
 * mod 16, rmsnorm within 2 ulp of the float64 value at n not a multiple of 16. */
MF_TEST(avx512_row_ops_vs_f64) {
    if (mf_cpu_isa_best() < MF_ISA_AVX512) {
        printf("  (avx512 not available here)\n");
        return;
    }
    enum { N = 4901 };
    float *x = malloc(sizeof(float) * N), *y = malloc(sizeof(float) * N), *u = malloc(sizeof(float) * N);
    for (int i = 0; i < N; i++)
        x[i] = -103.0f + 191.0f * (float)i / (N - 1) + 0.01f * rng_uniform();
    mf_cpu_exp_avx512(x, y, N);
    double worst = 0;
    for (int i = 0; i < N; i++) {
        const double ref = exp((double)x[i]);
        if (ref < 1.1754944e-38)
            CHECK(fabs(y[i] - ref) <= 1.5e-45 * 4); /* denormal range: absolute */
        else
            worst = fmax(worst, fabs(y[i] - ref) / ref);
    }
    CHECK_MSG(worst < 3 * 5.97e-8, "exp worst rel err %g", worst);
    const float sp[4] = {-1e30f, 1e30f, NAN, 0.0f};
    float so[4];
    mf_cpu_exp_avx512(sp, so, 4);
    CHECK(so[0] == 0.0f && isinf(so[1]) && isnan(so[2]) && so[3] == 1.0f);

    rand_floats(x, N, 12.0f);
    rand_floats(u, N, 3.0f);
    for (int n = 1; n <= 33; n++) {
        mf_cpu_silu_avx512(x, y, n);
        for (int i = 0; i < n; i++) {
            const double ref = x[i] / (1.0 + exp(-(double)x[i]));
            CHECK_NEAR(y[i], ref, 4e-7 * fabs(ref) + 1e-30);
        }
        mf_cpu_swiglu_avx512(x, u, y, n);
        for (int i = 0; i < n; i++) {
            const double ref = x[i] / (1.0 + exp(-(double)x[i])) * u[i];
            CHECK_NEAR(y[i], ref, 5e-7 * fabs(ref) + 1e-30);
        }
    }
    const int64_t nn = 4863;
    rand_floats(x, nn, 30.0f);
    mf_cpu_rmsnorm_row_avx512(x, u, y, nn, 1e-6f);
    double ss = 0;
    for (int64_t i = 0; i < nn; i++)
        ss += (double)x[i] * x[i];
    const double r = 1.0 / sqrt(ss / nn + 1e-6);
    for (int64_t i = 0; i < nn; i++)
        CHECK_NEAR(y[i], x[i] * r * u[i], 2.4e-7 * fabs(x[i] * r * u[i]) + 1e-30);
    free(x);
    free(y);
    free(u);
}
#endif

MF_TEST(kv_store_load) {
    const int64_t kv_dim = 160, n = 6;
    float src[6 * 160], back[6 * 160];
    rand_floats(src, n * kv_dim, 3.0f);
    const uint32_t types[3] = {MF_TYPE_F32, MF_TYPE_F16, MF_TYPE_Q8_0};
    const double tol[3] = {0, 3.0 / 1024, 3.0 / 127 * 0.6};
    for (int k = 0; k < 3; k++) {
        void *cache = malloc(8 * kv_dim * 4);
        mf_cpu_kv_store(types[k], cache, kv_dim, 0, src, 2);
        mf_cpu_kv_store(types[k], cache, kv_dim, 2, src + 2 * kv_dim, 4);
        mf_cpu_kv_load(types[k], cache, kv_dim, n, back);
        double maxerr = 0;
        for (int64_t i = 0; i < n * kv_dim; i++)
            maxerr = fmax(maxerr, fabs(back[i] - src[i]));
        CHECK_MSG(maxerr <= tol[k], "%s: max err %g", mf_type_name(types[k]), maxerr);
        free(cache);
    }
}

/* Float64 causal GQA attention over float K/V rows (n_ctx x kv_dim). */
static void attn_ref(const float *q, int nt, int n_head, int n_head_kv, int hd, const float *k, const float *v,
                     int n_past, double scale, double *out) {
    const int kv_dim = n_head_kv * hd, group = n_head / n_head_kv;
    double *sc = malloc(sizeof(double) * (size_t)(n_past + nt));
    for (int t = 0; t < nt; t++)
        for (int h = 0; h < n_head; h++) {
            const float *qh = q + (t * n_head + h) * hd;
            const int kvh = h / group, n_kv = n_past + t + 1;
            double mx = -1e300, sum = 0;
            for (int r = 0; r < n_kv; r++) {
                double s = 0;
                for (int i = 0; i < hd; i++)
                    s += (double)qh[i] * k[r * kv_dim + kvh * hd + i];
                sc[r] = s * scale;
                mx = fmax(mx, sc[r]);
            }
            for (int r = 0; r < n_kv; r++)
                sum += (sc[r] = exp(sc[r] - mx));
            for (int i = 0; i < hd; i++) {
                double o = 0;
                for (int r = 0; r < n_kv; r++)
                    o += sc[r] * v[r * kv_dim + kvh * hd + i];
                out[(t * n_head + h) * hd + i] = o / sum;
            }
        }
    free(sc);
}

MF_TEST(attention_vs_f64) {
    const int n_head_kv = 2, groups[4] = {1, 3, 7, 10}, pasts[3] = {0, 5, 37}, nts[2] = {1, 4}, hds[2] = {64, 80};
    const uint32_t types[3] = {MF_TYPE_F32, MF_TYPE_F16, MF_TYPE_Q8_0};
    mf_cpu_ctx *c1 = mf_cpu_ctx_new(1), *c2 = mf_cpu_ctx_new(2);
    int cases = 0;
    for (int gi = 0; gi < 4; gi++) /* 10: more query heads than one register block (8) */
        for (int pi = 0; pi < 3; pi++)
            for (int ni = 0; ni < 2; ni++)
                for (int hi = 0; hi < 2; hi++)
                    for (int ki = 0; ki < 3; ki++) {
                        const int n_head = n_head_kv * groups[gi], hd = hds[hi], nt = nts[ni], n_past = pasts[pi];
                        const int kv_dim = n_head_kv * hd, n_ctx = n_past + nt;
                        const size_t qn = (size_t)nt * n_head * hd;
                        float *q = malloc(sizeof(float) * qn), *kf = malloc(sizeof(float) * n_ctx * kv_dim);
                        float *vf = malloc(sizeof(float) * n_ctx * kv_dim);
                        float *kl = malloc(sizeof(float) * n_ctx * kv_dim), *vl = malloc(sizeof(float) * n_ctx * kv_dim);
                        float *o1 = malloc(sizeof(float) * qn), *o2 = malloc(sizeof(float) * qn);
                        double *ref = malloc(sizeof(double) * qn), *ref_l = malloc(sizeof(double) * qn);
                        void *kc = malloc((size_t)n_ctx * kv_dim * 4), *vc = malloc((size_t)n_ctx * kv_dim * 4);
                        rand_floats(q, (int64_t)qn, 1.0f);
                        rand_floats(kf, (int64_t)n_ctx * kv_dim, 1.5f);
                        rand_floats(vf, (int64_t)n_ctx * kv_dim, 2.0f);
                        mf_cpu_kv_store(types[ki], kc, kv_dim, 0, kf, n_ctx);
                        mf_cpu_kv_store(types[ki], vc, kv_dim, 0, vf, n_ctx);
                        mf_cpu_kv_load(types[ki], kc, kv_dim, n_ctx, kl);
                        mf_cpu_kv_load(types[ki], vc, kv_dim, n_ctx, vl);
                        for (size_t i = 0; i < qn; i++)
                            o1[i] = o2[i] = NAN;
                        const float scale = 1.0f / sqrtf((float)hd);
                        mf_cpu_attn(c1, q, nt, n_head, n_head_kv, hd, kc, vc, types[ki], types[ki], n_past, scale, false, o1);
                        mf_cpu_attn(c2, q, nt, n_head, n_head_kv, hd, kc, vc, types[ki], types[ki], n_past, scale, false, o2);
                        attn_ref(q, nt, n_head, n_head_kv, hd, kf, vf, n_past, scale, ref);
                        attn_ref(q, nt, n_head, n_head_kv, hd, kl, vl, n_past, scale, ref_l);
                        double e_orig = 0, e_cache = 0;
                        for (size_t i = 0; i < qn; i++) {
                            e_orig = fmax(e_orig, fabs(o1[i] - ref[i]));
                            e_cache = fmax(e_cache, fabs(o1[i] - ref_l[i]));
                        }
                        /* against the cache's own values: float rounding only;
                         * against the original floats: the cache type's rounding */
                        const double tol_orig = ki == 0 ? 2e-6 : ki == 1 ? 5e-3 : 5e-2;
                        CHECK_MSG(e_cache <= 2e-6 && e_orig <= tol_orig,
                                  "%s group %d n_past %d nt %d hd %d: err %g vs cache, %g vs f32",
                                  mf_type_name(types[ki]), groups[gi], n_past, nt, hd, e_cache, e_orig);
                        CHECK(memcmp(o1, o2, sizeof(float) * qn) == 0);
                        cases++;
                        free(q); free(kf); free(vf); free(kl); free(vl); free(o1); free(o2);
                        free(ref); free(ref_l); free(kc); free(vc);
                    }
    printf("  %d attention cases\n", cases);
    mf_cpu_ctx_free(c1);
    mf_cpu_ctx_free(c2);
}

/* Causality: changing cache rows beyond n_past + t must not change token t. */
MF_TEST(attention_is_causal) {
    const int n_head = 4, n_head_kv = 2, hd = 64, kv_dim = 128, nt = 3, n_past = 4;
    float q[3 * 4 * 64], k[7 * 128], v[7 * 128], o1[3 * 4 * 64], o2[3 * 4 * 64];
    rand_floats(q, sizeof q / 4, 1.0f);
    rand_floats(k, sizeof k / 4, 1.0f);
    rand_floats(v, sizeof v / 4, 1.0f);
    mf_cpu_ctx *c = mf_cpu_ctx_new(2);
    mf_cpu_attn(c, q, nt, n_head, n_head_kv, hd, k, v, MF_TYPE_F32, MF_TYPE_F32, n_past, 0.125f, false, o1);
    for (int i = 0; i < kv_dim; i++) {
        k[6 * kv_dim + i] += 5.0f; /* row 6: only token 2 sees it */
        v[6 * kv_dim + i] -= 5.0f;
    }
    mf_cpu_attn(c, q, nt, n_head, n_head_kv, hd, k, v, MF_TYPE_F32, MF_TYPE_F32, n_past, 0.125f, false, o2);
    CHECK(memcmp(o1, o2, sizeof(float) * 2 * n_head * hd) == 0);
    CHECK(memcmp(o1 + 2 * n_head * hd, o2 + 2 * n_head * hd, sizeof(float) * n_head * hd) != 0);
    mf_cpu_ctx_free(c);
}

MF_TEST_MAIN(MF_T(rmsnorm_vs_f64), MF_T(rope_both_modes), MF_T(elementwise),
#if defined(__x86_64__)
             MF_T(avx512_row_ops_vs_f64),
#endif
             MF_T(kv_store_load),
             MF_T(attention_vs_f64), MF_T(attention_is_causal))
