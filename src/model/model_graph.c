/* model_graph.c - the transformer graph builder shared by llama, qwen2 and
 * qwen3 (they differ only in RoPE mode, Q/K/V biases and Qwen3's per-head
 * Q/K RMSNorm). */
#include <math.h>

#include "model/model.h"

static mf_matmul_meta mm_meta(const mf_model *m, const char *w, const char *bias, int64_t n_in,
                              int64_t n_out) {
    return (mf_matmul_meta){.weight = w, .wtype = mf_model_wtype(m, w), .bias = bias,
                            .n_in = n_in, .n_out = n_out};
}

static int32_t matmul(mf_graph *g, const mf_model *m, int32_t x, const char *w, const char *bias,
                      int64_t n_in, int64_t n_out) {
    return mf_g_matmul(g, x, w, mf_model_wtype(m, w), bias, n_in, n_out);
}

/* The unfused-matmul form of the fused attention input: three plain matmuls
 * (no bias: the epilogue adds it) feeding one QKV_BIAS_ROPE_STORE node
 * (srcs q, k, v, positions) that adds the biases, applies the optional
 * per-head Q/K norms and RoPE, stores K/V and outputs the roped Q. */
static int32_t qkv_epilogue(mf_graph *g, const mf_model *m, int32_t x, int32_t pos,
                            const mf_qkv_meta *qm) {
    const int32_t l = qm->layer;
    int32_t q = matmul(g, m, x, qm->q.weight, NULL, qm->q.n_in, qm->q.n_out);
    mf_g_set_name(g, q, "blk.%d.attn_q", l);
    int32_t k = matmul(g, m, x, qm->k.weight, NULL, qm->k.n_in, qm->k.n_out);
    mf_g_set_name(g, k, "blk.%d.attn_k", l);
    int32_t v = matmul(g, m, x, qm->v.weight, NULL, qm->v.n_in, qm->v.n_out);
    mf_g_set_name(g, v, "blk.%d.attn_v", l);
    int32_t id = mf_g_node(g, MF_OP_QKV_BIAS_ROPE_STORE, MF_DTYPE_F32, qm->q.n_out, g->nodes[x].ne[1],
                           (int32_t[]){q, k, v, pos}, 4);
    mf_qkv_meta c = *qm;
    const mf_matmul_meta *src[3] = {&qm->q, &qm->k, &qm->v};
    mf_matmul_meta *dst[3] = {&c.q, &c.k, &c.v};
    for (int i = 0; i < 3; i++) {
        dst[i]->weight = mf_g_str(g, src[i]->weight);
        dst[i]->bias = mf_g_str(g, src[i]->bias);
    }
    c.q_norm = mf_g_str(g, qm->q_norm);
    c.k_norm = mf_g_str(g, qm->k_norm);
    g->nodes[id].meta.qkv = c;
    g->nodes[id].layer = l;
    return id;
}

