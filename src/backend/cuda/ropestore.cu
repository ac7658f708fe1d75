/* ropestore.cu - the attention-input tail of FUSED_QKV as one launch
 * (tune fuse_rope): RoPE of Q into the output, RoPE of K in place,
 * and the K and V rows stored into the cache, instead of four launches.
 *
 * Grid (nt, 3): block (t, 0) ropes Q row t, (t, 1) ropes K row t and then
 * stores it (a __syncthreads orders the in-place rotation before the reads
 * of the store: global writes of a block are visible to the block after
 * it), (t, 2) stores V row t. The rotation (angle and sin/cos in double)
 * is rope.cu's and the store is kvstore.cu's (the kv.cuh writers), so the
 * results are bitwise the unfused path's.
 *
 * Wide path: grid (n_head + 2
 * n_head_kv, nt) of 64 threads, block (h, t): Q head h (h < n_head), K head
 * h - n_head (rotated in place, a barrier, then that head's slice of the K
 * row stored), or V head h - n_head - n_head_kv (its slice stored). With one
 * token the old grid had 3 blocks each walking a whole row (14 heads of
 * double pow + sincos per thread for Q); now every head is its own block and
 * each thread rotates one pair. The per-element math is the same code, so
 * the results are bitwise equal. It needs head_dim % 32 == 0 (a q8_0 block
 * never straddles two heads) and one head_dim for Q and K.
 *
 * With q_norm / k_norm (Qwen3's QkNorm) the Q and K head blocks first
 * RMSNorm their head in place, exactly as norm.cu's one-block kernel does
 * for a head_dim row (one warp: same element order, shuffle tree, lane 0's
 * total), then a barrier, then the rotation: two launches fewer per layer,
 * bitwise the same. Where the per-head kernel does not apply (or
 * head_dim >= 256, where norm.cu would use more than one warp) the norms run
 * as mf_cu_rmsnorm launches before the rope-store kernel. */
#include <math.h>

#include "backend/cuda/cuda_args.h"
#include "backend/cuda/kv.cuh"
#include "backend/cuda/norm.cuh"
#include "backend/cuda/pdl.cuh"
#include "backend/cuda/rope.cuh"

#define RS_THREADS 256

/* Row t of a (all heads), pairs spread over the block's threads. */
static __device__ void rs_rope_row(const mf_cu_rope_args &a, int64_t t) {
    const double p = a.pos ? (double)a.pos[t] : (double)((a.pos0_dev ? (int64_t)*a.pos0_dev : a.pos0) + t);
    const int half = a.n_rot / 2;
    const bool neox = (a.mode & 2) != 0;
    const float *xr = a.x + t * a.n_head * (int64_t)a.head_dim;
    float *yr = a.y + t * a.n_head * (int64_t)a.head_dim;
    for (int k = threadIdx.x; k < a.n_head * half; k += blockDim.x) {
        const int h = k / half, i = k % half;
        const double ang = p * (double)a.freq_scale * pow((double)a.theta, -2.0 * i / (double)a.n_rot);
        double sd, cd;
        sincos(ang, &sd, &cd);
        const float si = (float)sd, co = (float)cd;
        const int i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
        const float *xv = xr + (int64_t)h * a.head_dim;
        float *yv = yr + (int64_t)h * a.head_dim;
        const float x0 = xv[i0], x1 = xv[i1];
        yv[i0] = x0 * co - x1 * si;
        yv[i1] = x0 * si + x1 * co;
    }
    const int rest = a.head_dim - a.n_rot;
    if (xr != yr && rest > 0)
        for (int k = threadIdx.x; k < a.n_head * rest; k += blockDim.x) {
            const int64_t e = (int64_t)(k / rest) * a.head_dim + a.n_rot + k % rest;
            yr[e] = xr[e];
        }
}

/* Source row t into cache row pos0 + t. */
static __device__ void rs_store_row(const mf_cu_kv_args &a, int64_t t) {
    const float *src = a.src + t * a.kv_dim;
    uint8_t *row = mf_kv_store_row(a, t);
    if (a.kv_type == MF_TYPE_Q8_0) {
        const int64_t nb = a.kv_dim / MF_QK8_0;
        const int lane = threadIdx.x & 31;
        /* whole warps per block of 32: the shuffles need every lane */
        for (int64_t b = threadIdx.x >> 5; b < nb; b += blockDim.x / 32)
            mf_kv_put_q8_block(row, b, lane, src[b * MF_QK8_0 + lane], true);
        return;
    }
    for (int64_t i = threadIdx.x; i < a.kv_dim; i += blockDim.x)
        mf_kv_put(a.kv_type, row, i, src[i]);
}

