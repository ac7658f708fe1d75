/* model.c - loading a llama / qwen2 / qwen3 GGUF: hyperparameters, the tensor
 * checks and the zero-copy weight table, plus the all-weights-registered gate. */
#include "model/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant/quant.h"

static const char *const arch_names[MF_ARCH_COUNT] = {
    [MF_ARCH_LLAMA] = "llama",
    [MF_ARCH_QWEN2] = "qwen2",
    [MF_ARCH_QWEN3] = "qwen3",
};

const char *mf_arch_name(mf_arch arch) {
    return (unsigned)arch < MF_ARCH_COUNT ? arch_names[arch] : "unknown";
}

/* ---- hyperparameters ------------------------------------------------------------ */

/* The one policy for a hyperparameter key, applied to the rc of the
 * mf_gguf_get_* call that read it: a bad type/value is an error (prefixed
 * "model"), an absent required key is an error naming it. Returns -1 for
 * those, 1 when the key is absent and optional (use the default), 0 when read. */
static int key_rc(int rc, const char *key, bool required, mf_error *err) {
    if (rc < 0)
        return mf_error_prefix(err, "model");
    if (rc == 1 && required)
        return mf_errorf(err, "model: key '%s' not found", key);
    return rc;
}

/* Reads {arch}.suffix as an int32 / a float; *out = def when absent and not
 * required. 0 or -1 (key_rc). */
static int get_i32(const mf_gguf *g, const char *arch, const char *suffix, bool required,
                   int32_t def, int32_t *out, mf_error *err) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    int rc = key_rc(mf_gguf_get_i32(g, key, out, err), key, required, err);
    if (rc == 1)
        *out = def;
    return rc < 0 ? -1 : 0;
}

static int get_f32(const mf_gguf *g, const char *arch, const char *suffix, bool required,
                   float def, float *out, mf_error *err) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    int rc = key_rc(mf_gguf_get_f32(g, key, out, err), key, required, err);
    if (rc == 1)
        *out = def;
    return rc < 0 ? -1 : 0;
}

/* A positive value no larger than lim, else an error naming the key. */
static int check_range(const char *arch, const char *suffix, int64_t v, int64_t lim,
                       mf_error *err) {
    if (v <= 0 || v > lim)
        return mf_errorf(err, "model: %s.%s = %lld is out of range (1..%lld)", arch, suffix,
                         (long long)v, (long long)lim);
    return 0;
}

