/* cuda_op_ew.c - the executors of the elementwise and copy ops: ADD,
 * SWIGLU, MUL, SCALE, SILU, SOFTMAX, VIEW, PERMUTE, RESHAPE. */
#include "backend/cuda/cuda_ctx.h"

/* ADD / SWIGLU */
int mf_cub_op_add(const op_call *oc) {
    exec *x = oc->x;
    const mf_node *n = x->n;
    const int32_t *in = oc->in;
    const int32_t out = oc->out;
    const int64_t ne = mf_node_nelem(n);
    const mf_node *s0 = n->n_src > 0 ? &x->g->nodes[n->src[0]] : NULL;
    const mf_node *s1 = n->n_src > 1 ? &x->g->nodes[n->src[1]] : NULL;
    if (mf_node_nelem(s0) != ne || mf_node_nelem(s1) != ne)
        return NODE_ERR(x, "srcs of %lld and %lld elements for an output of %lld",
                        (long long)mf_node_nelem(s0), (long long)mf_node_nelem(s1), (long long)ne);
    const float *a = mf_cub_buf_ptr(x, in[0], mf_cub_f32b(ne), "src0");
    const float *bb = a ? mf_cub_buf_ptr(x, in[1], mf_cub_f32b(ne), "src1") : NULL;
    float *y = bb ? mf_cub_buf_ptr(x, out, mf_cub_f32b(ne), "output") : NULL;
    if (!y)
        return -1;
    return mf_cub_run_ew(x, n->op == MF_OP_ADD ? MF_CU_EW_ADD : MF_CU_EW_SWIGLU, a, bb, y, ne, ne, 0);
}

/* MUL */
int mf_cub_op_mul(const op_call *oc) {
    exec *x = oc->x;
    const mf_node *n = x->n;
    const int32_t *in = oc->in;
    const int32_t out = oc->out;
    const int64_t ne = mf_node_nelem(n);
    const mf_node *s0 = n->n_src > 0 ? &x->g->nodes[n->src[0]] : NULL;
    const mf_node *s1 = n->n_src > 1 ? &x->g->nodes[n->src[1]] : NULL;
    const int64_t bn = mf_node_nelem(s1);
    if (mf_node_nelem(s0) != ne || (bn != ne && bn != n->ne[0]))
        return NODE_ERR(x, "src1 of %lld elements neither matches %lld nor is one row of %lld",
                        (long long)bn, (long long)ne, (long long)n->ne[0]);
    const float *a = mf_cub_buf_ptr(x, in[0], mf_cub_f32b(ne), "src0");
    const float *bb = a ? mf_cub_buf_ptr(x, in[1], mf_cub_f32b(bn), "src1") : NULL;
    float *y = bb ? mf_cub_buf_ptr(x, out, mf_cub_f32b(ne), "output") : NULL;
    if (!y)
        return -1;
    if (bn != ne && out == in[1]) { /* the broadcast row would be overwritten under its readers */
        float *s = mf_cub_scratch(x, 0, mf_cub_f32b(ne));
        if (!s || mf_cub_run_ew(x, MF_CU_EW_MUL, a, bb, s, ne, bn, 0))
            return -1;
        return mf_cub_d2d(x, y, s, mf_cub_f32b(ne));
    }
    return mf_cub_run_ew(x, MF_CU_EW_MUL, a, bb, y, ne, bn, 0);
}

/* SCALE / SILU */
int mf_cub_op_unary(const op_call *oc) {
    exec *x = oc->x;
    const mf_node *n = x->n;
    const int32_t *in = oc->in;
    const int32_t out = oc->out;
    const int64_t ne = mf_node_nelem(n);
    const mf_node *s0 = n->n_src > 0 ? &x->g->nodes[n->src[0]] : NULL;
    if (mf_node_nelem(s0) != ne)
        return NODE_ERR(x, "src of %lld elements for %lld", (long long)mf_node_nelem(s0), (long long)ne);
    const float *a = mf_cub_buf_ptr(x, in[0], mf_cub_f32b(ne), "src0");
    float *y = a ? mf_cub_buf_ptr(x, out, mf_cub_f32b(ne), "output") : NULL;
    if (!y)
        return -1;
    return mf_cub_run_ew(x, n->op == MF_OP_SCALE ? MF_CU_EW_SCALE : MF_CU_EW_SILU, a, NULL, y, ne, 0,
                  n->meta.scale.s);
}

