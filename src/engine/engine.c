/* engine.c - the graph cache, KV regions and the scheduler (seed §3.2.9).
 *
 * Per forward: compare the params with the cached graph's (mf_graph_params_eq);
 * on a difference rebuild (builder -> validate -> assign -> fuse -> KV regions
 * -> alloc -> the split calls). Then resolve the INPUT nodes' host data, walk
 * the splits (synchronize the previous backend at each change, copy the
 * split's inputs across through a host round trip into its staging buffers,
 * hand the split to execute_split, or write its host inputs and call
 * execute_node per node) and read the OUTPUT node after the final
 * synchronize. */
#include "engine/engine.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/passes.h"

typedef struct kv_region {
    int32_t backend; /* -1: not allocated yet */
    int32_t k, v;
    uint32_t type[2]; /* K, V */
} kv_region;

typedef struct ext_input {
    const void *data;
    size_t nbytes;
} ext_input;

#define ENGINE_HOSTS 4

/* A split as the backend is handed it (mf_split_call), made once per build:
 * every call's buffers resolved, the values leaving the split, the INPUT
 * nodes whose bytes it writes. */
typedef struct split_run {
    mf_node_call *calls;
    int32_t n_calls;
    mf_host_input *host;
    int32_t n_host;
    int32_t *outputs, *out_bufs;
    void **read_back;
    int32_t n_outputs;
} split_run;

struct mf_engine {
    mf_engine_opts o;
    mf_backend *be[MF_MAX_BACKENDS];
    int nb;
    uint32_t enabled;
    bool alternate, trace, trace_nodes, profile;

    bool cached;
    mf_graph g;
    mf_graph_params gp;
    mf_plan plan;
    split_run *runs;   /* plan.n_splits */
    const void **in_data; /* per node: an INPUT's host bytes this forward */
    int64_t n_builds;

    kv_region *kv; /* o.n_layers */
    ext_input *ext;
    int n_ext;

    uint8_t *host; /* bounce buffer for cross-backend copies */
    size_t host_cap;
    int32_t *pos;  /* positions scratch */
    int32_t pos_cap;

    uint64_t prof_ns[MF_OP_COUNT];
    int64_t prof_n[MF_OP_COUNT];

    struct { /* mf_engine_host_alloc's backend allocations */
        void *p;
        int be;
    } hosts[ENGINE_HOSTS];
};

/* ---- construction ------------------------------------------------------------------ */

int mf_engine_new(const mf_engine_opts *o, mf_backend **backends, int n_backends, mf_engine **out,
                  mf_error *err) {
    *out = NULL;
    int rc = 0;
    if (n_backends < 1 || n_backends > MF_MAX_BACKENDS)
        rc = mf_errorf(err, "engine: %d backends (1..%d)", n_backends, MF_MAX_BACKENDS);
    else if (o->n_layers < 0 || o->n_ctx <= 0 || (o->n_layers > 0 && o->kv_dim <= 0) || o->n_vocab < 0)
        rc = mf_errorf(err, "engine: n_layers %d, kv_dim %lld, n_ctx %d, n_vocab %lld", o->n_layers,
                       (long long)o->kv_dim, o->n_ctx, (long long)o->n_vocab);
    else if (!mf_kv_type_ok(o->k_type) || !mf_kv_type_ok(o->v_type))
        rc = mf_errorf(err, "engine: kv cache types K %s (%u), V %s (%u): each must be f32, f16, q8_0, "
                       "q4_0, q4_1, q5_0 or q5_1", mf_type_name(o->k_type), o->k_type,
                       mf_type_name(o->v_type), o->v_type);
    else if (o->n_layers > 0 &&
             (mf_type_row_size(o->k_type, o->kv_dim) == 0 || mf_type_row_size(o->v_type, o->kv_dim) == 0))
        rc = mf_errorf(err, "engine: kv cache types K %s / V %s need kv_dim %% 32 == 0 (kv_dim %lld)",
                       mf_type_name(o->k_type), mf_type_name(o->v_type), (long long)o->kv_dim);
    if (rc) {
        for (int i = 0; i < n_backends; i++)
            mf_backend_free(backends[i]);
        return rc;
    }
    mf_engine *e = mf_calloc(1, sizeof *e);
    e->o = *o;
    e->nb = n_backends;
    for (int i = 0; i < n_backends; i++)
        e->be[i] = backends[i];
    e->enabled = (1u << n_backends) - 1;
    e->alternate = o->alternate;
    e->trace = o->trace > 0;
    e->trace_nodes = o->trace >= 2;
    e->profile = o->profile;
    e->kv = mf_malloc(((size_t)o->n_layers + 1) * sizeof *e->kv);
    for (int32_t l = 0; l < o->n_layers; l++)
        e->kv[l] = (kv_region){.backend = -1, .k = -1, .v = -1, .type = {o->k_type, o->v_type}};
    *out = e;
    return 0;
}