static int read_hparams(const mf_gguf *g, mf_arch arch, mf_hparams *hp, mf_error *err) {
    const char *a = arch_names[arch];
    memset(hp, 0, sizeof *hp);
    if (get_i32(g, a, "embedding_length", true, 0, &hp->n_embd, err) ||
        get_i32(g, a, "block_count", true, 0, &hp->n_layer, err) ||
        get_i32(g, a, "feed_forward_length", true, 0, &hp->n_ff, err) ||
        get_i32(g, a, "attention.head_count", true, 0, &hp->n_head, err) ||
        get_i32(g, a, "context_length", true, 0, &hp->n_ctx_train, err))
        return -1;
    if (check_range(a, "embedding_length", hp->n_embd, 1 << 20, err) ||
        check_range(a, "block_count", hp->n_layer, 4096, err) ||
        check_range(a, "feed_forward_length", hp->n_ff, 1 << 22, err) ||
        check_range(a, "attention.head_count", hp->n_head, 4096, err) ||
        check_range(a, "context_length", hp->n_ctx_train, 1 << 30, err))
        return -1;
    if (get_i32(g, a, "attention.head_count_kv", false, hp->n_head, &hp->n_head_kv, err))
        return -1;
    if (check_range(a, "attention.head_count_kv", hp->n_head_kv, hp->n_head, err))
        return -1;
    if (hp->n_head % hp->n_head_kv != 0)
        return mf_errorf(err,
                         "model: %s.attention.head_count %d is not a multiple of "
                         "%s.attention.head_count_kv %d",
                         a, hp->n_head, a, hp->n_head_kv);

    char key[128];
    snprintf(key, sizeof key, "%s.attention.key_length", a);
    if (mf_gguf_find_key(g, key) < 0 && hp->n_embd % hp->n_head != 0)
        return mf_errorf(err,
                         "model: %s.embedding_length %d is not a multiple of "
                         "%s.attention.head_count %d (and no key_length)",
                         a, hp->n_embd, a, hp->n_head);
    if (get_i32(g, a, "attention.key_length", false, hp->n_embd / hp->n_head, &hp->head_dim, err))
        return -1;
    if (check_range(a, "attention.key_length", hp->head_dim, 1 << 16, err))
        return -1;
    int32_t vlen;
    if (get_i32(g, a, "attention.value_length", false, hp->head_dim, &vlen, err))
        return -1;
    if (vlen != hp->head_dim)
        return mf_errorf(err,
                         "model: %s.attention.value_length %d differs from key_length %d "
                         "(unsupported)",
                         a, vlen, hp->head_dim);
    if (get_i32(g, a, "rope.dimension_count", false, hp->head_dim, &hp->n_rot, err))
        return -1;
    if (hp->n_rot <= 0 || hp->n_rot > hp->head_dim || hp->n_rot % 2 != 0)
        return mf_errorf(err, "model: %s.rope.dimension_count %d must be even and in 2..%d", a,
                         hp->n_rot, hp->head_dim);

    if (get_f32(g, a, "rope.freq_base", false, 10000.0f, &hp->rope_theta, err) ||
        get_f32(g, a, "attention.layer_norm_rms_epsilon", true, 0, &hp->norm_eps, err))
        return -1;
    if (!(hp->rope_theta > 0) || !isfinite(hp->rope_theta))
        return mf_errorf(err, "model: %s.rope.freq_base %g must be positive", a,
                         (double)hp->rope_theta);
    if (!(hp->norm_eps > 0) || !(hp->norm_eps < 1))
        return mf_errorf(err, "model: %s.attention.layer_norm_rms_epsilon %g must be in (0, 1)",
                         a, (double)hp->norm_eps);

    hp->freq_scale = 1.0f;
    snprintf(key, sizeof key, "%s.rope.scaling.type", a);
    mf_str stype;
    int rc = key_rc(mf_gguf_get_str(g, key, &stype, err), key, false, err);
    if (rc < 0)
        return -1;
    if (rc == 0 && strcmp(stype.ptr, "none") != 0) {
        if (strcmp(stype.ptr, "linear") != 0)
            return mf_errorf(err, "model: %s = '%s' is not supported (none, linear)", key,
                             stype.ptr);
        float factor;
        if (get_f32(g, a, "rope.scaling.factor", true, 1.0f, &factor, err))
            return -1;
        if (!(factor > 0) || !isfinite(factor))
            return mf_errorf(err, "model: %s.rope.scaling.factor %g must be positive", a,
                             (double)factor);
        hp->freq_scale = 1.0f / factor;
    }
    hp->rope_mode = arch == MF_ARCH_LLAMA ? MF_ROPE_NORMAL : MF_ROPE_NEOX;
    return 0;
}

/* ---- tensors --------------------------------------------------------------------- */

static const char *add_name(mf_model *m, const char *fmt, int layer, const char *what) {
    char buf[MF_GGUF_MAX_NAME];
    if (layer >= 0)
        snprintf(buf, sizeof buf, fmt, layer, what);
    else
        snprintf(buf, sizeof buf, fmt, what);
    if (m->n_gw == m->cap_gw) {
        m->cap_gw = m->cap_gw ? 2 * m->cap_gw : 64;
        m->gw_names = mf_realloc(m->gw_names, (size_t)m->cap_gw * sizeof *m->gw_names);
    }
    m->gw_names[m->n_gw] = mf_strdup(buf);
    return m->gw_names[m->n_gw++];
}