static __global__ void __launch_bounds__(RS_THREADS) rope_store_kernel(mf_cu_rope_store_args a) {
    mf_pdl_wait();
    mf_pdl_trigger();
    const int64_t t = blockIdx.x;
    if (blockIdx.y == 0) {
        rs_rope_row(a.rq, t);
    } else if (blockIdx.y == 1) {
        rs_rope_row(a.rk, t);
        __syncthreads();
        rs_store_row(a.ks, t);
    } else {
        rs_store_row(a.vs, t);
    }
}

#define RSH_THREADS 64

/* Elements [e0, e0 + len) of source row t into its cache row (len and e0
 * multiples of 32 for q8_0): rs_store_row's writers on a slice. */
static __device__ void rs_store_slice(const mf_cu_kv_args &a, int64_t t, int64_t e0, int64_t len) {
    const float *src = a.src + t * a.kv_dim;
    uint8_t *row = mf_kv_store_row(a, t);
    if (a.kv_type == MF_TYPE_Q8_0) {
        const int lane = threadIdx.x & 31;
        for (int64_t b = e0 / MF_QK8_0 + (threadIdx.x >> 5); b < (e0 + len) / MF_QK8_0; b += blockDim.x / 32)
            mf_kv_put_q8_block(row, b, lane, src[b * MF_QK8_0 + lane], true);
        return;
    }
    for (int64_t i = e0 + threadIdx.x; i < e0 + len; i += blockDim.x)
        mf_kv_put(a.kv_type, row, i, src[i]);
}

/* RMSNorm of one head_dim row in place (hd < 256): rmsnorm_kernel's
 * arithmetic with its 32 threads (warp 0 here); every thread of the block
 * must call it (barrier). */
static __device__ void rs_norm_head(float *xv, const float *__restrict__ w, int hd, float eps) {
    if (threadIdx.x < 32) {
        double ss = 0.0;
        for (int i = threadIdx.x; i < hd; i += 32)
            ss += (double)xv[i] * (double)xv[i];
        const float sc = mf_head_rms_scale(ss, hd, eps);
        for (int i = threadIdx.x; i < hd; i += 32)
            xv[i] = xv[i] * sc * w[i];
    }
    __syncthreads();
}

static __global__ void __launch_bounds__(RSH_THREADS) rope_store_head_kernel(mf_cu_rope_store_args a) {
    mf_pdl_wait();
    mf_pdl_trigger();
    const int64_t t = blockIdx.y;
    const int h = (int)blockIdx.x, nq = a.rq.n_head, nkv = a.rk.n_head;
    const int64_t hd = a.rk.head_dim;
    if (h < nq) {
        if (a.q_norm) /* rq.x is the caller's scratch: normalized in place, as run_norm did */
            rs_norm_head((float *)a.rq.x + (t * nq + h) * hd, a.q_norm, (int)hd, a.norm_eps);
        mf_rope_head(a.rq, t, h);
    } else if (h < nq + nkv) {
        if (a.k_norm)
            rs_norm_head(a.rk.y + (t * nkv + h - nq) * hd, a.k_norm, (int)hd, a.norm_eps);
        mf_rope_head(a.rk, t, h - nq);
        __syncthreads(); /* the rotated head is what the store reads */
        rs_store_slice(a.ks, t, (int64_t)(h - nq) * hd, hd);
    } else {
        rs_store_slice(a.vs, t, (int64_t)(h - nq - nkv) * hd, hd);
    }
}

/* ---- the per-head kernel without serial round trips ---- */

/* rope_store_head_kernel reads its head from global memory up to three
 * times, each after a store and a barrier (norm in place, rotation in
 * place, the K store reading the rotated row back), and computes the
 * double pow of each pair after the PDL wait. This form, for head_dim <=
 * RSL_MAX_HD (so thread tid owns elements tid and tid + 64 and at most one
 * pair), computes pow before the wait (it reads only arguments), issues
 * every load of the block (its elements, the norm's lane order, the
 * position) at once after the wait, passes the head between threads through
 * shared memory (one barrier; a second one before the K store) and writes
 * global memory only after every global read of the head: one round trip
 * instead of up to five. The arithmetic is the old kernel's expression by
 * expression (norm: warp 0's lane order and shuffle tree, which every warp
 * replays so no broadcast is needed; pow, sincos and the rotation as in
 * mf_rope_head; the kv.cuh writers), so every output is bitwise the same,
 * including the normalized q left in rq.x (the caller's scratch). */
#define RSL_MAX_HD (2 * RSH_THREADS)