static void free_runs(mf_engine *e) {
    for (int32_t s = 0; e->runs && s < e->plan.n_splits; s++) {
        split_run *r = &e->runs[s];
        free(r->calls);
        free(r->host);
        free(r->outputs);
        free(r->out_bufs);
        free(r->read_back);
    }
    free(e->runs);
    e->runs = NULL;
    free(e->in_data);
    e->in_data = NULL;
}

static void drop_graph(mf_engine *e) {
    free_runs(e);
    if (e->cached)
        mf_plan_free(&e->plan, e->be);
    mf_graph_free(&e->g);
    e->cached = false;
}

static void print_profile(const mf_engine *e) {
    uint64_t total = 0;
    for (int op = 0; op < MF_OP_COUNT; op++)
        total += e->prof_ns[op];
    if (!total)
        return;
    fprintf(stderr, "op profile (wall time per op, synchronized after each node):\n");
    fprintf(stderr, "  %-20s %10s %12s %10s %6s\n", "op", "count", "total ms", "avg us", "%");
    bool done[MF_OP_COUNT] = {0};
    for (;;) {
        int best = -1;
        for (int op = 0; op < MF_OP_COUNT; op++)
            if (!done[op] && e->prof_n[op] && (best < 0 || e->prof_ns[op] > e->prof_ns[best]))
                best = op;
        if (best < 0)
            break;
        done[best] = true;
        fprintf(stderr, "  %-20s %10lld %12.3f %10.2f %6.1f\n", mf_op_name((mf_op)best),
                (long long)e->prof_n[best], e->prof_ns[best] / 1e6,
                e->prof_ns[best] / 1e3 / (double)e->prof_n[best], 100.0 * e->prof_ns[best] / total);
    }
}

void mf_engine_free(mf_engine *e) {
    if (!e)
        return;
    if (e->profile)
        print_profile(e);
    drop_graph(e);
    for (int32_t l = 0; l < e->o.n_layers; l++) {
        if (e->kv[l].backend < 0)
            continue;
        mf_backend *b = e->be[e->kv[l].backend];
        b->ops->free_buffer(b, e->kv[l].k);
        b->ops->free_buffer(b, e->kv[l].v);
    }
    for (int i = 0; i < ENGINE_HOSTS; i++)
        if (e->hosts[i].p)
            mf_engine_host_free(e, e->hosts[i].p);
    for (int i = 0; i < e->nb; i++)
        mf_backend_free(e->be[i]);
    free(e->kv);
    free(e->ext);
    free(e->host);
    free(e->pos);
    free(e);
}

void *mf_engine_host_alloc(mf_engine *e, size_t nbytes) {
    int slot = -1;
    for (int i = 0; i < ENGINE_HOSTS && slot < 0; i++)
        if (!e->hosts[i].p)
            slot = i;
    for (int b = 0; b < e->nb && slot >= 0; b++) {
        if (!e->be[b]->ops->host_alloc)
            continue;
        void *p = e->be[b]->ops->host_alloc(e->be[b], nbytes);
        if (p) {
            memset(p, 0, nbytes);
            e->hosts[slot].p = p;
            e->hosts[slot].be = b;
            return p;
        }
    }
    return calloc(1, nbytes ? nbytes : 1);
}

void mf_engine_host_free(mf_engine *e, void *p) {
    if (!p)
        return;
    for (int i = 0; i < ENGINE_HOSTS; i++)
        if (e->hosts[i].p == p) {
            mf_backend *b = e->be[e->hosts[i].be];
            b->ops->host_free(b, p);
            e->hosts[i].p = NULL;
            return;
        }
    free(p);
}

/* ---- small accessors -------------------------------------------------------------- */

int mf_engine_n_backends(const mf_engine *e) {
    return e->nb;
}

mf_backend *mf_engine_backend(const mf_engine *e, int i) {
    return (i >= 0 && i < e->nb) ? e->be[i] : NULL;
}

int64_t mf_engine_n_builds(const mf_engine *e) {
    return e->n_builds;
}

void mf_engine_invalidate(mf_engine *e) {
    drop_graph(e);
}

void mf_engine_set_alternate(mf_engine *e, bool on) {
    if (e->alternate != on)
        drop_graph(e);
    e->alternate = on;
}

void mf_engine_set_backend_enabled(mf_engine *e, int i, bool on) {
    MF_ASSERT(i >= 0 && i < e->nb);
    if (on)
        e->enabled |= 1u << i;
    else
        e->enabled &= ~(1u << i);
}

uint32_t mf_engine_participants(const mf_engine *e, const mf_graph_params *p) {
    uint32_t m = e->enabled;
    for (int i = 0; i < e->nb; i++)
        if (e->be[i]->is_gpu && !(p && p->gpu))
            m &= ~(1u << i);
    return m;
}

bool mf_engine_supports_fused(const mf_engine *e, const mf_graph_params *p, mf_fused_kind kind) {
    uint32_t m = mf_engine_participants(e, p);
    for (int i = 0; i < e->nb; i++)
        if (m >> i & 1u)
            return e->be[i]->ops->supports_fused(e->be[i], kind);
    return false;
}

