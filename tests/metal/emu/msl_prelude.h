// The prelude that makes MSL valid C++ (clang++ -std=c++17, built by
// mf_msl_emu_library). Every type a kernel can name is a clang builtin type,
// so it works in every address space:
//   address spaces  device / constant / threadgroup are clang address spaces
//                   1 / 2 / 3 (distinct pointer types: mixing them is a
//                   compile error, as in MSL); thread is the default one.
//   vectors         ext_vector_type: MSL's size and alignment (float3 is 16),
//                   swizzles .xyzw .rgba; float4(a, b, ...) is a macro
//                   that builds one from scalars and vectors.
//   half            __fp16 with native arguments and returns; conversions
//                   are correctly rounded (mf_emu_half.c).
//   double          refused (a compile error naming it).
// Synchronisation (simd_*, barriers) calls the fiber runtime in emu_rt.h.
#ifndef MF_MSL_PRELUDE_H
#define MF_MSL_PRELUDE_H

#include <stdint.h>
#include <stddef.h>
#include <string.h>
#include <cmath>
#include <type_traits>
#include "emu_rt.h"

#ifndef __clang__
#error "the MSL emulator needs clang (address spaces, ext_vector_type, __fp16)"
#endif
#define __METAL_VERSION__ 240
#define MF_MSL_EMU 1

typedef unsigned int uint;
typedef unsigned short ushort;
typedef unsigned char uchar;
typedef unsigned long ulong;
typedef __fp16 half;

template <class T> struct mf_vt { typedef T E; static const int N = 1; static const bool vec = false; };

#define MF_VEC1(T, K)                                                                        \
    typedef T T##K __attribute__((ext_vector_type(K)));                                      \
    template <> struct mf_vt<T##K> { typedef T E; static const int N = K; static const bool vec = true; };
#define MF_VEC(T) MF_VEC1(T, 2) MF_VEC1(T, 3) MF_VEC1(T, 4)
MF_VEC(float)
MF_VEC(half)
MF_VEC(int)
MF_VEC(uint)
MF_VEC(short)
MF_VEC(ushort)
MF_VEC(char)
MF_VEC(uchar)
MF_VEC(long)
MF_VEC(ulong)
#undef MF_VEC
#undef MF_VEC1

// Packed vectors: element alignment, no padding (packed_float3 is 12 bytes).
#define MF_PACKED(T, N)                                                                     \
    struct packed_##T##N { T v[N];                                                          \
        T &operator[](int i) { return v[i]; } const T &operator[](int i) const { return v[i]; } };
MF_PACKED(float, 2) MF_PACKED(float, 3) MF_PACKED(float, 4)
MF_PACKED(half, 2) MF_PACKED(half, 3) MF_PACKED(half, 4)
MF_PACKED(char, 4) MF_PACKED(uchar, 4) MF_PACKED(short, 2) MF_PACKED(ushort, 2)
#undef MF_PACKED