/* Attention half of layer l: x -> x + Wo attn(...). */
static int32_t build_attn(mf_graph *g, const mf_model *m, const mf_graph_params *p, int32_t l,
                          int32_t x, int32_t pos) {
    const mf_hparams *hp = &m->hp;
    const mf_layer_names *L = &m->layers[l];
    const int64_t d = hp->n_embd, q_dim = (int64_t)hp->n_head * hp->head_dim,
                  kv_dim = (int64_t)hp->n_head_kv * hp->head_dim;
    mf_rope_meta rq = {.n_head = hp->n_head, .head_dim = hp->head_dim, .n_rot = hp->n_rot,
                       .mode = hp->rope_mode, .theta = hp->rope_theta,
                       .freq_scale = hp->freq_scale};
    mf_rope_meta rk = rq;
    rk.n_head = hp->n_head_kv;

    int32_t n1 = mf_g_rmsnorm(g, x, L->attn_norm, hp->norm_eps);
    mf_g_set_name(g, n1, "blk.%d.attn_norm", l);
    mf_attn_meta am = {.layer = l, .n_head = hp->n_head, .n_head_kv = hp->n_head_kv,
                       .head_dim = hp->head_dim, .scale = 1.0f / sqrtf((float)hp->head_dim),
                       .unfused = p->attn_unfused};
    int32_t q, store, a;
    if (p->paged) {
        /* many sequences: the same per-row ops whatever the batch, so a row's
         * bits do not depend on its neighbours */
        q = matmul(g, m, n1, L->wq, L->bq, d, q_dim);
        mf_g_set_name(g, q, "blk.%d.attn_q", l);
        int32_t k = matmul(g, m, n1, L->wk, L->bk, d, kv_dim);
        mf_g_set_name(g, k, "blk.%d.attn_k", l);
        int32_t v = matmul(g, m, n1, L->wv, L->bv, d, kv_dim);
        mf_g_set_name(g, v, "blk.%d.attn_v", l);
        if (L->q_norm) {
            q = mf_g_qknorm(g, q, L->q_norm, hp->head_dim, hp->norm_eps);
            mf_g_set_name(g, q, "blk.%d.attn_q_norm", l);
            k = mf_g_qknorm(g, k, L->k_norm, hp->head_dim, hp->norm_eps);
            mf_g_set_name(g, k, "blk.%d.attn_k_norm", l);
        }
        q = mf_g_rope(g, q, pos, &rq);
        mf_g_set_name(g, q, "blk.%d.rope_q", l);
        k = mf_g_rope(g, k, pos, &rk);
        mf_g_set_name(g, k, "blk.%d.rope_k", l);
        a = mf_g_attn_paged(g, q, k, v, &am);
        mf_g_set_name(g, a, "blk.%d.attn_paged", l);
        goto out_proj;
    }
    if (p->fuse_qkv || p->fuse_qkv_epilogue) {
        mf_qkv_meta qm = {.layer = l,
                          .q = mm_meta(m, L->wq, L->bq, d, q_dim),
                          .k = mm_meta(m, L->wk, L->bk, d, kv_dim),
                          .v = mm_meta(m, L->wv, L->bv, d, kv_dim),
                          .q_norm = L->q_norm,
                          .k_norm = L->k_norm,
                          .norm_eps = hp->norm_eps,
                          .rope_q = rq,
                          .rope_k = rk,
                          .n_head = hp->n_head,
                          .n_head_kv = hp->n_head_kv,
                          .head_dim = hp->head_dim};
        if (p->fuse_qkv) {
            q = store = mf_g_fused_qkv(g, n1, pos, &qm);
            mf_g_set_name(g, q, "blk.%d.fused_qkv", l);
        } else {
            q = store = qkv_epilogue(g, m, n1, pos, &qm);
            mf_g_set_name(g, q, "blk.%d.qkv_bias_rope_store", l);
        }
    } else {
        q = matmul(g, m, n1, L->wq, L->bq, d, q_dim);
        mf_g_set_name(g, q, "blk.%d.attn_q", l);
        int32_t k = matmul(g, m, n1, L->wk, L->bk, d, kv_dim);
        mf_g_set_name(g, k, "blk.%d.attn_k", l);
        int32_t v = matmul(g, m, n1, L->wv, L->bv, d, kv_dim);
        mf_g_set_name(g, v, "blk.%d.attn_v", l);
        if (L->q_norm) {
            q = mf_g_qknorm(g, q, L->q_norm, hp->head_dim, hp->norm_eps);
            mf_g_set_name(g, q, "blk.%d.attn_q_norm", l);
            k = mf_g_qknorm(g, k, L->k_norm, hp->head_dim, hp->norm_eps);
            mf_g_set_name(g, k, "blk.%d.attn_k_norm", l);
        }
        q = mf_g_rope(g, q, pos, &rq);
        mf_g_set_name(g, q, "blk.%d.rope_q", l);
        k = mf_g_rope(g, k, pos, &rk);
        mf_g_set_name(g, k, "blk.%d.rope_k", l);
        store = mf_g_kv_store(g, k, v, l);
        mf_g_set_name(g, store, "blk.%d.kv_store", l);
    }
    a = mf_g_attn(g, q, store, &am);
    mf_g_set_name(g, a, "blk.%d.attn", l);
out_proj:;
    int32_t o = matmul(g, m, a, L->wo, NULL, q_dim, d);
    mf_g_set_name(g, o, "blk.%d.attn_output", l);
    int32_t h = mf_g_add(g, x, o);
    mf_g_set_name(g, h, "blk.%d.attn_residual", l);
    return h;
}