void mf_engine_set_external(mf_engine *e, int k, const void *data, size_t nbytes) {
    MF_ASSERT(k >= 0);
    if (k >= e->n_ext) {
        e->ext = mf_realloc(e->ext, (size_t)(k + 1) * sizeof *e->ext);
        memset(e->ext + e->n_ext, 0, (size_t)(k + 1 - e->n_ext) * sizeof *e->ext);
        e->n_ext = k + 1;
    }
    e->ext[k] = (ext_input){data, nbytes};
}

int32_t mf_engine_n_splits(const mf_engine *e) {
    return e->cached ? e->plan.n_splits : 0;
}

const mf_graph *mf_engine_graph(const mf_engine *e) {
    return e->cached ? &e->g : NULL;
}

static void *host_buf(mf_engine *e, size_t n) {
    if (n > e->host_cap) {
        free(e->host);
        e->host = mf_malloc(n);
        e->host_cap = n;
    }
    return e->host;
}

/* ---- KV regions -------------------------------------------------------------------- */

/* Rows per host round trip when zeroing or migrating a KV region: bounded so
 * a large context never needs a second full-size copy in host memory. */
static int64_t kv_chunk_rows(size_t row_a, size_t row_b, int64_t n_ctx) {
    size_t row = row_a > row_b ? row_a : row_b;
    int64_t r = (int64_t)((4u << 20) / (row ? row : 1));
    if (r < 1)
        r = 1;
    return r < n_ctx ? r : n_ctx;
}

/* Puts layer l's regions on backend b in types `types` (K, V): allocates
 * (zeroed) on first use; when a rebuild moved the layer's attention or
 * changed a cache type, carries the contents over through the host
 * (converting the rows). Out of memory (host or backend) is an error naming
 * the layer, the bytes and the backend; nothing is changed then. Host memory
 * used: a few MiB. */
static int kv_place(mf_engine *e, int32_t l, int32_t b, const uint32_t types[2], mf_error *err) {
    kv_region *r = &e->kv[l];
    if (r->backend == b && r->type[0] == types[0] && r->type[1] == types[1])
        return 0;
    const int64_t n_ctx = e->o.n_ctx, kv_dim = e->o.kv_dim;
    mf_backend *nbk = e->be[b];
    size_t rows[2], bytes[2];
    for (int w = 0; w < 2; w++) {
        rows[w] = mf_type_row_size(types[w], kv_dim);
        if (rows[w] == 0)
            return mf_errorf(err, "engine: kv cache type %s needs kv_dim %% %lld == 0 (kv_dim %lld)",
                             mf_type_name(types[w]), (long long)mf_type_get(types[w])->block_size,
                             (long long)kv_dim);
        if ((uint64_t)n_ctx > SIZE_MAX / rows[w])
            return mf_errorf(err, "engine: KV region of layer %d (%lld rows of %zu bytes) on %s overflows size_t",
                             l, (long long)n_ctx, rows[w], nbk->ops->name(nbk));
        bytes[w] = rows[w] * (size_t)n_ctx;
    }
    const bool migrate = r->backend >= 0;
    mf_backend *obk = migrate ? e->be[r->backend] : NULL;
    int32_t ids[2] = {-1, -1};
    int rc = 0;
    for (int w = 0; w < 2 && !rc; w++) {
        const size_t row = rows[w], orow = migrate ? mf_type_row_size(r->type[w], kv_dim) : 0;
        const bool convert = migrate && r->type[w] != types[w];
        const int64_t chunk = kv_chunk_rows(row, orow, n_ctx);
        void *dst = calloc((size_t)chunk, row);
        void *src = migrate ? malloc((size_t)chunk * orow) : NULL;
        float *tmp = convert ? malloc((size_t)chunk * (size_t)kv_dim * sizeof *tmp) : NULL;
        if (!dst || (migrate && !src) || (convert && !tmp))
            rc = mf_errorf(err, "engine: KV region of layer %d (%zu bytes) on %s: out of host memory for "
                           "a %lld-row staging chunk", l, bytes[w], nbk->ops->name(nbk), (long long)chunk);
        if (!rc) {
            ids[w] = nbk->ops->alloc_fresh(nbk, bytes[w], err);
            if (ids[w] < 0)
                rc = mf_error_prefix(err, "engine: KV region of layer %d (%zu bytes) on %s", l, bytes[w],
                                     nbk->ops->name(nbk));
        }
        for (int64_t r0 = 0; r0 < n_ctx && !rc; r0 += chunk) {
            int64_t nr = n_ctx - r0 < chunk ? n_ctx - r0 : chunk;
            if (migrate) {
                if (obk->ops->read_host(obk, w ? r->v : r->k, (size_t)r0 * orow, src, (size_t)nr * orow, err)) {
                    rc = mf_error_prefix(err, "engine: migrating KV of layer %d", l);
                    break;
                }
                if (!convert) {
                    memcpy(dst, src, (size_t)nr * row);
                } else {
                    mf_dequantize_rows(r->type[w], src, tmp, nr, kv_dim);
                    mf_quantize_rows(types[w], tmp, dst, nr, kv_dim);
                }
            }
            if (nbk->ops->write_host(nbk, ids[w], (size_t)r0 * row, dst, (size_t)nr * row, err))
                rc = mf_error_prefix(err, "engine: KV region of layer %d (%zu bytes) on %s", l, bytes[w],
                                     nbk->ops->name(nbk));
        }
        free(dst);
        free(tmp);
        free(src);
    }
    if (rc) {
        for (int w = 0; w < 2; w++)
            if (ids[w] >= 0)
                nbk->ops->free_buffer(nbk, ids[w]);
        return -1;
    }
    if (migrate) {
        obk->ops->free_buffer(obk, r->k);
        obk->ops->free_buffer(obk, r->v);
    }
    *r = (kv_region){.backend = b, .k = ids[0], .v = ids[1], .type = {types[0], types[1]}};
    return 0;
}

