/* ops.c - row and elementwise ops: rmsnorm, rope, add/mul/scale, silu,
 * swiglu, softmax.
 *
 * Plain loops the compiler vectorizes; reductions whose order matters are
 * written with explicit independent accumulators or in double, so the result
 * does not depend on what the vectorizer did. Rows are independent, so any
 * split across threads gives the same bits. On AVX-512 CPUs rmsnorm, silu and
 * swiglu run ops_avx512.c's versions (a polynomial exp, other summation
 * order: within a few ulps of these, not bit-equal). */
#include <math.h>
#include <stdlib.h>

#include "backend/cpu/kernels_isa.h"

/* ==== rmsnorm ============================================================== */

typedef struct norm_job {
    const float *x, *w;
    float *y;
    int64_t n, nrows;
    float eps;
    bool avx512;
} norm_job;

static void rmsnorm_row(const float *x, const float *w, float *y, int64_t n, float eps) {
    /* the mean of squares in double: a 18944-wide row of large activations
     * loses digits in a float running sum */
    double ss = 0;
    for (int64_t i = 0; i < n; i++)
        ss += (double)x[i] * (double)x[i];
    const float r = (float)(1.0 / sqrt(ss / (double)n + (double)eps));
    if (w) {
        for (int64_t i = 0; i < n; i++)
            y[i] = x[i] * r * w[i];
    } else {
        for (int64_t i = 0; i < n; i++)
            y[i] = x[i] * r;
    }
}

static void norm_worker(void *vjob, int ith, int nth) {
    const norm_job *j = vjob;
    for (int64_t r = ith; r < j->nrows; r += nth) {
#if MF_CPU_X86
        if (j->avx512) {
            mf_cpu_rmsnorm_row_avx512(j->x + r * j->n, j->w, j->y + r * j->n, j->n, j->eps);
            continue;
        }
#endif
        rmsnorm_row(j->x + r * j->n, j->w, j->y + r * j->n, j->n, j->eps);
    }
}

void mf_cpu_rmsnorm(mf_cpu_ctx *c, const float *x, const float *w, float *y, int64_t n,
                    int64_t nrows, float eps) {
    const mf_cpu_isa isa = c ? mf_cpu_ctx_isa(c) : mf_cpu_isa_default();
    norm_job j = {x, w, y, n, nrows, eps, isa == MF_ISA_AVX512};
    /* a batch of decode rows (8 x 896) is microseconds of work: less than
     * waking the pool, which on a loaded machine costs far more */
    if (c && nrows >= 8 && nrows * n >= 32768)
        mf_pool_run(mf_cpu_ctx_pool(c), norm_worker, &j);
    else
        norm_worker(&j, 0, 1);
}

/* ==== rope ================================================================= */

/* Rotates each head's first n_rot dims of every token by angle
 * pos[t] * freq_scale * theta^(-2i/n_rot) for pair i; NORMAL mode pairs
 * (2i, 2i+1), NEOX (mode bit 2) pairs (i, i + n_rot/2). The angle and its
 * sine/cosine are computed in double once per (token, pair) and shared across
 * heads. */
void mf_cpu_rope(mf_cpu_ctx *c, float *x, int64_t nt, int32_t n_head, int32_t head_dim,
                 int32_t n_rot, const int32_t *pos, int32_t mode, float theta, float freq_scale) {
    MF_ASSERT(n_rot > 0 && n_rot % 2 == 0 && n_rot <= head_dim);
    const int half = n_rot / 2;
    float *cs = mf_malloc(sizeof(float) * 2 * (size_t)half);
    double *inv = mf_malloc(sizeof(double) * (size_t)half);
    for (int i = 0; i < half; i++)
        inv[i] = pow((double)theta, -2.0 * i / (double)n_rot);
    const bool neox = (mode & 2) != 0;
    for (int64_t t = 0; t < nt; t++) {
        for (int i = 0; i < half; i++) {
            const double a = (double)pos[t] * (double)freq_scale * inv[i];
            cs[2 * i] = (float)cos(a);
            cs[2 * i + 1] = (float)sin(a);
        }
        for (int32_t h = 0; h < n_head; h++) {
            float *v = x + (t * n_head + h) * (int64_t)head_dim;
            for (int i = 0; i < half; i++) {
                const int i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
                const float x0 = v[i0], x1 = v[i1], co = cs[2 * i], si = cs[2 * i + 1];
                v[i0] = x0 * co - x1 * si;
                v[i1] = x0 * si + x1 * co;
            }
        }
    }
    free(inv);
    free(cs);
}

/* ==== elementwise ========================================================== */

void mf_cpu_add(const float *a, const float *b, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        y[i] = a[i] + b[i];
}

void mf_cpu_mul(const float *a, const float *b, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        y[i] = a[i] * b[i];
}

void mf_cpu_scale(const float *a, float s, float *y, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        y[i] = a[i] * s;
}

void mf_cpu_silu(const float *a, float *y, int64_t n) {
#if MF_CPU_X86
    if (mf_cpu_isa_default() == MF_ISA_AVX512) {
        mf_cpu_silu_avx512(a, y, n);
        return;
    }
#endif
    for (int64_t i = 0; i < n; i++)
        y[i] = a[i] / (1.0f + expf(-a[i]));
}

void mf_cpu_swiglu(const float *gate, const float *up, float *y, int64_t n) {
#if MF_CPU_X86
    if (mf_cpu_isa_default() == MF_ISA_AVX512) {
        mf_cpu_swiglu_avx512(gate, up, y, n);
        return;
    }
#endif
    for (int64_t i = 0; i < n; i++)
        y[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
}

typedef struct swiglu_job {
    const float *gate, *up;
    float *y;
    int64_t n;
} swiglu_job;

static void swiglu_worker(void *vjob, int ith, int nth) {
    const swiglu_job *j = vjob;
    /* 64-element aligned slices: each element is computed the same way
     * whichever thread takes it, so the split does not change the bits */
    const int64_t per = ((j->n + nth - 1) / nth + 63) & ~(int64_t)63;
    const int64_t i0 = per * ith, i1 = i0 + per < j->n ? i0 + per : j->n;
    if (i0 < i1)
        mf_cpu_swiglu(j->gate + i0, j->up + i0, j->y + i0, i1 - i0);
}

void mf_cpu_swiglu_mt(mf_cpu_ctx *c, const float *gate, const float *up, float *y, int64_t n) {
    swiglu_job j = {gate, up, y, n};
    if (c && n >= 32768) /* below, waking the pool costs more than it saves */
        mf_pool_run(mf_cpu_ctx_pool(c), swiglu_worker, &j);
    else
        mf_cpu_swiglu(gate, up, y, n);
}

/* x = softmax(x * scale) over one row, with the max subtracted first. */
void mf_cpu_softmax(float *x, int64_t n, float scale) {
    if (n <= 0)
        return;
    float mx = -INFINITY;
    for (int64_t i = 0; i < n; i++)
        mx = fmaxf(mx, x[i] * scale);
    float acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) {
            x[i + k] = expf(x[i + k] * scale - mx);
            acc[k] += x[i + k];
        }
    for (int k = 0; i < n; i++, k++) {
        x[i] = expf(x[i] * scale - mx);
        acc[k] += x[i];
    }
    const float sum = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    const float inv = 1.0f / sum;
    for (int64_t j = 0; j < n; j++)
        x[j] *= inv;
}
