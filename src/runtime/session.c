/* session.c - a session: the engine (backends + cached graph + KV cache) for
 * one context, prefill in batches, one-token decode, and the graph params of
 * each forward (the reuse identity: n_tokens, outputs, participation,
 * fusions). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "quant/quant.h"
#include "runtime/levers.h"
#include "runtime/runtime.h"

#define DEFAULT_CTX 4096
#define DEFAULT_BATCH 512

void minfer_session_options_default(minfer_session_options *o) {
    *o = (minfer_session_options){.n_ctx = 0, .n_batch = DEFAULT_BATCH, .cache_type = NULL,
                                  .logits_all = false};
}

static void set_err(char *err, size_t errlen, const mf_error *e) {
    if (err && errlen)
        snprintf(err, errlen, "%s", e->msg);
}

const char *mf_rt_default_cache_type(const minfer_model *mm) {
    const mf_hparams *hp = &mm->m->hp;
    for (int i = 0; i < mm->n_be; i++)
        if (mm->be[i]->auto_cache_type) {
            const uint32_t t = mm->be[i]->auto_cache_type(hp->n_layer, (int64_t)hp->n_head_kv * hp->head_dim);
            return t == MF_TYPE_F16 ? "f16" : t == MF_TYPE_Q8_0 ? "q8_0" : "f32";
        }
    return "f32";
}

static const uint32_t cache_types[] = {MF_TYPE_F32,  MF_TYPE_F16,  MF_TYPE_Q8_0, MF_TYPE_Q4_0,
                                       MF_TYPE_Q4_1, MF_TYPE_Q5_0, MF_TYPE_Q5_1};

int mf_rt_parse_cache_type(const char *name, const char *source, int32_t head_dim, uint32_t *out,
                           mf_error *err) {
    int found = -1;
    for (int i = 0; i < (int)(sizeof cache_types / sizeof cache_types[0]); i++)
        if (!strcmp(name, mf_type_name(cache_types[i])))
            found = i;
    if (found < 0)
        return mf_errorf(err, "%s '%s' is not a cache type (f32, f16, q8_0, q4_0, q4_1, q5_0, q5_1)", source,
                         name);
    *out = cache_types[found];
    const int64_t bs = mf_type_get(*out)->block_size;
    if (head_dim % bs != 0)
        return mf_errorf(err, "%s %s needs head_dim %% %lld == 0, this model's head_dim is %d", source, name,
                         (long long)bs, head_dim);
    return 0;
}

int mf_rt_cache_types(const minfer_model *mm, const char *k, const char *v, const char *who, uint32_t out[2],
                      mf_error *err) {
    const int32_t hd = mm->m->hp.head_dim;
    const char *env = mf_lever_str("MINFER_CACHE_TYPE");
    if (env && *env) {
        if (mf_rt_parse_cache_type(env, "MINFER_CACHE_TYPE", hd, &out[0], err))
            return mf_error_prefix(err, "%s", who);
        out[1] = out[0];
        return 0;
    }
    const bool has_k = k && *k, has_v = v && *v;
    if (mf_rt_parse_cache_type(has_k ? k : mf_rt_default_cache_type(mm), "K cache type", hd, &out[0], err) ||
        mf_rt_parse_cache_type(has_v ? v : has_k ? k : mf_rt_default_cache_type(mm), "V cache type", hd, &out[1],
                               err))
        return mf_error_prefix(err, "%s", who);
    return 0;
}

int mf_rt_check_gpu_kv(mf_engine *e, bool gpu, const uint32_t t[2], bool unfused, const char *who,
                       mf_error *err) {
    if (!gpu)
        return 0;
    const char *name = "the GPU backend";
    for (int i = 0; i < mf_engine_n_backends(e); i++)
        if (mf_engine_backend(e, i)->is_gpu) {
            name = mf_engine_backend(e, i)->ops->name(mf_engine_backend(e, i));
            break;
        }
    if (t[0] != t[1])
        return mf_errorf(err, "%s: %s keeps K and V in one cache type, K %s and V %s differ (use the cpu "
                              "device for mixed types)", who, name, mf_type_name(t[0]), mf_type_name(t[1]));
    if (t[0] != MF_TYPE_F32 && t[0] != MF_TYPE_F16 && t[0] != MF_TYPE_Q8_0)
        return mf_errorf(err, "%s: %s has no %s KV cache (f32, f16, q8_0; the cpu device has %s)", who, name,
                         mf_type_name(t[0]), mf_type_name(t[0]));
    if (unfused)
        return mf_errorf(err, "%s: %s has only fused attention; flash attention off runs on the cpu device",
                         who, name);
    return 0;
}

/* The graph params of a forward of nt tokens: the reuse identity. Decode
 * (nt == 1) asks for the fused attention input: FUSED_QKV(_NORM) when the
 * leading backend has it, else the QKV_BIAS_ROPE_STORE epilogue after three
 * plain matmuls; each has its MINFER_NO_FUSE_* kill switch. (Fusing CPU
 * prefill too measured no gain: docs/PERF.md, "decided not".) */