/* ---- rebuild ---------------------------------------------------------------------- */

static void print_trace(const mf_engine *e) {
    const mf_graph *g = &e->g;
    fprintf(stderr, "graph build %lld: %d nodes, %d splits (n_tokens %d, backends 0x%x)\n",
            (long long)e->n_builds, g->n_nodes, e->plan.n_splits, e->gp.n_tokens, e->gp.backends);
    for (int32_t s = 0; s < e->plan.n_splits; s++) {
        const mf_split *sp = &e->plan.splits[s];
        mf_backend *b = e->be[sp->backend];
        fprintf(stderr, "  split %d: %s nodes %d-%d (%d ops, %d inputs copied in)\n", s,
                b->ops->name(b), sp->first, sp->last, sp->n_nodes, sp->n_inputs);
    }
    fprintf(stderr, "  %-20s", "op \\ backend");
    for (int b = 0; b < e->nb; b++)
        fprintf(stderr, " %8s", e->be[b]->ops->name(e->be[b]));
    fprintf(stderr, "\n");
    for (int op = 0; op < MF_OP_COUNT; op++) {
        int64_t cnt[MF_MAX_BACKENDS] = {0}, any = 0;
        for (int32_t i = 0; i < g->n_nodes; i++) {
            const mf_node *n = &g->nodes[i];
            if (!(n->flags & MF_NODE_DEAD) && n->op == (mf_op)op && n->backend >= 0) {
                cnt[n->backend]++;
                any++;
            }
        }
        if (!any)
            continue;
        fprintf(stderr, "  %-20s", mf_op_name((mf_op)op));
        for (int b = 0; b < e->nb; b++)
            fprintf(stderr, " %8lld", (long long)cnt[b]);
        fprintf(stderr, "\n");
    }
    for (int b = 0; b < e->nb; b++)
        if (e->plan.n_buffers[b])
            fprintf(stderr, "  %s: %d buffers, %.2f MiB\n", e->be[b]->ops->name(e->be[b]), e->plan.n_buffers[b],
                    e->plan.bytes[b] / 1048576.0);
    fprintf(stderr, "  %d nodes write in place\n", e->plan.n_inplace);
}

/* The input buffer of src j of node i as split sp sees it: the node's own
 * buffer, or its staging copy when it lives on another backend. */
static int32_t src_buf(const mf_graph *g, const mf_plan *pl, const mf_split *sp, int32_t src) {
    if (pl->buf_backend[src] < 0 || pl->buf_backend[src] == sp->backend)
        return g->nodes[src].buf;
    for (int32_t k = 0; k < sp->n_inputs; k++)
        if (sp->inputs[k] == src)
            return sp->staging[k];
    return -1;
}

/* Whether a split after s reads node i (as a copied input). */
static bool read_later(const mf_plan *pl, int32_t s, int32_t i) {
    for (int32_t t = s + 1; t < pl->n_splits; t++)
        for (int32_t k = 0; k < pl->splits[t].n_inputs; k++)
            if (pl->splits[t].inputs[k] == i)
                return true;
    return false;
}

/* Resolves every split's calls once per build (the same calls in every
 * forward of the build), its outputs, and which split writes each INPUT's
 * bytes: the first on the backend holding it (INPUT buffers are never
 * recycled, so any time before their readers is right). */