// ---- vector construction: float4(x), float4(a, b, c, d), float4(f2, f2) ...
template <class E, class A> static inline void mf_put(E *dst, int &k, const A &a) {
    if constexpr (mf_vt<A>::vec) {
        for (int i = 0; i < mf_vt<A>::N; i++) dst[k++] = (E)a[i];
    } else {
        dst[k++] = (E)a;
    }
}
template <class V, class... A> static inline V mf_make(const A &...a) {
    typedef typename mf_vt<V>::E E;
    const int n = mf_vt<V>::N;
    V r;
    if constexpr (sizeof...(A) == 0) {
        for (int i = 0; i < n; i++) r[i] = (E)0;
    } else if constexpr (sizeof...(A) == 1 && (!mf_vt<A>::vec && ...)) {
        E s = 0;
        int k = 0;
        (mf_put(&s, k, a), ...);
        for (int i = 0; i < n; i++) r[i] = s;
    } else {
        static_assert(((mf_vt<A>::N) + ...) == n, "vector constructor: component count differs");
        E t[n];
        int k = 0;
        (mf_put(t, k, a), ...);
        for (int i = 0; i < n; i++) r[i] = t[i];
    }
    return r;
}
#define float2(...) mf_make<float2>(__VA_ARGS__)
#define float3(...) mf_make<float3>(__VA_ARGS__)
#define float4(...) mf_make<float4>(__VA_ARGS__)
#define half2(...) mf_make<half2>(__VA_ARGS__)
#define half3(...) mf_make<half3>(__VA_ARGS__)
#define half4(...) mf_make<half4>(__VA_ARGS__)
#define int2(...) mf_make<int2>(__VA_ARGS__)
#define int3(...) mf_make<int3>(__VA_ARGS__)
#define int4(...) mf_make<int4>(__VA_ARGS__)
#define uint2(...) mf_make<uint2>(__VA_ARGS__)
#define uint3(...) mf_make<uint3>(__VA_ARGS__)
#define uint4(...) mf_make<uint4>(__VA_ARGS__)
#define short2(...) mf_make<short2>(__VA_ARGS__)
#define short3(...) mf_make<short3>(__VA_ARGS__)
#define short4(...) mf_make<short4>(__VA_ARGS__)
#define ushort2(...) mf_make<ushort2>(__VA_ARGS__)
#define ushort3(...) mf_make<ushort3>(__VA_ARGS__)
#define ushort4(...) mf_make<ushort4>(__VA_ARGS__)
#define char2(...) mf_make<char2>(__VA_ARGS__)
#define char3(...) mf_make<char3>(__VA_ARGS__)
#define char4(...) mf_make<char4>(__VA_ARGS__)
#define uchar2(...) mf_make<uchar2>(__VA_ARGS__)
#define uchar3(...) mf_make<uchar3>(__VA_ARGS__)
#define uchar4(...) mf_make<uchar4>(__VA_ARGS__)
#define long2(...) mf_make<long2>(__VA_ARGS__)
#define ulong2(...) mf_make<ulong2>(__VA_ARGS__)

// ---- builtin arguments (the generated thunk reads them) -------------------
template <class T> static inline T mf_emu_bi(int id) {
    uint32_t v[3];
    mf_emu_builtin3(id, v);
    if constexpr (mf_vt<T>::vec) {
        T r;
        for (int i = 0; i < mf_vt<T>::N; i++) r[i] = (typename mf_vt<T>::E)v[i];
        return r;
    } else {
        return (T)v[0];
    }
}

#define MF_SITE_PARAMS const char *mf_file = __builtin_FILE(), unsigned mf_line = __builtin_LINE()

namespace metal {

// ---- math ----------------------------------------------------------------
#define MF_MAP1(name, expr)                                                                 \
    static inline float name(float x) { return expr; }                                     \
    static inline half name(half hx) { float x = (float)hx; return (half)(expr); }         \
    template <class V, class = typename std::enable_if<mf_vt<V>::vec>::type>               \
    static inline V name(V v) { V r; for (int i = 0; i < mf_vt<V>::N; i++) r[i] = name(v[i]); return r; }
MF_MAP1(exp, std::exp(x))
MF_MAP1(exp2, std::exp2(x))
MF_MAP1(log, std::log(x))
MF_MAP1(log2, std::log2(x))
MF_MAP1(sqrt, std::sqrt(x))
MF_MAP1(rsqrt, 1.0f / std::sqrt(x))
MF_MAP1(fabs, std::fabs(x))
MF_MAP1(tanh, std::tanh(x))
MF_MAP1(sin, std::sin(x))
MF_MAP1(cos, std::cos(x))
MF_MAP1(floor, std::floor(x))
MF_MAP1(ceil, std::ceil(x))
MF_MAP1(round, std::round(x))
MF_MAP1(rint, std::rint(x))
MF_MAP1(trunc, std::trunc(x))
MF_MAP1(erf, std::erf(x))
MF_MAP1(sign, x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : 0.0f))
#undef MF_MAP1

static inline float pow(float x, float y) { return std::pow(x, y); }
static inline float powr(float x, float y) { return std::pow(x, y); }
static inline float fmod(float x, float y) { return std::fmod(x, y); }
static inline float fma(float a, float b, float c) { return std::fma(a, b, c); }
static inline bool isnan(float x) { return std::isnan(x); }
static inline bool isinf(float x) { return std::isinf(x); }
static inline bool isfinite(float x) { return std::isfinite(x); }