/* Element tid + 64 k (k = 0, 1) of a head slice starting at element e0 of
 * row t, v[k] its value, into the cache: rs_store_slice's writers (the
 * q8_0 block of element tid + 64 k is warp + 2 k, whole warps). */
static __device__ void rsl_put(const mf_cu_kv_args &s, uint8_t *row, int64_t e0, int hd, const float (&v)[2]) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int k = 0; k < 2; k++) {
        const int e = (int)threadIdx.x + RSH_THREADS * k;
        if (s.kv_type == MF_TYPE_Q8_0) {
            if (e - lane < hd) /* warp-uniform */
                mf_kv_put_q8_block(row, (e0 + e) / MF_QK8_0, lane, v[k], true);
        } else if (e < hd) {
            mf_kv_put(s.kv_type, row, e0 + e, v[k]);
        }
    }
}

static __global__ void __launch_bounds__(RSH_THREADS) rope_store_head_lat_kernel(mf_cu_rope_store_args a) {
    __shared__ float sx[RSL_MAX_HD], sy[RSL_MAX_HD];
    const int64_t t = blockIdx.y;
    const int h = (int)blockIdx.x, nq = a.rq.n_head, nkv = a.rk.n_head, hd = a.rk.head_dim;
    const int tid = threadIdx.x, lane = tid & 31;
    const int kind = h < nq ? 0 : h < nq + nkv ? 1 : 2; /* q, k, v */
    if (kind == 2) {
        mf_pdl_wait();
        mf_pdl_trigger();
        const int64_t e0 = (int64_t)(h - nq - nkv) * hd;
        const float *src = a.vs.src + t * a.vs.kv_dim + e0;
        float v[2];
#pragma unroll
        for (int k = 0; k < 2; k++) {
            const int e = tid + RSH_THREADS * k;
            v[k] = e < hd ? src[e] : 0.0f;
        }
        rsl_put(a.vs, mf_kv_store_row(a.vs, t), e0, hd, v);
        return;
    }
    const mf_cu_rope_args &r = kind == 0 ? a.rq : a.rk;
    const int hh = kind == 0 ? h : h - nq;
    const float *nw = kind == 0 ? a.q_norm : a.k_norm;
    const int half = r.n_rot / 2;
    const double pw = tid < half ? pow((double)r.theta, -2.0 * tid / (double)r.n_rot) : 0.0;
    float wn[2] = {1.0f, 1.0f};
    if (nw)
#pragma unroll
        for (int k = 0; k < 2; k++)
            if (tid + RSH_THREADS * k < hd)
                wn[k] = nw[tid + RSH_THREADS * k];
    mf_pdl_wait();
    mf_pdl_trigger();
    const int64_t off = (t * r.n_head + hh) * (int64_t)hd;
    const float *xv = r.x + off;
    float *yv = r.y + off;
    /* the position and the K store's pos0_dev are loaded here, with the
     * head, one unconditional load each, and used only after the barrier
     * (consumed earlier, each would be a round trip of its own); int ->
     * double is exact, so p below is mf_rope_head's. */
    const int32_t *pa = r.pos ? r.pos + t : r.pos0_dev, *ka = kind == 1 ? a.ks.pos0_dev : NULL;
    float xe[2];
#pragma unroll
    for (int k = 0; k < 2; k++) {
        const int e = tid + RSH_THREADS * k;
        xe[k] = e < hd ? xv[e] : 0.0f;
    }
    float xs[RSL_MAX_HD / 32]; /* the norm's lane order, loaded with the rest */
#pragma unroll
    for (int j = 0; j < RSL_MAX_HD / 32; j++)
        xs[j] = nw && lane + 32 * j < hd ? xv[lane + 32 * j] : 0.0f;
    const int32_t praw = pa ? *pa : 0, kraw = ka ? *ka : 0;
    if (nw) { /* rs_norm_head's scale, in its lane order */
        const float sc = mf_head_rms_scale_lanes(xs, hd, a.norm_eps);
#pragma unroll
        for (int k = 0; k < 2; k++)
            xe[k] = xe[k] * sc * wn[k];
    }
#pragma unroll
    for (int k = 0; k < 2; k++)
        if (tid + RSH_THREADS * k < hd)
            sx[tid + RSH_THREADS * k] = xe[k];
    __syncthreads(); /* every global read of the head is done: writes may start */
    const double p = (double)(r.pos ? (int64_t)praw : (r.pos0_dev ? (int64_t)praw : r.pos0) + t);
    if (nw && xv != yv) /* the normalized q in the caller's scratch, as the old kernel leaves it */
#pragma unroll
        for (int k = 0; k < 2; k++)
            if (tid + RSH_THREADS * k < hd)
                ((float *)xv)[tid + RSH_THREADS * k] = xe[k];
    if (tid < half) {
        const double ang = p * (double)r.freq_scale * pw;
        double sd, cd;
        sincos(ang, &sd, &cd);
        const float si = (float)sd, co = (float)cd;
        const bool neox = (r.mode & 2) != 0;
        const int i0 = neox ? tid : 2 * tid, i1 = neox ? tid + half : 2 * tid + 1;
        const float x0 = sx[i0], x1 = sx[i1];
        const float y0 = x0 * co - x1 * si, y1 = x0 * si + x1 * co;
        yv[i0] = y0;
        yv[i1] = y1;
        sy[i0] = y0;
        sy[i1] = y1;
    }
#pragma unroll
    for (int k = 0; k < 2; k++) { /* dims past n_rot: copied (or the normalized value left in place) */
        const int d = r.n_rot + tid + RSH_THREADS * k;
        if (d < hd) {
            if (xv != yv || nw)
                yv[d] = sx[d];
            sy[d] = sx[d];
        }
    }
    if (kind == 1) {
        __syncthreads(); /* the rotated head is what the store reads */
        float v[2];
#pragma unroll
        for (int k = 0; k < 2; k++) {
            const int e = tid + RSH_THREADS * k;
            v[k] = e < hd ? sy[e] : 0.0f;
        }
        const int64_t kpos0 = ka ? (int64_t)kraw : a.ks.pos0; /* mf_kv_store_row's row */
        uint8_t *krow = (uint8_t *)a.ks.cache + (uint64_t)(kpos0 + t) * mf_kv_row_bytes(a.ks.kv_type, a.ks.kv_dim);
        rsl_put(a.ks, krow, (int64_t)hh * hd, hd, v);
    }
}