static int make_runs(mf_engine *e, mf_error *err) {
    const mf_graph *g = &e->g;
    const mf_plan *pl = &e->plan;
    e->runs = mf_calloc((size_t)pl->n_splits + 1, sizeof *e->runs);
    e->in_data = mf_calloc((size_t)g->n_nodes + 1, sizeof *e->in_data);
    for (int32_t s = 0; s < pl->n_splits; s++) {
        const mf_split *sp = &pl->splits[s];
        split_run *r = &e->runs[s];
        r->calls = mf_malloc(((size_t)sp->n_nodes + 1) * sizeof *r->calls);
        int32_t cap_out = 0;
        for (int32_t i = sp->first; i <= sp->last; i++) {
            const mf_node *n = &g->nodes[i];
            if (n->buf >= 0 && pl->buf_backend[i] == sp->backend && !(n->flags & MF_NODE_DEAD) &&
                ((n->flags & MF_NODE_OUTPUT) || read_later(pl, s, i))) {
                if (r->n_outputs == cap_out) {
                    cap_out = cap_out ? 2 * cap_out : 4;
                    r->outputs = mf_realloc(r->outputs, (size_t)cap_out * sizeof *r->outputs);
                    r->out_bufs = mf_realloc(r->out_bufs, (size_t)cap_out * sizeof *r->out_bufs);
                }
                r->outputs[r->n_outputs] = i;
                r->out_bufs[r->n_outputs++] = n->buf;
            }
            if (!mf_node_executes(n))
                continue;
            if (n->backend != sp->backend || (n->buf >= 0 && pl->buf_backend[i] != sp->backend))
                return mf_errorf(err, "engine: assignment/alloc mismatch: node %d '%s' (%s) on backend %d, "
                                 "buffer on %d, split %d on %d", i, n->name, mf_op_name(n->op), n->backend,
                                 pl->buf_backend[i], s, sp->backend);
            mf_node_call *c = &r->calls[r->n_calls++];
            *c = (mf_node_call){.node = i, .out = n->buf, .kv = {-1, -1}};
            for (int j = 0; j < MF_MAX_SRC; j++)
                c->in[j] = j < n->n_src ? src_buf(g, pl, sp, n->src[j]) : -1;
            for (int j = 0; j < n->n_src; j++)
                MF_ASSERT(c->in[j] >= 0 || pl->buf_backend[n->src[j]] < 0);
            int32_t l = mf_node_kv_layer(n);
            if (l >= 0) {
                if (e->kv[l].backend != sp->backend)
                    return mf_errorf(err, "engine: assignment/alloc mismatch: node %d '%s' (%s) runs on %d "
                                     "but layer %d's KV lives on %d", i, n->name, mf_op_name(n->op),
                                     sp->backend, l, e->kv[l].backend);
                c->kv = (mf_kv_pair){e->kv[l].k, e->kv[l].v};
            }
        }
        r->read_back = mf_calloc((size_t)r->n_outputs + 1, sizeof *r->read_back);
    }
    for (int32_t i = 0; i < g->n_nodes; i++) {
        const mf_node *n = &g->nodes[i];
        if ((n->flags & MF_NODE_DEAD) || n->op != MF_OP_INPUT || n->buf < 0 || mf_node_nbytes(n) == 0)
            continue;
        for (int32_t s = 0; s < pl->n_splits; s++) {
            if (pl->splits[s].backend != pl->buf_backend[i])
                continue;
            split_run *r = &e->runs[s];
            r->host = mf_realloc(r->host, (size_t)(r->n_host + 1) * sizeof *r->host);
            r->host[r->n_host++] = (mf_host_input){.node = i, .buf = n->buf, .nbytes = mf_node_nbytes(n)};
            break;
        }
    }
    return 0;
}

static int rebuild(mf_engine *e, const mf_graph_params *p, mf_graph_build_fn build, void *ctx,
                   mf_error *err) {
    drop_graph(e);
    mf_graph *g = &e->g;
    mf_graph_init(g);
    g->n_layers = e->o.n_layers;
    g->kv_dim = e->o.kv_dim;
    if (build(ctx, p, g, err))
        goto fail;
    if (g->n_layers != e->o.n_layers || g->kv_dim != e->o.kv_dim) {
        mf_errorf(err, "engine: graph has %d KV layers of width %lld, engine %d of %lld", g->n_layers,
                  (long long)g->kv_dim, e->o.n_layers, (long long)e->o.kv_dim);
        goto fail;
    }
    if (mf_graph_validate(g, err) ||
        mf_assign_backends(g, e->be, e->nb, p->backends, e->alternate, err))
        goto fail;
    mf_fuse(g, e->be, p);
    for (int32_t i = 0; i < g->n_nodes; i++) {
        const mf_node *n = &g->nodes[i];
        int32_t l = mf_node_kv_layer(n);
        if (!(n->flags & MF_NODE_DEAD) && l >= 0 &&
            kv_place(e, l, n->backend, (const uint32_t[2]){p->k_type, p->v_type}, err))
            goto fail;
    }
    if (mf_alloc_plan(g, e->be, e->nb, &e->plan, err))
        goto fail;
    if (make_runs(e, err)) {
        free_runs(e);
        mf_plan_free(&e->plan, e->be);
        goto fail;
    }
    host_buf(e, e->plan.max_copy);
    /* the nodes are final now: a stamp no other build of any engine gets */
    static _Atomic uint64_t stamps;
    g->stamp = ++stamps;
    e->cached = true;
    e->gp = *p;
    e->n_builds++;
    mf_log(MF_LOG_DEBUG, "engine: graph build %llu: %d tokens, %d outputs, %d nodes, backend mask 0x%x%s",
           (unsigned long long)e->n_builds, p->n_tokens, p->n_outputs, g->n_nodes, p->backends,
           p->gpu ? " (gpu)" : "");
    if (e->trace)
        print_trace(e);
    if (e->trace_nodes)
        mf_graph_print(g, stderr);
    return 0;
fail:
    mf_graph_free(g);
    return -1;
}

