/* op_paged.c - ATTN_PAGED cases on any registered backend against a float64
 * reference (the op suite's method, in its own program: the paged op needs
 * a batch, a block-paged pool and block tables that op_suite's one-node
 * cases do not have).
 *
 *   test_ops_paged BACKEND [FILTER]     e.g. test_ops_paged cuda decode
 *
 * A case: several sequences with histories of different lengths in a pool
 * of 16-row blocks handed out in shuffled order (so no table is
 * contiguous), plus sequences the batch does not touch (no table at all);
 * the batch appends n tokens to each of B sequences, in shuffled sequence
 * order (decode) or one sequence's chunk after another, optionally with
 * one sequence's tokens interleaved with the others'. The pool starts with
 * random rows of the KV type; the output is poisoned with NaN (or is the q
 * buffer: in place). Checked: the output against float64 attention over
 * the history as stored plus the new rows as the type stores them; the new
 * rows' slots hold the new K/V (within the type's rounding); every other
 * pool row is unchanged, byte for byte. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/registry.h"
#include "quant/quant.h"

#define BS 16

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t urand(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 32);
}
static float frand(void) { /* uniform in [-1, 1) */
    return (float)(urand() * (1.0 / 4294967296.0) * 2.0 - 1.0);
}

typedef struct pcase {
    int32_t n_seq, n_tok;  /* sequences in the batch, tokens each */
    int32_t head_dim, gqa;
    uint32_t kv;
    int32_t max_hist;      /* histories in [0, max_hist] */
    bool interleave, inplace;
} pcase;

static float *through(uint32_t type, const float *x, int64_t rows, int64_t w) {
    float *y = malloc((size_t)(rows * w) * sizeof *y);
    const size_t rs = mf_type_row_size(type, w);
    void *q = malloc(rs * (size_t)rows);
    mf_quantize_rows(type, x, q, rows, w);
    mf_dequantize_rows(type, q, y, rows, w);
    free(q);
    return y;
}

static void shuffle(int32_t *v, int32_t n) {
    for (int32_t i = n - 1; i > 0; i--) {
        const int32_t j = (int32_t)(urand() % (uint32_t)(i + 1)), t = v[i];
        v[i] = v[j];
        v[j] = t;
    }
}