// max / min / clamp / abs on every scalar type and elementwise on vectors.
template <class T> static inline T max(T a, T b) {
    if constexpr (mf_vt<T>::vec) { T r; for (int i = 0; i < mf_vt<T>::N; i++) r[i] = a[i] > b[i] ? a[i] : b[i]; return r; }
    else return a > b ? a : b;
}
template <class T> static inline T min(T a, T b) {
    if constexpr (mf_vt<T>::vec) { T r; for (int i = 0; i < mf_vt<T>::N; i++) r[i] = a[i] < b[i] ? a[i] : b[i]; return r; }
    else return a < b ? a : b;
}
static inline float fmax(float a, float b) { return std::fmax(a, b); }
static inline float fmin(float a, float b) { return std::fmin(a, b); }
template <class T> static inline T clamp(T x, T lo, T hi) { return min(max(x, lo), hi); }
static inline float abs(float x) { return std::fabs(x); }
static inline half abs(half x) { return x < (half)0 ? (half)-x : x; }
static inline int abs(int x) { return x < 0 ? -x : x; }
template <class T> static inline T mix(T a, T b, T t) { return a + (b - a) * t; }
template <class T> static inline T step(T edge, T x) { return x < edge ? (T)0 : (T)1; }
template <class T, class C> static inline T select(T a, T b, C c) {
    if constexpr (mf_vt<T>::vec) { T r; for (int i = 0; i < mf_vt<T>::N; i++) r[i] = c[i] ? b[i] : a[i]; return r; }
    else return c ? b : a;
}
template <class V> static inline typename mf_vt<V>::E dot(V a, V b) {
    static_assert(mf_vt<V>::vec, "dot: vector arguments");
    typename mf_vt<V>::E s = 0;
    for (int i = 0; i < mf_vt<V>::N; i++) s += a[i] * b[i];
    return s;
}
template <class V> static inline typename mf_vt<V>::E length(V a) { return sqrt(dot(a, a)); }
template <class V> static inline bool all(V v) { for (int i = 0; i < mf_vt<V>::N; i++) if (!v[i]) return false; return true; }
template <class V> static inline bool any(V v) { for (int i = 0; i < mf_vt<V>::N; i++) if (v[i]) return true; return false; }
static inline uint popcount(uint x) { return (uint)__builtin_popcount(x); }
static inline uint clz(uint x) { return x ? (uint)__builtin_clz(x) : 32u; }
static inline uint ctz(uint x) { return x ? (uint)__builtin_ctz(x) : 32u; }
static inline uint mulhi(uint a, uint b) { return (uint)(((uint64_t)a * b) >> 32); }

template <class T, class F> static inline T as_type(F f) {
    static_assert(sizeof(T) == sizeof(F), "as_type: sizes differ");
    T t;
    memcpy(&t, &f, sizeof t);
    return t;
}

namespace fast {
using metal::exp; using metal::exp2; using metal::log; using metal::log2; using metal::sqrt;
using metal::rsqrt; using metal::tanh; using metal::sin; using metal::cos; using metal::pow;
using metal::powr; using metal::max; using metal::min; using metal::clamp; using metal::fabs;
using metal::erf;
}
namespace precise {
using metal::exp; using metal::exp2; using metal::log; using metal::log2; using metal::sqrt;
using metal::rsqrt; using metal::tanh; using metal::sin; using metal::cos; using metal::pow;
using metal::powr; using metal::max; using metal::min; using metal::clamp; using metal::fabs;
using metal::erf;
}

// ---- barriers ---------------------------------------------------------------
enum class mem_flags : unsigned { mem_none = 0, mem_device = 1, mem_threadgroup = 2, mem_texture = 4,
                                  mem_threadgroup_imageblock = 8 };
static inline mem_flags operator|(mem_flags a, mem_flags b) { return (mem_flags)((unsigned)a | (unsigned)b); }
static inline void threadgroup_barrier(mem_flags f, MF_SITE_PARAMS) { mf_emu_barrier((unsigned)f, mf_file, mf_line); }
static inline void simdgroup_barrier(mem_flags f, MF_SITE_PARAMS) {
    (void)f;
    mf_emu_simd_view w;
    mf_emu_simd_sync(0, 0, &w, mf_file, mf_line);
}