static void forward_params(const minfer_session *s, int32_t nt, mf_graph_params *p) {
    const bool decode = nt == 1;
    const bool qwen3 = s->model->m->arch == MF_ARCH_QWEN3;
    const mf_fused_kind qkv = qwen3 ? MF_FUSE_QKV_NORM : MF_FUSE_QKV;
    *p = (mf_graph_params){
        .n_tokens = nt,
        .n_outputs = s->logits_all ? nt : 1,
        .n_ctx = s->n_ctx,
        .k_type = s->kv_type[0],
        .v_type = s->kv_type[1],
        .attn_unfused = s->attn_unfused,
        .gpu = s->gpu, /* the engine derives p.backends from it */
    };
    p->fuse_qkv = decode && !s->fuse_off[qkv] && mf_engine_supports_fused(s->eng, p, qkv);
    p->fuse_qkv_epilogue = decode && !p->fuse_qkv && !s->fuse_off[MF_FUSE_QKV_EPILOGUE] &&
                           mf_engine_supports_fused(s->eng, p, MF_FUSE_QKV_EPILOGUE);
    p->fuse_ffn = decode && !s->fuse_off[MF_FUSE_FFN] &&
                  mf_engine_supports_fused(s->eng, p, MF_FUSE_FFN);
    p->fuse_swiglu = !s->fuse_off[MF_FUSE_SWIGLU] &&
                     mf_engine_supports_fused(s->eng, p, MF_FUSE_SWIGLU);
}

/* A KV cache in host memory larger than the machine's RAM, or than the
 * memory available to this process now, is refused before any of it is touched (overcommit would let the allocation succeed and the
 * zeroing be killed). GPU-resident caches are left to the device allocator. */
static int check_host_memory(const minfer_session *s, uint64_t kv_bytes, mf_error *err) {
#ifdef _SC_PHYS_PAGES
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    if (s->gpu || pages <= 0 || psz <= 0)
        return 0;
    uint64_t ram = (uint64_t)pages * (uint64_t)psz;
    if (kv_bytes > ram)
        return mf_errorf(err, "session: KV cache of %llu bytes (n_ctx %d) exceeds the %llu bytes of RAM",
                         (unsigned long long)kv_bytes, s->n_ctx, (unsigned long long)ram);
    /* What is free matters, not what is installed: a cache that fits RAM but
     * not what other processes (or the cgroup limit) leave would pass and
     * then meet the OOM killer while being zeroed. */
    uint64_t avail;
    const char *src;
    if (mf_mem_available(&avail, &src) == 0 && kv_bytes > avail)
        return mf_errorf(err, "session: KV cache of %llu bytes (n_ctx %d) exceeds the %llu bytes of "
                              "memory available (%s); lower the context size or use a smaller KV type",
                         (unsigned long long)kv_bytes, s->n_ctx, (unsigned long long)avail, src);
#else
    (void)s;
    (void)kv_bytes;
    (void)err;
#endif
    return 0;
}

/* Makes the engine backends in the model's priority list and decides who
 * takes part: a GPU backend only through the all-weights-registered gate. */