/* ---- forward ---------------------------------------------------------------------- */

/* Resolves every INPUT node's host bytes for this forward into e->in_data
 * and writes those no split writes (an INPUT on a backend that runs none). */
static int fill_inputs(mf_engine *e, const int32_t *tokens, const mf_exec_args *a, mf_error *err) {
    const mf_graph *g = &e->g;
    int k_ext = 0;
    for (int32_t i = 0; i < g->n_nodes; i++) {
        const mf_node *n = &g->nodes[i];
        if ((n->flags & MF_NODE_DEAD) || n->op != MF_OP_INPUT)
            continue;
        size_t nb = mf_node_nbytes(n);
        const void *data = NULL;
        switch (n->meta.input.kind) {
        case MF_INPUT_TOKENS:
        case MF_INPUT_POSITIONS:
            if (mf_node_nelem(n) != a->n_tokens)
                return mf_errorf(err, "forward: input node %d '%s' has %lld elements for %d tokens", i,
                                 n->name, (long long)mf_node_nelem(n), a->n_tokens);
            if (n->meta.input.kind == MF_INPUT_TOKENS) {
                if (!tokens)
                    return mf_errorf(err, "forward: graph reads tokens (node %d '%s') but none given", i,
                                     n->name);
                data = tokens;
            } else {
                if (e->pos_cap < a->n_tokens) {
                    free(e->pos);
                    e->pos = mf_malloc((size_t)a->n_tokens * sizeof *e->pos);
                    e->pos_cap = a->n_tokens;
                }
                for (int32_t t = 0; t < a->n_tokens; t++)
                    e->pos[t] = a->batch ? a->batch->pos[t] : a->n_past + t;
                data = e->pos;
            }
            break;
        case MF_INPUT_EXTERNAL:
            if (k_ext >= e->n_ext || !e->ext[k_ext].data || e->ext[k_ext].nbytes != nb)
                return mf_errorf(err, "forward: external input %d (node %d '%s', %zu bytes) not set or %zu bytes",
                                 k_ext, i, n->name, nb, k_ext < e->n_ext ? e->ext[k_ext].nbytes : 0);
            data = e->ext[k_ext++].data;
            break;
        }
        e->in_data[i] = data;
        if (nb == 0 || n->buf < 0)
            continue;
        bool owned = false;
        for (int32_t s = 0; s < e->plan.n_splits && !owned; s++)
            owned = e->plan.splits[s].backend == e->plan.buf_backend[i];
        mf_backend *b = e->be[e->plan.buf_backend[i]];
        if (!owned && b->ops->write_host(b, n->buf, 0, data, nb, err))
            return mf_error_prefix(err, "forward: input node %d '%s'", i, n->name);
    }
    return 0;
}

/* One split on a backend without execute_split (or under MINFER_OP_PROFILE,
 * which times node by node): its host inputs, then execute_node per node. */
static int run_nodes(mf_engine *e, mf_backend *b, const split_run *r, const mf_exec_args *a,
                     mf_error *err) {
    for (int32_t k = 0; k < r->n_host; k++) {
        const mf_host_input *h = &r->host[k];
        if (b->ops->write_host(b, h->buf, 0, h->data, h->nbytes, err))
            return mf_error_prefix(err, "forward: input node %d '%s'", h->node, e->g.nodes[h->node].name);
    }
    for (int32_t k = 0; k < r->n_calls; k++) {
        const mf_node_call *c = &r->calls[k];
        const mf_op op = e->g.nodes[c->node].op;
        uint64_t t0 = e->profile ? mf_time_ns() : 0;
        if (mf_backend_execute_node(b, &e->g, c, a, err))
            return -1;
        if (e->profile) {
            if (b->ops->synchronize(b, err))
                return mf_error_prefix(err, "forward: synchronize after node %d '%s'", c->node,
                                       e->g.nodes[c->node].name);
            e->prof_ns[op] += mf_time_ns() - t0;
            e->prof_n[op]++;
        }
    }
    return 0;
}