// ---- simd collectives: every live lane of the simdgroup takes part ----------
template <class T> static inline const T &mf_lane(const mf_emu_simd_view &w, uint32_t l) {
    return *(const T *)(const void *)(w.slots + (size_t)l * MF_EMU_SLOT_BYTES);
}
template <class T> static inline mf_emu_simd_view mf_exchange(const T &v, const char *file, unsigned line) {
    static_assert(sizeof(T) <= MF_EMU_SLOT_BYTES, "simd collective: value too large");
    mf_emu_simd_view w;
    mf_emu_simd_sync(&v, sizeof(T), &w, file, line);
    return w;
}
template <class T> static inline T mf_poison() { T t; memset((void *)&t, 0xff, sizeof t); return t; }
template <class T> static inline T mf_from(const mf_emu_simd_view &w, uint32_t l) {
    return (l < MF_EMU_SIMD_WIDTH && (w.mask >> l & 1u)) ? mf_lane<T>(w, l) : mf_poison<T>();
}

template <class T> static inline T simd_sum(T v, MF_SITE_PARAMS) {
    mf_emu_simd_view w = mf_exchange(v, mf_file, mf_line);
    T s = (T)0;
    for (uint32_t l = 0; l < MF_EMU_SIMD_WIDTH; l++) if (w.mask >> l & 1u) s += mf_lane<T>(w, l);
    return s;
}
template <class T> static inline T simd_product(T v, MF_SITE_PARAMS) {
    mf_emu_simd_view w = mf_exchange(v, mf_file, mf_line);
    T s = (T)1;
    for (uint32_t l = 0; l < MF_EMU_SIMD_WIDTH; l++) if (w.mask >> l & 1u) s *= mf_lane<T>(w, l);
    return s;
}
template <class T> static inline T simd_max(T v, MF_SITE_PARAMS) {
    mf_emu_simd_view w = mf_exchange(v, mf_file, mf_line);
    T s = v;
    for (uint32_t l = 0; l < MF_EMU_SIMD_WIDTH; l++) if (w.mask >> l & 1u) s = max(s, mf_lane<T>(w, l));
    return s;
}
template <class T> static inline T simd_min(T v, MF_SITE_PARAMS) {
    mf_emu_simd_view w = mf_exchange(v, mf_file, mf_line);
    T s = v;
    for (uint32_t l = 0; l < MF_EMU_SIMD_WIDTH; l++) if (w.mask >> l & 1u) s = min(s, mf_lane<T>(w, l));
    return s;
}
template <class T> static inline T simd_prefix_inclusive_sum(T v, MF_SITE_PARAMS) {
    mf_emu_simd_view w = mf_exchange(v, mf_file, mf_line);
    T s = (T)0;
    for (uint32_t l = 0; l <= w.lane; l++) if (w.mask >> l & 1u) s += mf_lane<T>(w, l);
    return s;
}
template <class T> static inline T simd_prefix_exclusive_sum(T v, MF_SITE_PARAMS) {
    mf_emu_simd_view w = mf_exchange(v, mf_file, mf_line);
    T s = (T)0;
    for (uint32_t l = 0; l < w.lane; l++) if (w.mask >> l & 1u) s += mf_lane<T>(w, l);
    return s;
}
template <class T> static inline T simd_shuffle(T v, ushort lane, MF_SITE_PARAMS) {
    mf_emu_simd_view w = mf_exchange(v, mf_file, mf_line);
    return mf_from<T>(w, lane);
}
template <class T> static inline T simd_broadcast(T v, ushort lane, MF_SITE_PARAMS) {
    mf_emu_simd_view w = mf_exchange(v, mf_file, mf_line);
    return mf_from<T>(w, lane);
}
template <class T> static inline T simd_broadcast_first(T v, MF_SITE_PARAMS) {
    mf_emu_simd_view w = mf_exchange(v, mf_file, mf_line);
    return mf_from<T>(w, w.mask ? (uint32_t)__builtin_ctz(w.mask) : 0u);
}
// Lanes whose source is outside the simdgroup keep their own value (MSL).
template <class T> static inline T simd_shuffle_down(T v, ushort delta, MF_SITE_PARAMS) {
    mf_emu_simd_view w = mf_exchange(v, mf_file, mf_line);
    uint32_t src = w.lane + delta;
    return src < MF_EMU_SIMD_WIDTH ? mf_from<T>(w, src) : v;
}
template <class T> static inline T simd_shuffle_up(T v, ushort delta, MF_SITE_PARAMS) {
    mf_emu_simd_view w = mf_exchange(v, mf_file, mf_line);
    return delta <= w.lane ? mf_from<T>(w, w.lane - delta) : v;
}
template <class T> static inline T simd_shuffle_xor(T v, ushort mask, MF_SITE_PARAMS) {
    mf_emu_simd_view w = mf_exchange(v, mf_file, mf_line);
    return mf_from<T>(w, (w.lane ^ mask) & (MF_EMU_SIMD_WIDTH - 1));
}
static inline bool simd_all(bool b, MF_SITE_PARAMS) {
    mf_emu_simd_view w = mf_exchange(b, mf_file, mf_line);
    for (uint32_t l = 0; l < MF_EMU_SIMD_WIDTH; l++) if ((w.mask >> l & 1u) && !mf_lane<bool>(w, l)) return false;
    return true;
}
static inline bool simd_any(bool b, MF_SITE_PARAMS) {
    mf_emu_simd_view w = mf_exchange(b, mf_file, mf_line);
    for (uint32_t l = 0; l < MF_EMU_SIMD_WIDTH; l++) if ((w.mask >> l & 1u) && mf_lane<bool>(w, l)) return true;
    return false;
}

