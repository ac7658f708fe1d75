/* test_engine_paged.c - paged attention through the engine's batch path
 * (mf_engine_forward_batch with block tables) on the cpu backend: three
 * sequences over blocks of a shared pool, across three forwards, against
 * float64; a block table row outside the pool is refused before anything
 * runs. The op itself, node by node on every backend, is tests/ops. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "engine/engine.h"
#include "mf_test.h"

enum { NT = 4, NH = 4, NKV = 2, HD = 16, KVD = NKV * HD, QD = NH * HD, BS = 4 };

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float frand(void) { /* uniform in [-1, 1) */
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((rng >> 11) * (1.0 / 9007199254740992.0) * 2.0 - 1.0);
}

static int build(void *ctx, const mf_graph_params *p, mf_graph *g, mf_error *err) {
    (void)ctx;
    (void)err;
    int32_t x = mf_g_input(g, MF_INPUT_EXTERNAL, MF_DTYPE_F32, QD, p->n_tokens);
    int32_t k = mf_g_input(g, MF_INPUT_EXTERNAL, MF_DTYPE_F32, KVD, p->n_tokens);
    int32_t v = mf_g_input(g, MF_INPUT_EXTERNAL, MF_DTYPE_F32, KVD, p->n_tokens);
    mf_attn_meta m = {.layer = 0, .n_head = NH, .n_head_kv = NKV, .head_dim = HD, .scale = 1.0f / sqrtf((float)HD)};
    int32_t o = mf_g_attn_paged(g, x, k, v, &m);
    g->nodes[o].flags |= MF_NODE_OUTPUT;
    mf_g_set_name(g, o, "out");
    return 0;
}

/* One query row of causal GQA attention over n cached rows, float64. */
static void attn_row(const float *q, const float *K, const float *V, int n, double *out) {
    for (int h = 0; h < NH; h++) {
        const int kh = h / (NH / NKV);
        double s[8 * BS], mx = -INFINITY, sum = 0;
        for (int p = 0; p < n; p++) {
            double d = 0;
            for (int i = 0; i < HD; i++)
                d += (double)q[h * HD + i] * K[p * KVD + kh * HD + i];
            s[p] = d / sqrt((double)HD);
            mx = fmax(mx, s[p]);
        }
        for (int p = 0; p < n; p++)
            sum += (s[p] = exp(s[p] - mx));
        for (int i = 0; i < HD; i++) {
            double a = 0;
            for (int p = 0; p < n; p++)
                a += s[p] / sum * V[p * KVD + kh * HD + i];
            out[h * HD + i] = a;
        }
    }
}

/* Forwards of 4 tokens (A0 A1 A2 B0 | A3 A4 B1 C0 | A5 B2 C1 C2): sequence
 * A's blocks are 5 then 1 (not adjacent: gathered), B's 2, C's 7; each
 * token attends to its own sequence's rows only, earlier forwards' too. */
MF_TEST(paged_attention_three_sequences_vs_f64) {
    static const int32_t seq[3][NT] = {{0, 0, 0, 1}, {0, 0, 1, 2}, {0, 1, 2, 2}};
    static const int32_t pos[3][NT] = {{0, 1, 2, 0}, {3, 4, 1, 0}, {5, 2, 1, 2}};
    static const int32_t ta[2] = {5, 1}, tb[1] = {2}, tc[1] = {7};
    const int32_t *const tables[3] = {ta, tb, tc};
    const uint32_t kts[2] = {MF_TYPE_F32, MF_TYPE_F16};
    mf_weights *w = mf_weights_new();
    for (int kt = 0; kt < 2; kt++) {
        mf_backend *b = NULL;
        mf_error err = {{0}};
        MF_ASSERT(mf_backend_cpu_new(w, 2, &b, &err) == 0);
        mf_engine_opts eo = {.n_layers = 1, .kv_dim = KVD, .n_ctx = 8 * BS, .k_type = kts[kt], .v_type = kts[kt], .n_vocab = NT * QD};
        mf_engine *e;
        CHECK_MSG(mf_engine_new(&eo, &b, 1, &e, &err) == 0, "%s", err.msg);
        static float Kf[3][8][KVD], Vf[3][8][KVD]; /* per sequence, per position */
        for (int f = 0; f < 3; f++) {
            float x[NT * QD], k[NT * KVD], v[NT * KVD];
            for (int i = 0; i < NT * QD; i++)
                x[i] = frand();
            for (int i = 0; i < NT * KVD; i++) {
                k[i] = frand();
                v[i] = frand();
            }
            mf_engine_set_external(e, 0, x, sizeof x);
            mf_engine_set_external(e, 1, k, sizeof k);
            mf_engine_set_external(e, 2, v, sizeof v);
            for (int t = 0; t < NT; t++)
                for (int i = 0; i < KVD; i++) {
                    Kf[seq[f][t]][pos[f][t]][i] = k[t * KVD + i];
                    Vf[seq[f][t]][pos[f][t]][i] = v[t * KVD + i];
                }
            mf_kv_batch kb = {.n_tokens = NT, .seq = seq[f], .pos = pos[f], .n_seqs = 3, .tables = tables,
                              .block_size = BS};
            mf_graph_params p = {.n_tokens = NT, .n_outputs = 1, .k_type = kts[kt], .v_type = kts[kt], .paged = true};
            float out[NT * QD];
            for (int i = 0; i < NT * QD; i++)
                out[i] = NAN; /* poisoned: an unwritten row fails */
            CHECK_MSG(mf_engine_forward_batch(e, &p, build, NULL, NULL, &kb, out, &err) == 0, "%s", err.msg);
            double want[NT * QD], m = 0, wm = 0;
            for (int t = 0; t < NT; t++)
                attn_row(x + t * QD, &Kf[seq[f][t]][0][0], &Vf[seq[f][t]][0][0], pos[f][t] + 1, want + t * QD);
            for (int i = 0; i < NT * QD; i++) {
                double d = fabs(out[i] - want[i]);
                if (!(d <= m))
                    m = d; /* NaN sticks */
                wm = fmax(wm, fabs(want[i]));
            }
            const double tol = kts[kt] == MF_TYPE_F32 ? 1e-5 : 2e-3;
            CHECK_MSG(m <= tol * wm && wm > 0, "%s forward %d: max diff %.3g (max |want| %.3g)",
                      mf_type_name(kts[kt]), f, m, wm);
        }
        /* a batch row outside the pool is refused before anything runs */
        const int32_t bad_t[1] = {9};
        const int32_t *const bad[1] = {bad_t};
        mf_kv_batch kb = {.n_tokens = NT, .seq = (int32_t[]){0, 0, 0, 0}, .pos = (int32_t[]){0, 1, 2, 3},
                          .n_seqs = 1, .tables = bad, .block_size = BS};
        mf_graph_params p = {.n_tokens = NT, .n_outputs = 1, .k_type = kts[kt], .v_type = kts[kt], .paged = true};
        float out[NT * QD];
        CHECK(mf_engine_forward_batch(e, &p, build, NULL, NULL, &kb, out, &err) != 0);
        CHECK_STR_CONTAINS(err.msg, "outside the pool");
        mf_engine_free(e);
    }
    mf_weights_free(w);
}

MF_TEST_MAIN(MF_T(paged_attention_three_sequences_vs_f64))