/* Runs every split; the last split's backend is left unsynchronized in *last. */
static int run_splits(mf_engine *e, const mf_exec_args *a, int32_t *last, mf_error *err) {
    mf_graph *g = &e->g;
    const mf_plan *pl = &e->plan;
    int32_t prev = -1;
    for (int32_t s = 0; s < pl->n_splits; s++) {
        const mf_split *sp = &pl->splits[s];
        split_run *r = &e->runs[s];
        mf_backend *b = e->be[sp->backend];
        if (prev >= 0 && e->be[prev]->ops->synchronize(e->be[prev], err))
            return mf_error_prefix(err, "forward: synchronize %s", e->be[prev]->ops->name(e->be[prev]));
        for (int32_t k = 0; k < sp->n_inputs; k++) {
            int32_t src = sp->inputs[k];
            mf_backend *sb = e->be[pl->buf_backend[src]];
            size_t nb = mf_node_nbytes(&g->nodes[src]);
            void *h = host_buf(e, nb);
            if (sb->ops->read_host(sb, g->nodes[src].buf, 0, h, nb, err) ||
                b->ops->write_host(b, sp->staging[k], 0, h, nb, err))
                return mf_error_prefix(err, "forward: copying node %d '%s' from %s to %s", src,
                                       g->nodes[src].name, sb->ops->name(sb), b->ops->name(b));
        }
        for (int32_t k = 0; k < r->n_host; k++)
            r->host[k].data = e->in_data[r->host[k].node];
        if (b->ops->execute_split && !e->profile) {
            const mf_split_call call = {.g = g, .index = s, .n_splits = pl->n_splits,
                                        .calls = r->calls, .n_calls = r->n_calls,
                                        .inputs = sp->inputs, .staging = sp->staging, .n_inputs = sp->n_inputs,
                                        .host_inputs = r->host, .n_host_inputs = r->n_host,
                                        .outputs = r->outputs, .out_bufs = r->out_bufs,
                                        .read_back = r->read_back, .n_outputs = r->n_outputs, .args = a};
            if (b->ops->execute_split(b, &call, err))
                return -1;
        } else if (run_nodes(e, b, r, a, err)) {
            return -1;
        }
        prev = sp->backend;
    }
    *last = prev;
    return 0;
}

/* The backend for a layer whose KV no node of the graph placed: the first
 * participating one (priority order). */
static int32_t kv_home(const mf_engine *e, const mf_graph_params *p) {
    for (int i = 0; i < e->nb; i++)
        if (p->backends >> i & 1u)
            return i;
    return 0;
}

/* Completes p (n_ctx, backends) and makes the cached graph the one for p:
 * reused when the params are equal, else rebuilt (KV regions placed, buffers
 * allocated). what: "forward" or "reserve" for the messages. */
static int prepare(mf_engine *e, mf_graph_params *p, mf_graph_build_fn build, void *build_ctx,
                   const char *what, mf_error *err) {
    if (p->n_ctx == 0)
        p->n_ctx = e->o.n_ctx;
    if (p->n_ctx != e->o.n_ctx)
        return mf_errorf(err, "%s: params n_ctx %d != engine n_ctx %d", what, p->n_ctx, e->o.n_ctx);
    p->backends = mf_engine_participants(e, p);
    if (!e->cached || !mf_graph_params_eq(p, &e->gp))
        if (rebuild(e, p, build, build_ctx, err))
            return -1;
    return 0;
}

int mf_engine_reserve(mf_engine *e, mf_graph_params *p, mf_graph_build_fn build, void *build_ctx,
                      mf_error *err) {
    if (p->n_tokens <= 0 || p->n_tokens > e->o.n_ctx)
        return mf_errorf(err, "reserve: n_tokens %d outside [1, n_ctx %d]", p->n_tokens, e->o.n_ctx);
    if (prepare(e, p, build, build_ctx, "reserve", err))
        return -1;
    /* Every layer's KV regions, also those of layers the graph did not touch. */
    for (int32_t l = 0; l < e->o.n_layers; l++)
        if (e->kv[l].backend < 0 && kv_place(e, l, kv_home(e, p), (const uint32_t[2]){p->k_type, p->v_type}, err))
            return -1;
    return 0;
}

static int forward_run(mf_engine *e, mf_graph_params *p, mf_graph_build_fn build, void *build_ctx,
                       const int32_t *tokens, int32_t n_past, const mf_kv_batch *batch,
                       float *logits, mf_error *err);

int mf_engine_forward(mf_engine *e, mf_graph_params *p, mf_graph_build_fn build, void *build_ctx,
                      const int32_t *tokens, int32_t n_past, float *logits, mf_error *err) {
    if (p->n_tokens <= 0 || n_past < 0)
        return mf_errorf(err, "forward: n_tokens %d, n_past %d", p->n_tokens, n_past);
    if ((int64_t)n_past + p->n_tokens > (p->n_ctx ? p->n_ctx : e->o.n_ctx))
        return mf_errorf(err, "forward: context full: n_past %d + n_tokens %d > n_ctx %d", n_past,
                         p->n_tokens, p->n_ctx ? p->n_ctx : e->o.n_ctx);
    if (p->paged)
        return mf_errorf(err, "forward: a paged graph needs mf_engine_forward_batch");
    return forward_run(e, p, build, build_ctx, tokens, n_past, NULL, logits, err);
}