// ---- simdgroup matrices ---------------------------------------------------
// Each lane holds the whole 8x8 matrix and computes the whole product: the
// result is what the simdgroup as a whole holds on the GPU (all lanes must
// pass the same arguments, as MSL requires).
template <class T, int R, int C> struct simdgroup_matrix {
    static_assert(R == 8 && C == 8, "simdgroup_matrix: only 8x8");
    T e[R * C];
    simdgroup_matrix() { for (int i = 0; i < R * C; i++) e[i] = (T)0; }
    explicit simdgroup_matrix(T diag) { for (int i = 0; i < R * C; i++) e[i] = (i / C == i % C) ? diag : (T)0; }
};
typedef simdgroup_matrix<float, 8, 8> simdgroup_float8x8;
typedef simdgroup_matrix<half, 8, 8> simdgroup_half8x8;

template <class T, int R, int C> static inline simdgroup_matrix<T, R, C> make_filled_simdgroup_matrix(T v) {
    simdgroup_matrix<T, R, C> m;
    for (int i = 0; i < R * C; i++) m.e[i] = v;
    return m;
}
// matrix_origin is (column, row) in the source; transpose loads the
// transposed block: m[r][c] = src[c][r].
template <class T, class P>
static inline void simdgroup_load(simdgroup_matrix<T, 8, 8> &m, P src, ulong elements_per_row = 8,
                                  ulong2 matrix_origin = 0, bool transpose = false) {
    P base = src + matrix_origin.y * elements_per_row + matrix_origin.x;
    for (int r = 0; r < 8; r++)
        for (int c = 0; c < 8; c++)
            m.e[r * 8 + c] = (T)(transpose ? base[(ulong)c * elements_per_row + r] : base[(ulong)r * elements_per_row + c]);
}
template <class T, class P>
static inline void simdgroup_store(const simdgroup_matrix<T, 8, 8> &m, P dst, ulong elements_per_row = 8,
                                   ulong2 matrix_origin = 0, bool transpose = false) {
    P base = dst + matrix_origin.y * elements_per_row + matrix_origin.x;
    // every lane stores the same values (the whole simdgroup's matrix)
    for (int r = 0; r < 8; r++)
        for (int c = 0; c < 8; c++) {
            if (transpose) base[(ulong)c * elements_per_row + r] = m.e[r * 8 + c];
            else base[(ulong)r * elements_per_row + c] = m.e[r * 8 + c];
        }
}
template <class TD, class TA, class TB, class TC>
static inline void simdgroup_multiply_accumulate(simdgroup_matrix<TD, 8, 8> &d, const simdgroup_matrix<TA, 8, 8> &a,
                                                 const simdgroup_matrix<TB, 8, 8> &b,
                                                 const simdgroup_matrix<TC, 8, 8> &c) {
    float fa[64], fb[64], acc[64];
    for (int i = 0; i < 64; i++) {
        fa[i] = (float)a.e[i];
        fb[i] = (float)b.e[i];
        acc[i] = (float)c.e[i];
    }
    for (int r = 0; r < 8; r++)
        for (int k = 0; k < 8; k++) {
            float av = fa[r * 8 + k];
            for (int j = 0; j < 8; j++) acc[r * 8 + j] += av * fb[k * 8 + j];
        }
    for (int i = 0; i < 64; i++) d.e[i] = (TD)acc[i];
}
template <class TD, class TA, class TB>
static inline void simdgroup_multiply(simdgroup_matrix<TD, 8, 8> &d, const simdgroup_matrix<TA, 8, 8> &a,
                                      const simdgroup_matrix<TB, 8, 8> &b) {
    simdgroup_matrix<TD, 8, 8> z;
    simdgroup_multiply_accumulate(d, a, b, z);
}