static void shape_str(const int64_t *ne, uint32_t n_dims, char *buf, size_t n) {
    size_t o = 0;
    o += (size_t)snprintf(buf + o, n - o, "[");
    for (uint32_t i = 0; i < n_dims && o < n; i++)
        o += (size_t)snprintf(buf + o, n - o, "%s%lld", i ? ", " : "", (long long)ne[i]);
    if (o < n)
        snprintf(buf + o, n - o, "]");
}

enum { KIND_MATRIX, KIND_VECTOR, KIND_EMBED };

/* Checks that name exists with shape {ne0, ne1} (ne1 = 0: a vector) and a type
 * the kind allows. */
static int check_tensor(const mf_gguf *g, const char *name, int kind, int64_t ne0, int64_t ne1,
                        mf_error *err) {
    const mf_gguf_tensor *t = mf_gguf_find_tensor(g, name);
    if (!t)
        return mf_errorf(err, "model: tensor '%s' not found", name);
    int64_t want[4] = {ne0, ne1 ? ne1 : 1, 1, 1};
    uint32_t want_dims = ne1 ? 2 : 1;
    if (t->ne[0] != want[0] || t->ne[1] != want[1] || t->ne[2] != 1 || t->ne[3] != 1) {
        char a[96], b[96];
        shape_str(t->ne, t->n_dims, a, sizeof a);
        shape_str(want, want_dims, b, sizeof b);
        return mf_errorf(err, "model: tensor '%s' has shape %s, expected %s", name, a, b);
    }
    bool ok;
    if (kind == KIND_VECTOR)
        ok = t->type == MF_TYPE_F32 || t->type == MF_TYPE_F16 || t->type == MF_TYPE_BF16;
    else
        ok = mf_type_is_weight(t->type) && mf_type_row_size(t->type, t->ne[0]) != 0;
    if (!ok)
        return mf_errorf(err, "model: tensor '%s' has unsupported type %s (%u) for a %s", name,
                         mf_type_name(t->type), t->type,
                         kind == KIND_VECTOR ? "norm/bias vector" : "weight matrix");
    return 0;
}