int mf_rt_make_engine(const minfer_model *mm, int32_t n_rows, const uint32_t kv_types[2], mf_engine **out,
                      bool *gpu, mf_error *err) {
    const mf_model *m = mm->m;
    mf_backend *be[MF_RT_MAX_BACKENDS];
    int n = 0;
    for (int i = 0; i < mm->n_be; i++) {
        if (mm->made[i]) { /* made at model load; the engine holds a reference */
            mf_backend_retain(mm->made[i]);
            be[n++] = mm->made[i];
            continue;
        }
        mf_backend_options bo = mm->bo;
        bo.cache_type = kv_types[0];
        if (mm->be[i]->create(m->weights, &bo, &be[n], err)) {
            while (n > 0)
                mf_backend_free(be[--n]);
            return mf_error_prefix(err, "session");
        }
        n++;
    }
    /* The gate runs before any graph exists: all or nothing per GPU backend. */
    bool off[MF_RT_MAX_BACKENDS] = {false};
    *gpu = false;
    const char *const *names = NULL;
    const int32_t n_names = mf_model_graph_weights(m, &names);
    for (int i = 0; i < n; i++) {
        const char *missing = NULL;
        if (be[i]->is_gpu && !mf_backend_weights_on(be[i], names, n_names, &missing)) {
            fprintf(stderr,
                    "session: %s does not hold weight '%s'; the whole graph runs on the CPU\n",
                    be[i]->ops->name(be[i]), missing);
            off[i] = true;
            continue;
        }
        *gpu |= be[i]->is_gpu;
    }
    mf_engine_opts eo = {.n_layers = m->hp.n_layer,
                         .kv_dim = (int64_t)m->hp.n_head_kv * m->hp.head_dim,
                         .n_ctx = n_rows,
                         .k_type = kv_types[0],
                         .v_type = kv_types[1],
                         .n_vocab = m->hp.n_vocab,
                         .alternate = mf_lever_flag("MINFER_ALTERNATE_BACKENDS"),
                         .trace = (int32_t)mf_lever_int("MINFER_GRAPH_TRACE"),
                         .profile = mf_lever_flag("MINFER_OP_PROFILE")};
    if (mf_engine_new(&eo, be, n, out, err)) /* frees the backends on failure */
        return mf_error_prefix(err, "session");
    for (int i = 0; i < n; i++)
        if (off[i])
            mf_engine_set_backend_enabled(*out, i, false);
    return 0;
}

minfer_session *minfer_session_new(minfer_model *mm, const minfer_session_options *o, char *err,
                                   size_t errlen) {
    mf_error e = {{0}};
    minfer_session_options def;
    if (!o) {
        minfer_session_options_default(&def);
        o = &def;
    }
    const mf_hparams *hp = &mm->m->hp;
    const int64_t kv_dim = (int64_t)hp->n_head_kv * hp->head_dim;
    minfer_session *s = mf_calloc(1, sizeof *s);
    s->model = mm;
    if (o->n_ctx < 0) {
        mf_errorf(&e, "session: n_ctx %d is negative", o->n_ctx);
        goto fail;
    }
    /* Positions past the trained context are not something RoPE models were
     * taught; refused (not warned) so a typo in -c cannot ask for terabytes. */
    if (o->n_ctx > hp->n_ctx_train) {
        mf_errorf(&e, "session: n_ctx %d exceeds the model's trained context of %d", o->n_ctx,
                  hp->n_ctx_train);
        goto fail;
    }
    s->n_ctx = o->n_ctx ? o->n_ctx
                        : (hp->n_ctx_train < DEFAULT_CTX ? hp->n_ctx_train : DEFAULT_CTX);
    s->n_batch = o->n_batch > 0 ? o->n_batch : DEFAULT_BATCH;
    if (s->n_batch > s->n_ctx)
        s->n_batch = s->n_ctx;
    s->logits_all = o->logits_all;

    if (mf_rt_cache_types(mm, o->cache_type, o->cache_type_v, "session", s->kv_type, &e))
        goto fail;
    s->attn_unfused = o->flash_attn_off;

    s->fuse_off[MF_FUSE_QKV] = s->fuse_off[MF_FUSE_QKV_NORM] = mf_lever_flag("MINFER_NO_FUSE_QKV");
    s->fuse_off[MF_FUSE_FFN] = mf_lever_flag("MINFER_NO_FUSE_FFN");
    s->fuse_off[MF_FUSE_SWIGLU] = mf_lever_flag("MINFER_NO_FUSE_SWIGLU");
    s->fuse_off[MF_FUSE_QKV_EPILOGUE] = mf_lever_flag("MINFER_NO_FUSE_QKV_EPILOGUE");
    s->rebuild_each = mf_lever_flag("MINFER_GRAPH_REBUILD");

    /* Said before allocating, so a context too large for memory is explained. */
    uint64_t kv_bytes = minfer_session_kv_bytes(s);
    if (mf_log_get_level() <= MF_LOG_WARN)
        fprintf(stderr, "session: n_ctx %d, KV cache K %s + V %s %.2f MiB (%d layers x %d x %lld)\n",
                s->n_ctx, mf_type_name(s->kv_type[0]), mf_type_name(s->kv_type[1]),
                (double)kv_bytes / (1024.0 * 1024.0), hp->n_layer, s->n_ctx, (long long)kv_dim);
    if (mf_rt_make_engine(s->model, s->n_ctx, s->kv_type, &s->eng, &s->gpu, &e) ||
        mf_rt_check_gpu_kv(s->eng, s->gpu, s->kv_type, s->attn_unfused, "session", &e))
        goto fail;
    /* pinned by the GPU backend when there is one: each decode step's logits
     * then come back in one DMA with no staging copy */
    size_t rows = s->logits_all ? (size_t)s->n_batch : 1;
    s->logits = mf_engine_host_alloc(s->eng, rows * (size_t)hp->n_vocab * sizeof *s->logits);
    if (!s->logits) {
        mf_errorf(&e, "session: out of memory for %zu rows of %d logits", rows, hp->n_vocab);
        goto fail;
    }
    if (check_host_memory(s, kv_bytes, &e))
        goto fail;
    /* The largest forward (a full batch) and every KV region, now: a context
     * too large for memory fails here with one line, not in mid-answer. */
    mf_graph_params p;
    forward_params(s, s->n_batch, &p);
    if (mf_engine_reserve(s->eng, &p, mf_model_build_graph, s->model->m, &e)) {
        mf_error_prefix(&e, "session: reserving n_ctx %d, n_batch %d", s->n_ctx, s->n_batch);
        goto fail;
    }
    return s;
fail:
    set_err(err, errlen, &e);
    minfer_session_free(s);
    return NULL;
}