/* 1 pass, 0 fail, -1 not run by this backend. */
static int run_case(const mf_backend_entry *be, const pcase *c, const char *label) {
    const int32_t n_kv = 2, n_head = n_kv * c->gqa, hd = c->head_dim;
    const int64_t kvd = (int64_t)n_kv * hd, qd = (int64_t)n_head * hd;
    const int32_t n_seqs = c->n_seq + 2; /* two sequences the batch does not touch */
    const int32_t nt = c->n_seq * c->n_tok;
    int32_t *hist = calloc((size_t)n_seqs, sizeof *hist), *nblk = calloc((size_t)n_seqs, sizeof *nblk);
    int32_t total = 0;
    for (int32_t s = 0; s < n_seqs; s++) {
        hist[s] = (int32_t)(urand() % (uint32_t)(c->max_hist + 1));
        nblk[s] = (hist[s] + c->n_tok + BS - 1) / BS;
        total += nblk[s];
    }
    const int32_t n_blocks = total + 3, rows = n_blocks * BS;
    int32_t *perm = malloc((size_t)n_blocks * sizeof *perm);
    for (int32_t i = 0; i < n_blocks; i++)
        perm[i] = i;
    shuffle(perm, n_blocks);
    int32_t **tables = calloc((size_t)n_seqs, sizeof *tables);
    for (int32_t s = 0, k = 0; s < n_seqs; s++) {
        tables[s] = malloc((size_t)nblk[s] * sizeof **tables);
        for (int32_t b = 0; b < nblk[s]; b++)
            tables[s][b] = perm[k++];
    }
    /* batch sequences: 2 .. n_seqs-1 in shuffled order (0 and 1 stay out) */
    int32_t *order = malloc((size_t)c->n_seq * sizeof *order);
    for (int32_t i = 0; i < c->n_seq; i++)
        order[i] = i + 2;
    shuffle(order, c->n_seq);
    int32_t *seq = malloc((size_t)nt * sizeof *seq), *pos = malloc((size_t)nt * sizeof *pos);
    {
        int32_t t = 0;
        if (c->interleave) { /* sequence order[0]'s tokens alternate with the others' */
            int32_t *next = calloc((size_t)c->n_seq, sizeof *next);
            for (int32_t round = 0; t < nt; round++)
                for (int32_t i = 0; i < c->n_seq && t < nt; i++)
                    if (next[i] < c->n_tok && (i == 0 || round % 2 == 1)) {
                        seq[t] = order[i];
                        pos[t++] = hist[order[i]] + next[i]++;
                    }
            free(next);
        } else {
            for (int32_t i = 0; i < c->n_seq; i++)
                for (int32_t k = 0; k < c->n_tok; k++) {
                    seq[t] = order[i];
                    pos[t++] = hist[order[i]] + k;
                }
        }
    }
    for (int32_t s = 0; s < 2; s++) { /* untouched sequences: no table at all */
        free(tables[s]);
        tables[s] = NULL;
    }
    /* the pool: random rows as stored */
    const size_t rb = mf_type_row_size(c->kv, kvd);
    float *k0 = malloc((size_t)rows * (size_t)kvd * sizeof *k0), *v0 = malloc((size_t)rows * (size_t)kvd * sizeof *v0);
    for (int64_t i = 0; i < (int64_t)rows * kvd; i++) {
        k0[i] = frand();
        v0[i] = frand();
    }
    uint8_t *kq = malloc(rb * (size_t)rows), *vq = malloc(rb * (size_t)rows);
    mf_quantize_rows(c->kv, k0, kq, rows, kvd);
    mf_quantize_rows(c->kv, v0, vq, rows, kvd);
    float *hk = through(c->kv, k0, rows, kvd), *hv = through(c->kv, v0, rows, kvd);
    float *q = malloc((size_t)(nt * qd) * sizeof *q), *kn = malloc((size_t)(nt * kvd) * sizeof *kn),
          *vn = malloc((size_t)(nt * kvd) * sizeof *vn);
    for (int64_t i = 0; i < nt * qd; i++)
        q[i] = frand() * 1.5f;
    for (int64_t i = 0; i < nt * kvd; i++) {
        kn[i] = frand();
        vn[i] = frand();
    }
    float *sk = through(c->kv, kn, nt, kvd), *sv = through(c->kv, vn, nt, kvd);
    int64_t *slot = malloc((size_t)nt * sizeof *slot);
    for (int32_t t = 0; t < nt; t++) {
        slot[t] = (int64_t)tables[seq[t]][pos[t] / BS] * BS + pos[t] % BS;
        memcpy(hk + slot[t] * kvd, sk + t * kvd, (size_t)kvd * sizeof *hk);
        memcpy(hv + slot[t] * kvd, sv + t * kvd, (size_t)kvd * sizeof *hv);
    }

    /* the graph and the backend */
    int rc = 0;
    mf_error err = {{0}};
    mf_weights *w = mf_weights_new();
    mf_graph g;
    mf_graph_init(&g);
    g.n_layers = 1;
    g.kv_dim = kvd;
    const int32_t xq = mf_g_input(&g, MF_INPUT_EXTERNAL, MF_DTYPE_F32, qd, nt);
    const int32_t xk = mf_g_input(&g, MF_INPUT_EXTERNAL, MF_DTYPE_F32, kvd, nt);
    const int32_t xv = mf_g_input(&g, MF_INPUT_EXTERNAL, MF_DTYPE_F32, kvd, nt);
    const mf_attn_meta meta = {.layer = 0, .n_head = n_head, .n_head_kv = n_kv, .head_dim = hd,
                               .scale = 1.0f / sqrtf((float)hd)};
    const int32_t node = mf_g_attn_paged(&g, xq, xk, xv, &meta);
    g.nodes[node].flags |= MF_NODE_OUTPUT;
    mf_backend *b = NULL;
    float *got = NULL;
    uint8_t *kb_back = NULL, *vb_back = NULL;
    if (mf_graph_validate(&g, &err)) {
        printf("FAIL %s: the case's graph is invalid: %s\n", label, err.msg);
        goto done;
    }
    if (be->create(w, &(mf_backend_options){.n_threads = 2, .gpu_timeout_ms = 10000, .graphs = true, .fusion = true},
                   &b, &err)) {
        printf("FAIL %s: create: %s\n", label, err.msg);
        goto done;
    }
    if (!mf_backend_supports_op(b, &g.nodes[node])) {
        rc = -1;
        goto done;
    }
    const mf_backend_ops *o = b->ops;
    const int32_t bq = o->alloc_buffer(b, (size_t)(nt * qd) * 4, &err);
    const int32_t bk = o->alloc_buffer(b, (size_t)(nt * kvd) * 4, &err);
    const int32_t bv = o->alloc_buffer(b, (size_t)(nt * kvd) * 4, &err);
    int32_t bo = c->inplace ? bq : o->alloc_buffer(b, (size_t)(nt * qd) * 4, &err);
    const mf_kv_pair kv = {o->alloc_fresh(b, rb * (size_t)rows, &err), o->alloc_fresh(b, rb * (size_t)rows, &err)};
    MF_ASSERT(bq >= 0 && bk >= 0 && bv >= 0 && bo >= 0 && kv.k >= 0 && kv.v >= 0);
    float *poison = malloc((size_t)(nt * qd) * sizeof *poison);
    memset(poison, 0xff, (size_t)(nt * qd) * sizeof *poison);
    if (o->write_host(b, bq, 0, q, (size_t)(nt * qd) * 4, &err) || o->write_host(b, bk, 0, kn, (size_t)(nt * kvd) * 4, &err) ||
        o->write_host(b, bv, 0, vn, (size_t)(nt * kvd) * 4, &err) ||
        (!c->inplace && o->write_host(b, bo, 0, poison, (size_t)(nt * qd) * 4, &err)) ||
        o->write_host(b, kv.k, 0, kq, rb * (size_t)rows, &err) || o->write_host(b, kv.v, 0, vq, rb * (size_t)rows, &err)) {
        free(poison);
        printf("FAIL %s: upload: %s\n", label, err.msg);
        goto done;
    }
    free(poison);
    const mf_kv_batch kb = {.n_tokens = nt, .seq = seq, .pos = pos, .n_seqs = n_seqs,
                            .tables = (const int32_t *const *)tables, .block_size = BS};
    const mf_exec_args args = {.n_past = 0, .n_tokens = nt, .n_ctx = rows, .k_type = c->kv, .v_type = c->kv, .batch = &kb};
    const mf_node_call call = {.node = node, .in = {bq, bk, bv, -1}, .out = bo, .kv = kv};
    got = malloc((size_t)(nt * qd) * sizeof *got);
    kb_back = malloc(rb * (size_t)rows);
    vb_back = malloc(rb * (size_t)rows);
    if (mf_backend_execute_node(b, &g, &call, &args, &err) || o->synchronize(b, &err) ||
        o->read_host(b, bo, 0, got, (size_t)(nt * qd) * 4, &err) || o->read_host(b, kv.k, 0, kb_back, rb * (size_t)rows, &err) ||
        o->read_host(b, kv.v, 0, vb_back, rb * (size_t)rows, &err)) {
        printf("FAIL %s: %s\n", label, err.msg);
        goto done;
    }

    /* the pool: new slots hold the new rows, every other row is as it was */
    {
        const double st = c->kv == MF_TYPE_F32 ? 0 : c->kv == MF_TYPE_F16 ? 1e-3 : 1e-2;
        uint8_t *touched = calloc((size_t)rows, 1);
        float *row = malloc((size_t)kvd * sizeof *row);
        bool bad = false;
        for (int32_t t = 0; t < nt && !bad; t++) {
            touched[slot[t]] = 1;
            for (int w2 = 0; w2 < 2 && !bad; w2++) {
                mf_dequantize_rows(c->kv, (w2 ? vb_back : kb_back) + (size_t)slot[t] * rb, row, 1, kvd);
                const float *want = (w2 ? sv : sk) + t * kvd;
                for (int64_t i = 0; i < kvd && !bad; i++)
                    if (!(fabs((double)row[i] - want[i]) <= st)) {
                        printf("FAIL %s: token %d's %c row (slot %lld) [%lld] = %g, stored %g\n", label, t,
                               w2 ? 'V' : 'K', (long long)slot[t], (long long)i, row[i], want[i]);
                        bad = true;
                    }
            }
        }
        for (int32_t r = 0; r < rows && !bad; r++)
            if (!touched[r] && (memcmp(kb_back + (size_t)r * rb, kq + (size_t)r * rb, rb) ||
                                memcmp(vb_back + (size_t)r * rb, vq + (size_t)r * rb, rb))) {
                printf("FAIL %s: pool row %d changed, no token of the batch lives there\n", label, r);
                bad = true;
            }
        free(touched);
        free(row);
        if (bad)
            goto done;
    }

    /* float64 attention of each token over its sequence's positions [0, pos] */
    {
        const double tol = c->kv == MF_TYPE_Q8_0 ? 2e-3 : 2e-4; /* f32 math only: the inputs are as stored */
        double worst = 0;
        int64_t wi = 0;
        double *s = malloc((size_t)(c->max_hist + c->n_tok + 1) * sizeof *s);
        for (int32_t t = 0; t < nt; t++)
            for (int32_t h = 0; h < n_head; h++) {
                const int32_t kh = h / c->gqa, np = pos[t] + 1;
                const int32_t *tb = tables[seq[t]];
                double mx = -INFINITY, sum = 0;
                for (int32_t p = 0; p < np; p++) {
                    const int64_t r = (int64_t)tb[p / BS] * BS + p % BS;
                    double d = 0;
                    for (int32_t i = 0; i < hd; i++)
                        d += (double)q[((int64_t)t * n_head + h) * hd + i] * hk[r * kvd + kh * hd + i];
                    s[p] = d / sqrt((double)hd);
                    mx = fmax(mx, s[p]);
                }
                for (int32_t p = 0; p < np; p++)
                    sum += (s[p] = exp(s[p] - mx));
                for (int32_t i = 0; i < hd; i++) {
                    double acc = 0;
                    for (int32_t p = 0; p < np; p++) {
                        const int64_t r = (int64_t)tb[p / BS] * BS + p % BS;
                        acc += s[p] / sum * hv[r * kvd + kh * hd + i];
                    }
                    const int64_t k = ((int64_t)t * n_head + h) * hd + i;
                    const double e = fabs(acc - got[k]);
                    if (!(e <= worst)) { /* NaN sticks */
                        worst = e;
                        wi = k;
                    }
                }
            }
        free(s);
        if (!(worst <= tol)) {
            printf("FAIL %s: max error %.3g at [%lld] (token %lld, seq %d, pos %d) > %.1g\n", label, worst,
                   (long long)wi, (long long)(wi / qd), seq[wi / qd], pos[wi / qd], tol);
            goto done;
        }
    }
    rc = 1;
done:
    free(got);
    free(kb_back);
    free(vb_back);
    if (b)
        mf_backend_free(b);
    mf_graph_free(&g);
    mf_weights_free(w);
    for (int32_t s = 0; s < n_seqs; s++)
        free(tables[s]);
    free(tables), free(hist), free(nblk), free(perm), free(order), free(seq), free(pos);
    free(k0), free(v0), free(kq), free(vq), free(hk), free(hv), free(q), free(kn), free(vn), free(sk), free(sv);
    free(slot);
    return rc;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: test_ops_paged BACKEND [FILTER]   (this build: %s)\n", mf_registry_names());
        return 2;
    }
    const mf_backend_entry *be = mf_registry_find(argv[1], strlen(argv[1]));
    if (!be) {
        fprintf(stderr, "test_ops_paged: unknown backend '%s' (this build: %s)\n", argv[1], mf_registry_names());
        return 2;
    }
    if (be->is_gpu) { /* skipped (77) without a usable device */
        mf_weights *w = mf_weights_new();
        mf_backend *b = NULL;
        mf_error err;
        mf_backend_options o;
        mf_backend_options_default(&o);
        if (be->create(w, &o, &b, &err)) {
            printf("test_ops_paged %s: no usable device (%s)\n", be->name, err.msg);
            mf_weights_free(w);
            return 77;
        }
        mf_backend_free(b);
        mf_weights_free(w);
    }
    static const uint32_t kvs[] = {MF_TYPE_F32, MF_TYPE_F16, MF_TYPE_Q8_0};
    static const int32_t hds[] = {64, 128}, gqas[] = {1, 4, 7};
    /* (sequences, tokens each, longest history, interleaved): decode at
     * B = 1 / 3 / 17 / 64 / 160 (160 x 2 KV heads: enough work that nothing
     * splits), 37-token prefill chunks with and without history, a mixed
     * batch (prefill chunks interleaved with one another) */
    static const struct { int32_t n_seq, n_tok, max_hist; bool inter; const char *name; } shapes[] = {
        {1, 1, 640, false, "decode"},   {3, 1, 640, false, "decode"},   {17, 1, 300, false, "decode"},
        {64, 1, 200, false, "decode"},  {160, 1, 40, false, "decode"},  {1, 37, 0, false, "prefill"},
        {1, 37, 200, false, "prefill"}, {3, 37, 100, false, "prefill"}, {3, 37, 60, true, "mixed"},
    };
    int pass = 0, fail = 0, not_run = 0, n = 0;
    char label[160];
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (size_t hi = 0; hi < 2; hi++)
            for (size_t gi = 0; gi < 3; gi++)
                for (size_t ki = 0; ki < 3; ki++) {
                    const pcase c = {.n_seq = shapes[si].n_seq, .n_tok = shapes[si].n_tok, .head_dim = hds[hi],
                                     .gqa = gqas[gi], .kv = kvs[ki], .max_hist = shapes[si].max_hist,
                                     .interleave = shapes[si].inter, .inplace = (n++ % 3) == 2};
                    snprintf(label, sizeof label, "attn_paged %s B %d x %d hist <= %d hd %d gqa %d kv %s%s",
                             shapes[si].name, c.n_seq, c.n_tok, c.max_hist, c.head_dim, c.gqa,
                             mf_type_name(c.kv), c.inplace ? " in-place" : "");
                    if (argc > 2 && !strstr(label, argv[2]))
                        continue;
                    const int rc = run_case(be, &c, label);
                    if (rc < 0) {
                        not_run++;
                        if (be->runs_every_op) {
                            printf("FAIL %s: %s claims every op but refused this one\n", label, be->name);
                            fail++;
                        }
                        continue;
                    }
                    rc ? pass++ : fail++;
                }
    printf("test_ops_paged %s: %d passed, %d failed, %d not run by this backend\n", be->name, pass, fail, not_run);
    return fail || pass == 0 ? 1 : 0;
}