static int check_tensors(mf_model *m, void (*progress)(void *, float, const char *), void *pu,
                         mf_error *err) {
    const mf_gguf *g = m->gguf;
    mf_hparams *hp = &m->hp;
    const mf_gguf_tensor *emb = mf_gguf_find_tensor(g, "token_embd.weight");
    if (!emb)
        return mf_errorf(err, "model: tensor 'token_embd.weight' not found");
    if (emb->ne[1] <= 0 || emb->ne[1] > INT32_MAX)
        return mf_errorf(err, "model: tensor 'token_embd.weight' has %lld rows",
                         (long long)emb->ne[1]);
    hp->n_vocab = (int32_t)emb->ne[1];
    char key[128];
    snprintf(key, sizeof key, "%s.vocab_size", arch_names[m->arch]);
    int32_t vs;
    int rc = mf_gguf_get_i32(g, key, &vs, err);
    if (rc < 0)
        return mf_error_prefix(err, "model");
    if (rc == 0 && vs != hp->n_vocab)
        return mf_errorf(err, "model: %s = %d but token_embd.weight has %d rows", key, vs,
                         hp->n_vocab);

    const int64_t d = hp->n_embd, q_dim = (int64_t)hp->n_head * hp->head_dim,
                  kv_dim = (int64_t)hp->n_head_kv * hp->head_dim;
    m->tok_embd = add_name(m, "%s", -1, "token_embd.weight");
    if (check_tensor(g, m->tok_embd, KIND_EMBED, d, hp->n_vocab, err))
        return -1;

    m->layers = mf_calloc((size_t)hp->n_layer, sizeof *m->layers);
    for (int32_t l = 0; l < hp->n_layer; l++) {
        mf_layer_names *L = &m->layers[l];
        const char *f = "blk.%d.%s";
        L->attn_norm = add_name(m, f, l, "attn_norm.weight");
        L->wq = add_name(m, f, l, "attn_q.weight");
        L->wk = add_name(m, f, l, "attn_k.weight");
        L->wv = add_name(m, f, l, "attn_v.weight");
        if (check_tensor(g, L->attn_norm, KIND_VECTOR, d, 0, err) ||
            check_tensor(g, L->wq, KIND_MATRIX, d, q_dim, err) ||
            check_tensor(g, L->wk, KIND_MATRIX, d, kv_dim, err) ||
            check_tensor(g, L->wv, KIND_MATRIX, d, kv_dim, err))
            return -1;
        /* Biases: qwen2 has them; any arch may (they are used when present). */
        char nb[MF_GGUF_MAX_NAME];
        snprintf(nb, sizeof nb, "blk.%d.attn_q.bias", l);
        bool has_bias = mf_gguf_find_tensor(g, nb) != NULL;
        if (m->arch == MF_ARCH_QWEN2 || has_bias) {
            L->bq = add_name(m, f, l, "attn_q.bias");
            L->bk = add_name(m, f, l, "attn_k.bias");
            L->bv = add_name(m, f, l, "attn_v.bias");
            if (check_tensor(g, L->bq, KIND_VECTOR, q_dim, 0, err) ||
                check_tensor(g, L->bk, KIND_VECTOR, kv_dim, 0, err) ||
                check_tensor(g, L->bv, KIND_VECTOR, kv_dim, 0, err))
                return -1;
        }
        if (m->arch == MF_ARCH_QWEN3) {
            L->q_norm = add_name(m, f, l, "attn_q_norm.weight");
            L->k_norm = add_name(m, f, l, "attn_k_norm.weight");
            if (check_tensor(g, L->q_norm, KIND_VECTOR, hp->head_dim, 0, err) ||
                check_tensor(g, L->k_norm, KIND_VECTOR, hp->head_dim, 0, err))
                return -1;
        }
        L->wo = add_name(m, f, l, "attn_output.weight");
        L->ffn_norm = add_name(m, f, l, "ffn_norm.weight");
        L->gate = add_name(m, f, l, "ffn_gate.weight");
        L->up = add_name(m, f, l, "ffn_up.weight");
        L->down = add_name(m, f, l, "ffn_down.weight");
        if (check_tensor(g, L->wo, KIND_MATRIX, q_dim, d, err) ||
            check_tensor(g, L->ffn_norm, KIND_VECTOR, d, 0, err) ||
            check_tensor(g, L->gate, KIND_MATRIX, d, hp->n_ff, err) ||
            check_tensor(g, L->up, KIND_MATRIX, d, hp->n_ff, err) ||
            check_tensor(g, L->down, KIND_MATRIX, hp->n_ff, d, err))
            return -1;
        if (progress)
            progress(pu, (float)(l + 1) / (float)(hp->n_layer + 1), "loading");
    }
    m->out_norm = add_name(m, "%s", -1, "output_norm.weight");
    if (check_tensor(g, m->out_norm, KIND_VECTOR, d, 0, err))
        return -1;
    if (mf_gguf_find_tensor(g, "output.weight")) {
        m->output = add_name(m, "%s", -1, "output.weight");
        if (check_tensor(g, m->output, KIND_MATRIX, d, hp->n_vocab, err))
            return -1;
    } else {
        m->tied = true;
        m->output = m->tok_embd;
        /* The embedding becomes a matmul weight: its type must be one. */
        if (check_tensor(g, m->tok_embd, KIND_MATRIX, d, hp->n_vocab, err))
            return -1;
    }
    return 0;
}

/* Adds every GGUF tensor as a view, sums the graph's weights and picks the
 * description's type (the one holding the most bytes). */