void minfer_session_free(minfer_session *s) {
    if (!s)
        return;
    if (s->eng)
        mf_engine_host_free(s->eng, s->logits);
    else
        free(s->logits);
    mf_engine_free(s->eng);
    free(s);
}

int32_t minfer_session_n_ctx(const minfer_session *s) { return s->n_ctx; }
int32_t minfer_session_n_past(const minfer_session *s) { return s->n_past; }

uint64_t minfer_session_kv_bytes(const minfer_session *s) {
    const mf_hparams *hp = &s->model->m->hp;
    const int64_t kv_dim = (int64_t)hp->n_head_kv * hp->head_dim;
    return (uint64_t)hp->n_layer * (uint64_t)s->n_ctx *
           (mf_type_row_size(s->kv_type[0], kv_dim) + mf_type_row_size(s->kv_type[1], kv_dim));
}

void minfer_session_reset(minfer_session *s) {
    s->n_past = 0;
    s->n_logits = 0;
}

/* One engine forward of nt tokens at n_past (nt <= n_batch). */
static int forward(minfer_session *s, const int32_t *toks, int32_t nt, mf_error *err) {
    mf_graph_params p;
    forward_params(s, nt, &p);
    if (s->rebuild_each)
        mf_engine_invalidate(s->eng);
    if (mf_engine_forward(s->eng, &p, mf_model_build_graph, s->model->m, toks, s->n_past,
                          s->logits, err))
        return -1;
    s->n_past += nt;
    s->n_logits = p.n_outputs;
    return 0;
}

int minfer_prefill(minfer_session *s, const int32_t *tokens, int32_t n, char *err, size_t errlen) {
    mf_error e = {{0}};
    const int32_t n_vocab = s->model->m->hp.n_vocab;
    if (n <= 0) {
        mf_errorf(&e, "prefill: %d tokens", n);
        goto fail;
    }
    if ((int64_t)s->n_past + n > s->n_ctx) {
        mf_errorf(&e, "context full: %d tokens in context + %d new > n_ctx %d", s->n_past, n,
                  s->n_ctx);
        goto fail;
    }
    for (int32_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= n_vocab) {
            mf_errorf(&e, "prefill: token %d has id %d outside the vocabulary (%d)", i, tokens[i],
                      n_vocab);
            goto fail;
        }
    for (int32_t i = 0; i < n; i += s->n_batch) {
        int32_t nb = n - i < s->n_batch ? n - i : s->n_batch;
        if (forward(s, tokens + i, nb, &e))
            goto fail;
    }
    return 0;
fail:
    set_err(err, errlen, &e);
    return -1;
}

int minfer_decode(minfer_session *s, int32_t token, char *err, size_t errlen) {
    return minfer_prefill(s, &token, 1, err, errlen);
}

const float *minfer_logits(const minfer_session *s) {
    if (s->n_logits <= 0)
        return NULL;
    return s->logits + (size_t)(s->n_logits - 1) * (size_t)s->model->m->hp.n_vocab;
}

const float *minfer_logits_ith(const minfer_session *s, int32_t i) {
    if (i < 0 || i >= s->n_logits)
        return NULL;
    return s->logits + (size_t)i * (size_t)s->model->m->hp.n_vocab;
}