int mf_engine_forward_batch(mf_engine *e, mf_graph_params *p, mf_graph_build_fn build,
                            void *build_ctx, const int32_t *tokens, const mf_kv_batch *b,
                            float *logits, mf_error *err) {
    if (!p->paged || !b || b->n_tokens != p->n_tokens || p->n_tokens <= 0 || b->block_size <= 0)
        return mf_errorf(err, "forward: batch of %d tokens for a %s graph of %d (block size %d)",
                         b ? b->n_tokens : 0, p->paged ? "paged" : "non-paged", p->n_tokens,
                         b ? b->block_size : 0);
    for (int32_t t = 0; t < b->n_tokens; t++) {
        const int32_t s = b->seq[t], pos = b->pos[t];
        if (s < 0 || s >= b->n_seqs || pos < 0)
            return mf_errorf(err, "forward: token %d: sequence %d of %d, position %d", t, s,
                             b->n_seqs, pos);
        const int64_t row = (int64_t)b->tables[s][pos / b->block_size] * b->block_size +
                            pos % b->block_size;
        if (row < 0 || row >= e->o.n_ctx)
            return mf_errorf(err, "forward: token %d (sequence %d, position %d) maps to KV row "
                             "%lld outside the pool's %d", t, s, pos, (long long)row, e->o.n_ctx);
    }
    return forward_run(e, p, build, build_ctx, tokens, 0, b, logits, err);
}

int mf_engine_kv_copy_rows(mf_engine *e, int64_t dst, int64_t src, int64_t n, mf_error *err) {
    if (n <= 0)
        return 0;
    if (dst < 0 || src < 0 || dst + n > e->o.n_ctx || src + n > e->o.n_ctx)
        return mf_errorf(err, "engine: KV copy of %lld rows %lld -> %lld outside %d rows",
                         (long long)n, (long long)src, (long long)dst, e->o.n_ctx);
    for (int32_t l = 0; l < e->o.n_layers; l++) {
        const kv_region *r = &e->kv[l];
        if (r->backend < 0)
            return mf_errorf(err, "engine: KV copy: layer %d has no region yet", l);
        mf_backend *b = e->be[r->backend];
        const int32_t ids[2] = {r->k, r->v};
        for (int w = 0; w < 2; w++) {
            const size_t row = mf_type_row_size(r->type[w], e->o.kv_dim), nb = row * (size_t)n;
            void *h = host_buf(e, nb);
            if (b->ops->read_host(b, ids[w], (size_t)src * row, h, nb, err) ||
                b->ops->write_host(b, ids[w], (size_t)dst * row, h, nb, err))
                return mf_error_prefix(err, "engine: KV copy of layer %d", l);
        }
    }
    return 0;
}

static int forward_run(mf_engine *e, mf_graph_params *p, mf_graph_build_fn build, void *build_ctx,
                       const int32_t *tokens, int32_t n_past, const mf_kv_batch *batch,
                       float *logits, mf_error *err) {
    if (prepare(e, p, build, build_ctx, "forward", err))
        return -1;

    mf_exec_args a = {.n_past = n_past, .n_tokens = p->n_tokens, .n_ctx = p->n_ctx, .k_type = p->k_type,
                      .v_type = p->v_type,
                      .batch = batch};
    int32_t out = -1;
    for (int32_t i = 0; logits && i < e->g.n_nodes; i++)
        if ((e->g.nodes[i].flags & MF_NODE_OUTPUT) && !(e->g.nodes[i].flags & MF_NODE_DEAD))
            out = i;
    const size_t want = (size_t)p->n_outputs * (size_t)e->o.n_vocab * sizeof(float);
    /* where the logits go, known before the launches: the split producing
     * them learns it (read_back) */
    const bool read = out >= 0 && e->g.nodes[out].buf >= 0 && mf_node_nbytes(&e->g.nodes[out]) == want;
    for (int32_t s = 0; s < e->plan.n_splits; s++) {
        split_run *r = &e->runs[s];
        for (int32_t k = 0; k < r->n_outputs; k++)
            r->read_back[k] = read && r->outputs[k] == out ? logits : NULL;
    }
    int32_t last = -1;
    if (fill_inputs(e, tokens, &a, err) || run_splits(e, &a, &last, err))
        return -1;
    if (last >= 0 && e->be[last]->ops->synchronize(e->be[last], err))
        return mf_error_prefix(err, "forward: synchronize %s", e->be[last]->ops->name(e->be[last]));

    if (!logits)
        return 0;
    if (out < 0)
        return mf_errorf(err, "forward: the graph has no node flagged output");
    const mf_node *n = &e->g.nodes[out];
    if (mf_node_nbytes(n) != want || n->buf < 0)
        return mf_errorf(err, "forward: output node %d '%s' has %zu bytes, %d rows of %lld logits need %zu",
                         out, n->name, mf_node_nbytes(n), p->n_outputs, (long long)e->o.n_vocab, want);
    mf_backend *b = e->be[e->plan.buf_backend[out]];
    if (b->ops->read_host(b, n->buf, 0, logits, want, err))
        return mf_error_prefix(err, "forward: reading logits of node %d '%s'", out, n->name);
    return 0;
}