static int fill_weights(mf_model *m, mf_error *err) {
    m->weights = mf_weights_new();
    for (int64_t i = 0; i < mf_gguf_n_tensors(m->gguf); i++) {
        const mf_gguf_tensor *t = mf_gguf_tensor_at(m->gguf, i);
        mf_weight w = {.name = t->name.ptr, .type = t->type, .n_dims = t->n_dims,
                       .data = t->data, .nbytes = t->nbytes};
        memcpy(w.ne, t->ne, sizeof w.ne);
        if (mf_weights_add(m->weights, &w, err))
            return mf_error_prefix(err, "model");
    }
    uint64_t by_type[MF_TYPE_COUNT] = {0};
    for (int32_t i = 0; i < m->n_gw; i++) {
        const mf_weight *w = mf_weights_find(m->weights, m->gw_names[i]);
        MF_ASSERT(w);
        m->weight_bytes += w->nbytes;
        m->n_params += w->ne[0] * w->ne[1] * w->ne[2] * w->ne[3];
        if (w->type < MF_TYPE_COUNT && w->n_dims >= 2)
            by_type[w->type] += w->nbytes;
    }
    uint32_t best = 0;
    for (uint32_t t = 0; t < MF_TYPE_COUNT; t++)
        if (by_type[t] > by_type[best])
            best = t;
    double p = (double)m->n_params;
    char size[32];
    if (p >= 1e9)
        snprintf(size, sizeof size, "%.1fB", p / 1e9);
    else
        snprintf(size, sizeof size, "%.0fM", p / 1e6);
    /* Name the file type as users know it (Q4_K_M) when the file says it;
     * else the type holding the most bytes. */
    uint32_t ftype = 0;
    const char *tname = NULL;
    if (mf_gguf_get_u32(m->gguf, "general.file_type", &ftype, NULL) == 0)
        tname = mf_ftype_name(ftype);
    snprintf(m->desc, sizeof m->desc, "%s %s %s", arch_names[m->arch], size,
             tname ? tname : mf_type_name(best));
    return 0;
}

int mf_model_load(const char *path, void (*progress)(void *user, float frac, const char *what),
                  void *progress_user, mf_model **out, mf_error *err) {
    *out = NULL;
    mf_model *m = mf_calloc(1, sizeof *m);
    if (progress)
        progress(progress_user, 0.0f, "loading");
    if (mf_gguf_open(path, &m->gguf, err))
        goto fail;
    mf_str arch;
    int rc = mf_gguf_get_str(m->gguf, "general.architecture", &arch, err);
    if (rc < 0) {
        mf_error_prefix(err, "model");
        goto fail;
    }
    if (rc == 1) {
        mf_errorf(err, "model: key 'general.architecture' not found in '%s'", path);
        goto fail;
    }
    m->arch = MF_ARCH_COUNT;
    for (int a = 0; a < MF_ARCH_COUNT; a++)
        if (!strcmp(arch.ptr, arch_names[a]))
            m->arch = (mf_arch)a;
    if (m->arch == MF_ARCH_COUNT) {
        mf_errorf(err, "model: unsupported architecture '%s' (supported: llama, qwen2, qwen3)",
                  arch.ptr);
        goto fail;
    }
    if (read_hparams(m->gguf, m->arch, &m->hp, err) || check_tensors(m, progress, progress_user, err) ||
        fill_weights(m, err))
        goto fail;
    if (progress)
        progress(progress_user, 1.0f, "loading");
    *out = m;
    return 0;
fail:
    mf_model_free(m);
    return -1;
}

void mf_model_free(mf_model *m) {
    if (!m)
        return;
    mf_weights_free(m->weights);
    for (int32_t i = 0; i < m->n_gw; i++)
        free(m->gw_names[i]);
    free(m->gw_names);
    free(m->layers);
    mf_gguf_close(m->gguf);
    free(m);
}

uint32_t mf_model_wtype(const mf_model *m, const char *name) {
    const mf_weight *w = mf_weights_find(m->weights, name);
    MF_ASSERT(w);
    return w->type;
}

int32_t mf_model_graph_weights(const mf_model *m, const char *const **names) {
    *names = (const char *const *)m->gw_names;
    return m->n_gw;
}
