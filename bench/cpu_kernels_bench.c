/* cpu_kernels_bench - times mf_cpu_matmul at the qwen2 shapes (best of N).
 *
 * usage: cpu_kernels_bench [threads] [reps] [ops]
 * ("ops": attention, rmsnorm and swiglu instead of the matmuls; "cold":
 * one-token matmuls over weights out of every cache, as decode sees them.)
 * For each weight type and shape, prints the best time of a decode matmul
 * (nt 1: weight GB/s, the bandwidth wall) and a prefill one (nt 128: integer
 * GOP/s, 2 ops per multiply-add), and for nt 1 also the single-row dot
 * kernel looped over the rows on one thread (the kernel without the tiles). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/kernels.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float frand(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

static double best_ns(mf_cpu_ctx *c, uint32_t wt, const void *w, int64_t n_in, int64_t n_out, const float *x,
                      int64_t nt, float *y, int reps) {
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        const uint64_t t0 = mf_time_ns();
        mf_cpu_matmul(c, wt, w, n_in, n_out, x, nt, y);
        const double dt = (double)(mf_time_ns() - t0);
        best = dt < best ? dt : best;
    }
    return best;
}

/* Attention and the row ops at the qwen2-0.5B prefill / decode shapes, on
 * the context's ISA and with the portable code (isa avx2: attn.c's loops). */
static void bench_ops(int nth, int reps) {
    const int n_head = 14, n_kv = 2, hd = 64, kv_dim = n_kv * hd, n_ctx = 512;
    float *k = malloc(sizeof(float) * n_ctx * kv_dim), *v = malloc(sizeof(float) * n_ctx * kv_dim);
    float *q = malloc(sizeof(float) * 128 * n_head * hd), *o = malloc(sizeof(float) * 128 * n_head * hd);
    float *g = malloc(sizeof(float) * 128 * 4864), *u = malloc(sizeof(float) * 128 * 4864);
    for (int i = 0; i < n_ctx * kv_dim; i++) {
        k[i] = frand();
        v[i] = frand();
    }
    for (int i = 0; i < 128 * n_head * hd; i++)
        q[i] = frand();
    for (int i = 0; i < 128 * 4864; i++) {
        g[i] = 4 * frand();
        u[i] = frand();
    }
    mf_cpu_ctx *c = mf_cpu_ctx_new(nth);
    const struct {
        const char *name;
        int64_t nt, n_past;
    } cases[] = {{"pp128", 128, 0}, {"tg @32", 1, 31}, {"tg @511", 1, 511}};
    const mf_cpu_isa isas[2] = {MF_ISA_AVX2, mf_cpu_isa_best()};
    for (int ii = 0; ii < 2; ii++) {
        const int isa = (int)isas[ii];
        if (ii == 1 && isa <= MF_ISA_AVX2)
            break;
        mf_cpu_ctx_set_isa(c, (mf_cpu_isa)isa);
        for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
            double best = 1e30;
            for (int r = 0; r < reps; r++) {
                const uint64_t t0 = mf_time_ns();
                mf_cpu_attn(c, q, cases[ci].nt, n_head, n_kv, hd, k, v, MF_TYPE_F32, MF_TYPE_F32,
                            cases[ci].n_past, 0.125f, false, o);
                const double dt = (double)(mf_time_ns() - t0);
                best = dt < best ? dt : best;
            }
            printf("attn %-8s isa %-6s %9.1f us\n", cases[ci].name, mf_cpu_isa_name((mf_cpu_isa)isa), best / 1e3);
        }
        double best = 1e30;
        for (int r = 0; r < reps; r++) {
            const uint64_t t0 = mf_time_ns();
            mf_cpu_rmsnorm(c, g, u, o, 896, 128, 1e-6f);
            const double dt = (double)(mf_time_ns() - t0);
            best = dt < best ? dt : best;
        }
        printf("rmsnorm 128x896 isa %-6s %9.1f us\n", mf_cpu_isa_name((mf_cpu_isa)isa), best / 1e3);
    }
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        const uint64_t t0 = mf_time_ns();
        mf_cpu_swiglu(g, u, g, 128 * 4864);
        const double dt = (double)(mf_time_ns() - t0);
        best = dt < best ? dt : best;
    }
    printf("swiglu 128x4864 (default isa) %9.1f us\n", best / 1e3);
    mf_cpu_ctx_free(c);
    free(k);
    free(v);
    free(q);
    free(o);
    free(g);
    free(u);
}

/* Decode as the model runs it: one token through weights that are not in
 * any cache. Copies of each matrix fill ~160 MB and one rep runs the matmul
 * once per copy; prints the weight GB/s of the best rep. */