// ---- atomics (the dispatch runs on one OS thread; still real atomics) ------
enum memory_order { memory_order_relaxed = 0 };
struct atomic_uint { uint v; };
struct atomic_int { int v; };
struct atomic_float { float v; };
template <class A> struct mf_atomic_val;
template <> struct mf_atomic_val<atomic_uint> { typedef uint T; };
template <> struct mf_atomic_val<atomic_int> { typedef int T; };
template <> struct mf_atomic_val<atomic_float> { typedef float T; };
#define MF_ATOMIC_T(p) typename std::remove_cv<decltype((p)->v)>::type
template <class P> static inline auto atomic_load_explicit(P p, memory_order) {
    MF_ATOMIC_T(p) *q = (MF_ATOMIC_T(p) *)(uintptr_t)p;
    MF_ATOMIC_T(p) r;
    __atomic_load(q, &r, __ATOMIC_SEQ_CST);
    return r;
}
template <class P, class T> static inline void atomic_store_explicit(P p, T v, memory_order) {
    MF_ATOMIC_T(p) *q = (MF_ATOMIC_T(p) *)(uintptr_t)p;
    MF_ATOMIC_T(p) x = (MF_ATOMIC_T(p))v;
    __atomic_store(q, &x, __ATOMIC_SEQ_CST);
}
template <class P, class T> static inline auto atomic_exchange_explicit(P p, T v, memory_order) {
    MF_ATOMIC_T(p) *q = (MF_ATOMIC_T(p) *)(uintptr_t)p;
    MF_ATOMIC_T(p) x = (MF_ATOMIC_T(p))v, r;
    __atomic_exchange(q, &x, &r, __ATOMIC_SEQ_CST);
    return r;
}
template <class P, class E, class T>
static inline bool atomic_compare_exchange_weak_explicit(P p, E *expected, T desired, memory_order, memory_order) {
    MF_ATOMIC_T(p) *q = (MF_ATOMIC_T(p) *)(uintptr_t)p;
    MF_ATOMIC_T(p) *e = (MF_ATOMIC_T(p) *)(uintptr_t)expected;
    MF_ATOMIC_T(p) d = (MF_ATOMIC_T(p))desired;
    return __atomic_compare_exchange(q, e, &d, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
}
// read-modify-write through a compare-exchange loop: works for float too.
#define MF_ATOMIC_RMW(name, expr)                                                           \
    template <class P, class T> static inline auto name(P p, T v, memory_order) {           \
        MF_ATOMIC_T(p) *q = (MF_ATOMIC_T(p) *)(uintptr_t)p;                                 \
        MF_ATOMIC_T(p) b = (MF_ATOMIC_T(p))v, a, n;                                         \
        __atomic_load(q, &a, __ATOMIC_SEQ_CST);                                             \
        do { n = (expr); } while (!__atomic_compare_exchange(q, &a, &n, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)); \
        return a;                                                                           \
    }
MF_ATOMIC_RMW(atomic_fetch_add_explicit, a + b)
MF_ATOMIC_RMW(atomic_fetch_sub_explicit, a - b)
MF_ATOMIC_RMW(atomic_fetch_max_explicit, a > b ? a : b)
MF_ATOMIC_RMW(atomic_fetch_min_explicit, a < b ? a : b)
MF_ATOMIC_RMW(atomic_fetch_or_explicit, a | b)
MF_ATOMIC_RMW(atomic_fetch_and_explicit, a & b)
MF_ATOMIC_RMW(atomic_fetch_xor_explicit, a ^ b)
#undef MF_ATOMIC_RMW

} // namespace metal

using namespace metal;

// ---- MSL keywords ----------------------------------------------------------
#define device __attribute__((address_space(1)))
#define constant __attribute__((address_space(2)))
#define threadgroup __attribute__((address_space(3)))
#define thread
#define kernel static
#define double mf_msl_has_no_double_type

#endif