/* FFN half of layer l: h -> h + Wdown swiglu(Wgate n2(h), Wup n2(h)). */
static int32_t build_ffn(mf_graph *g, const mf_model *m, const mf_graph_params *p, int32_t l,
                         int32_t h) {
    const mf_hparams *hp = &m->hp;
    const mf_layer_names *L = &m->layers[l];
    const int64_t d = hp->n_embd, ff = hp->n_ff;
    int32_t n2 = mf_g_rmsnorm(g, h, L->ffn_norm, hp->norm_eps);
    mf_g_set_name(g, n2, "blk.%d.ffn_norm", l);
    int32_t s;
    if (p->fuse_ffn) {
        mf_ffn_meta fm = {.gate = mm_meta(m, L->gate, NULL, d, ff),
                          .up = mm_meta(m, L->up, NULL, d, ff)};
        s = mf_g_fused_ffn(g, n2, &fm);
        mf_g_set_name(g, s, "blk.%d.fused_ffn", l);
    } else {
        int32_t gt = matmul(g, m, n2, L->gate, NULL, d, ff);
        mf_g_set_name(g, gt, "blk.%d.ffn_gate", l);
        int32_t up = matmul(g, m, n2, L->up, NULL, d, ff);
        mf_g_set_name(g, up, "blk.%d.ffn_up", l);
        /* Emitted unfused: the fusion pass rewrites SILU + MUL into SWIGLU when
         * params.fuse_swiglu says so, and MINFER_NO_FUSE_SWIGLU=1 runs them
         * as two ops. */
        int32_t si = mf_g_silu(g, gt);
        mf_g_set_name(g, si, "blk.%d.ffn_silu", l);
        s = mf_g_mul(g, si, up);
        mf_g_set_name(g, s, "blk.%d.ffn_swiglu", l);
    }
    int32_t dn = matmul(g, m, s, L->down, NULL, ff, d);
    mf_g_set_name(g, dn, "blk.%d.ffn_down", l);
    int32_t out = mf_g_add(g, h, dn);
    mf_g_set_name(g, out, "blk.%d.ffn_residual", l);
    return out;
}

int mf_model_build_graph(void *ctx, const mf_graph_params *p, mf_graph *g, mf_error *err) {
    const mf_model *m = ctx;
    const mf_hparams *hp = &m->hp;
    const int64_t nt = p->n_tokens;
    if (nt <= 0 || (!p->paged && p->n_outputs != 1 && p->n_outputs != nt) || (p->paged && (p->n_outputs < 1 || p->n_outputs > nt)) ||
        (p->paged && (p->fuse_qkv || p->fuse_qkv_epilogue || p->fuse_ffn)))
        return mf_errorf(err, "model: graph params n_tokens %d, n_outputs %d (want 1 or n_tokens; "
                         "paged %d: the last 1..n_tokens rows, no decode fusions)", p->n_tokens, p->n_outputs, p->paged);
    g->n_layers = hp->n_layer;
    g->kv_dim = (int64_t)hp->n_head_kv * hp->head_dim;

    int32_t tok = mf_g_input(g, MF_INPUT_TOKENS, MF_DTYPE_I32, nt, 1);
    mf_g_set_name(g, tok, "tokens");
    int32_t pos = mf_g_input(g, MF_INPUT_POSITIONS, MF_DTYPE_I32, nt, 1);
    mf_g_set_name(g, pos, "positions");
    int32_t x = mf_g_embed(g, tok, m->tok_embd, mf_model_wtype(m, m->tok_embd), hp->n_embd);
    mf_g_set_name(g, x, "token_embd");

    for (int32_t l = 0; l < hp->n_layer; l++) {
        int32_t first = g->n_nodes;
        int32_t h = build_attn(g, m, p, l, x, pos);
        x = build_ffn(g, m, p, l, h);
        for (int32_t i = first; i < g->n_nodes; i++)
            g->nodes[i].layer = l;
    }

    x = mf_g_rmsnorm(g, x, m->out_norm, hp->norm_eps);
    mf_g_set_name(g, x, "output_norm");
    /* paged: the caller puts the rows that want logits last */
    if (p->n_outputs < nt) {
        x = mf_g_rows(g, x, nt - p->n_outputs, p->n_outputs);
        mf_g_set_name(g, x, "last_row");
    }
    int32_t logits = matmul(g, m, x, m->output, NULL, hp->n_embd, hp->n_vocab);
    mf_g_set_name(g, logits, "output");
    g->nodes[logits].flags |= MF_NODE_OUTPUT;
    return 0;
}