static void bench_cold(int nth, int reps) {
    const uint32_t types[] = {MF_TYPE_Q4_0, MF_TYPE_Q8_0, MF_TYPE_Q4_K, MF_TYPE_Q6_K};
    const int64_t shapes[][2] = {{896, 1152}, {896, 896}, {896, 9728}, {4864, 896}, {1536, 2048}, {1536, 17920}, {8960, 1536}};
    mf_cpu_ctx *c = mf_cpu_ctx_new(nth);
    printf("cold decode (nt 1), threads %d, best of %d: weight GB/s\n", nth, reps);
    for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++)
        for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
            const uint32_t wt = types[ti];
            const int64_t n_in = shapes[si][0], n_out = shapes[si][1];
            const size_t wr = mf_type_row_size(wt, n_in), bytes = wr * (size_t)n_out;
            if (!wr)
                continue;
            const size_t ncopy = (160u << 20) / bytes + 1;
            uint8_t *w = malloc(bytes * ncopy);
            float *wf = malloc(sizeof(float) * (size_t)n_in);
            for (int64_t o = 0; o < n_out; o++) {
                for (int64_t i = 0; i < n_in; i++)
                    wf[i] = frand();
                mf_quantize_rows(wt, wf, w + (size_t)o * wr, 1, n_in);
            }
            free(wf);
            for (size_t k = 1; k < ncopy; k++) /* same bytes at other addresses: cold all the same */
                memcpy(w + k * bytes, w, bytes);
            float *x = malloc(sizeof(float) * (size_t)n_in), *y = malloc(sizeof(float) * (size_t)n_out);
            for (int64_t i = 0; i < n_in; i++)
                x[i] = frand();
            double best = 1e30;
            for (int r = 0; r < reps; r++) {
                const uint64_t t0 = mf_time_ns();
                for (size_t k = 0; k < ncopy; k++)
                    mf_cpu_matmul(c, wt, w + k * bytes, n_in, n_out, x, 1, y);
                const double dt = (double)(mf_time_ns() - t0) / (double)ncopy;
                best = dt < best ? dt : best;
            }
            printf("%-5s %6lld %6lld  %8.1f us  %6.2f GB/s\n", mf_type_name(wt), (long long)n_in, (long long)n_out,
                   best / 1e3, (double)bytes / best);
            fflush(stdout);
            free(w);
            free(x);
            free(y);
        }
    mf_cpu_ctx_free(c);
}

int main(int argc, char **argv) {
    const int nth = argc > 1 ? atoi(argv[1]) : 2, reps = argc > 2 ? atoi(argv[2]) : 20;
    if (argc > 3 && strcmp(argv[3], "ops") == 0) {
        bench_ops(nth, reps);
        return 0;
    }
    if (argc > 3 && strcmp(argv[3], "cold") == 0) {
        bench_cold(nth, reps);
        return 0;
    }
    const uint32_t types[] = {MF_TYPE_Q4_0, MF_TYPE_Q5_0, MF_TYPE_Q8_0, MF_TYPE_Q4_K, MF_TYPE_Q6_K};
    const int64_t shapes[][2] = {{896, 896}, {896, 128}, {896, 4864}, {4864, 896}, {1536, 8960}, {8960, 1536}, {896, 151936}, {1536, 65536}};
    mf_cpu_ctx *c = mf_cpu_ctx_new(nth);
    printf("threads %d, isa %s, best of %d\n", nth, mf_cpu_isa_name(mf_cpu_ctx_isa(c)), reps);
    printf("%-5s %6s %6s | %9s %7s %9s | %9s %8s\n", "type", "n_in", "n_out", "nt1 us", "GB/s", "1row GB/s",
           "nt128 ms", "GOP/s");
    for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++)
        for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
            const uint32_t wt = types[ti];
            const int64_t n_in = shapes[si][0], n_out = shapes[si][1], nt = 128;
            const size_t wr = mf_type_row_size(wt, n_in);
            if (!wr)
                continue;
            uint8_t *w = malloc(wr * (size_t)n_out);
            float *x = malloc(sizeof(float) * (size_t)(n_in * nt)), *y = malloc(sizeof(float) * (size_t)(n_out * nt));
            float *wf = malloc(sizeof(float) * (size_t)n_in);
            for (int64_t o = 0; o < n_out; o++) {
                for (int64_t i = 0; i < n_in; i++)
                    wf[i] = frand();
                mf_quantize_rows(wt, wf, w + (size_t)o * wr, 1, n_in);
            }
            for (int64_t i = 0; i < n_in * nt; i++)
                x[i] = frand();
            const double t1 = best_ns(c, wt, w, n_in, n_out, x, 1, y, reps * 5);
            /* the single-row kernel alone: one thread, every row */
            const mf_cpu_dot *d = mf_cpu_dot_get(wt, mf_cpu_ctx_isa(c));
            uint8_t *a = malloc(mf_type_row_size(d->act_type, n_in));
            mf_cpu_quantize_act(d->act_type, x, a, n_in, mf_cpu_ctx_isa(c));
            double t1r = 1e30;
            for (int r = 0; r < reps; r++) {
                const uint64_t s0 = mf_time_ns();
                for (int64_t o = 0; o < n_out; o++)
                    d->dot(n_in, &y[o], w + (size_t)o * wr, a);
                const double dt = (double)(mf_time_ns() - s0);
                t1r = dt < t1r ? dt : t1r;
            }
            const double tp = best_ns(c, wt, w, n_in, n_out, x, nt, y, reps > 3 ? reps / 4 : 1);
            const double bytes = (double)wr * (double)n_out;
            printf("%-5s %6lld %6lld | %9.1f %7.2f %9.2f | %9.3f %8.1f\n", mf_type_name(wt), (long long)n_in,
                   (long long)n_out, t1 / 1e3, bytes / t1, bytes / t1r, tp / 1e6,
                   2.0 * (double)n_in * (double)n_out * (double)nt / tp);
            fflush(stdout);
            free(a);
            free(w);
            free(x);
            free(y);
            free(wf);
        }
    mf_cpu_ctx_free(c);
    return 0;
}