extern "C" cudaError_t mf_cu_rope_store(const mf_cu_rope_store_args *a, cudaStream_t s) {
    const int64_t nt = a->rq.nt;
    if (nt <= 0)
        return cudaSuccess;
    if (a->rk.nt != nt || a->ks.nt != nt || a->vs.nt != nt || a->rk.x != a->rk.y || a->ks.src != a->rk.y ||
        nt > 65535 * 1024LL)
        return cudaErrorInvalidValue;
    const int32_t hd = a->rk.head_dim;
    const bool norm = a->q_norm && a->k_norm;
    if ((a->q_norm || a->k_norm) && !norm)
        return cudaErrorInvalidValue;
    if (nt <= 65535 && hd > 0 && hd % 32 == 0 && a->rq.head_dim == hd &&
        (int64_t)a->rk.n_head * hd == a->ks.kv_dim && a->vs.kv_dim == a->ks.kv_dim && a->rq.n_head > 0 &&
        a->rk.n_head > 0 && (!norm || hd < 256)) {
        const bool lat = hd <= RSL_MAX_HD && a->rq.n_rot >= 0 && a->rq.n_rot <= hd &&
                         a->rk.n_rot >= 0 && a->rk.n_rot <= hd;
        return mf_launch(lat ? rope_store_head_lat_kernel : rope_store_head_kernel,
                         dim3((unsigned)(a->rq.n_head + 2 * a->rk.n_head), (unsigned)nt), dim3(RSH_THREADS), 0, s,
                         a->rq.pdl, *a);
    }
    mf_cu_rope_store_args b = *a;
    if (norm) { /* the QkNorm as its own launches (the old sequence) */
        /* x, w, y, n, nrows, eps, pdl */
        const mf_cu_norm_args nq = {a->rq.x, a->q_norm, (float *)a->rq.x, a->rq.head_dim, nt * a->rq.n_head,
                                    a->norm_eps, a->rq.pdl};
        const mf_cu_norm_args nk = {a->rk.y, a->k_norm, a->rk.y, a->rk.head_dim, nt * a->rk.n_head, a->norm_eps,
                                    a->rq.pdl};
        cudaError_t e = mf_cu_rmsnorm(&nq, s);
        if (e == cudaSuccess)
            e = mf_cu_rmsnorm(&nk, s);
        if (e != cudaSuccess)
            return e;
        b.q_norm = b.k_norm = NULL;
    }
    return mf_launch(rope_store_kernel, dim3((unsigned)nt, 3), dim3(RS_THREADS), 0, s, a->rq.pdl, b);
}

#include "backend/cuda/probe.cuh"

extern "C" cudaError_t mf_cu_probe_rope_store(size_t smem_limit, const char **bad) {
    MF_PROBE(rope_store_kernel, RS_THREADS);
    MF_PROBE(rope_store_head_kernel, RSH_THREADS);
    MF_PROBE(rope_store_head_lat_kernel, RSH_THREADS);
    return cudaSuccess;
}