/* SOFTMAX */
int mf_cub_op_softmax(const op_call *oc) {
    exec *x = oc->x;
    const mf_node *n = x->n;
    const int32_t *in = oc->in;
    const int32_t out = oc->out;
    const int64_t ne = mf_node_nelem(n);
    const mf_node *s0 = n->n_src > 0 ? &x->g->nodes[n->src[0]] : NULL;
    cudaStream_t st = x->c->stream;
    if (mf_node_nelem(s0) != ne)
        return NODE_ERR(x, "src of %lld elements for %lld", (long long)mf_node_nelem(s0), (long long)ne);
    const float *a = mf_cub_buf_ptr(x, in[0], mf_cub_f32b(ne), "src0");
    float *y = a ? mf_cub_buf_ptr(x, out, mf_cub_f32b(ne), "output") : NULL;
    if (!y)
        return -1;
    mf_cu_softmax_args sa = {.x = a, .y = y, .n = n->ne[0], .nrows = ne / n->ne[0],
                             .scale = n->meta.softmax.scale, .pdl = x->c->t.pdl};
    return mf_cub_launched(x, "softmax", sa.nrows, sa.n, mf_cu_softmax(&sa, st));
}

/* VIEW / PERMUTE */
int mf_cub_op_copy(const op_call *oc) {
    exec *x = oc->x;
    const mf_node *n = x->n;
    const int32_t *in = oc->in;
    const int32_t out = oc->out;
    const int64_t ne = mf_node_nelem(n);
    const mf_node *s0 = n->n_src > 0 ? &x->g->nodes[n->src[0]] : NULL;
    cudaStream_t st = x->c->stream;
    mf_cu_copy_args a = {.ne = {n->ne[0], n->ne[1], n->ne[2], n->ne[3]}, .pdl = x->c->t.pdl};
    const int64_t srows = s0->ne[1] * s0->ne[2] * s0->ne[3];
    int64_t base = 0;
    if (n->op == MF_OP_VIEW) {
        base = n->meta.view.offset;
        if (base < 0 || base + n->ne[0] > s0->ne[0] || ne / n->ne[0] != srows)
            return NODE_ERR(x, "columns [%lld, %lld) of width %lld, %lld rows of %lld",
                            (long long)base, (long long)(base + n->ne[0]), (long long)s0->ne[0],
                            (long long)(ne / n->ne[0]), (long long)srows);
        a.st[0] = 1;
        a.st[1] = s0->ne[0];
        a.st[2] = s0->ne[0] * s0->ne[1];
        a.st[3] = a.st[2] * s0->ne[2];
    } else {
        int64_t sst[4] = {1, s0->ne[0], s0->ne[0] * s0->ne[1], s0->ne[0] * s0->ne[1] * s0->ne[2]};
        for (int d = 0; d < 4; d++) {
            int ax = n->meta.permute.axes[d];
            if (ax < 0 || ax > 3 || n->ne[d] != s0->ne[ax])
                return NODE_ERR(x, "axis %d -> %d: %lld vs %lld", d, ax, (long long)n->ne[d],
                                (long long)(ax >= 0 && ax < 4 ? s0->ne[ax] : -1));
            a.st[d] = sst[ax];
        }
    }
    const uint8_t *src = mf_cub_buf_ptr(x, in[0], mf_cub_f32b(mf_node_nelem(s0)), "src0");
    float *y = src ? mf_cub_buf_ptr(x, out, mf_cub_f32b(ne), "output") : NULL;
    if (!y)
        return -1;
    a.x = src + mf_cub_f32b(base);
    if (out == in[0]) { /* a gather from the buffer being written: go through scratch */
        float *s = mf_cub_scratch(x, 0, mf_cub_f32b(ne));
        a.y = s;
        if (!s || mf_cub_launched(x, "copy4d", ne, 1, mf_cu_copy4d(&a, st)))
            return -1;
        return mf_cub_d2d(x, y, s, mf_cub_f32b(ne));
    }
    a.y = y;
    return mf_cub_launched(x, "copy4d", ne, 1, mf_cu_copy4d(&a, st));
}

/* RESHAPE */
int mf_cub_op_reshape(const op_call *oc) {
    exec *x = oc->x;
    const mf_node *n = x->n;
    const int32_t *in = oc->in;
    const int32_t out = oc->out;
    const int64_t ne = mf_node_nelem(n);
    const mf_node *s0 = n->n_src > 0 ? &x->g->nodes[n->src[0]] : NULL;
    if (mf_node_nelem(s0) != ne)
        return NODE_ERR(x, "%lld elements from %lld", (long long)ne, (long long)mf_node_nelem(s0));
    if (out == in[0])
        return 0;
    const void *a = mf_cub_buf_ptr(x, in[0], mf_cub_f32b(ne), "src0");
    void *y = a ? mf_cub_buf_ptr(x, out, mf_cub_f32b(ne), "output") : NULL;
    return y ? mf_cub_d2d(x, y, a, mf_cub_f32b(ne)) : -1;
}
