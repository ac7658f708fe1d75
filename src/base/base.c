/* base.c - errors, allocation, logging, fp16/bf16, time. */
#include "base/base.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- errors --------------------------------------------------------------- */

int mf_errorf(mf_error *err, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return -1;
}

int mf_error_prefix(mf_error *err, const char *fmt, ...) {
    if (!err)
        return -1;
    char prefix[256], old[sizeof err->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, err->msg, sizeof old);
    snprintf(err->msg, sizeof err->msg, "%s: %s", prefix, old);
    return -1;
}

void mf_panic(const char *file, int line, const char *fmt, ...) {
    fprintf(stderr, "minfer: internal error at %s:%d: ", file, line);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    abort();
}

/* ---- escaping ------------------------------------------------------------- */

/* Length of the valid UTF-8 sequence at s[0..n) (1..4), or 0 when the bytes
 * there are not one (overlong forms, surrogates and values past U+10FFFF
 * included). */
static size_t utf8_seq(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    size_t len;
    uint32_t cp;
    if (c < 0x80)
        return 1;
    if (c >= 0xc2 && c <= 0xdf)
        len = 2, cp = c & 0x1f;
    else if (c >= 0xe0 && c <= 0xef)
        len = 3, cp = c & 0x0f;
    else if (c >= 0xf0 && c <= 0xf4)
        len = 4, cp = c & 0x07;
    else
        return 0;
    if (n < len)
        return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[i] & 0x3f);
    }
    if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
        (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    return len;
}

size_t mf_utf8_valid_len(const char *s, size_t n) {
    size_t i = 0;
    for (size_t k; i < n && (k = utf8_seq((const unsigned char *)s + i, n - i)) != 0;)
        i += k;
    return i;
}

const char *mf_escape(const void *s, size_t n, char *buf, size_t cap) {
    const unsigned char *p = s;
    size_t o = 0;
    if (cap == 0)
        return buf;
    for (size_t i = 0; i < n;) {
        char piece[8];
        size_t k, adv = utf8_seq(p + i, n - i);
        unsigned c = p[i];
        bool c1 = adv == 2 && c == 0xc2 && p[i + 1] < 0xa0; /* U+0080..U+009F */
        if (adv == 1 && c >= 0x20 && c < 0x7f && c != '\\') {
            piece[0] = (char)c;
            k = 1;
        } else if (c == '\\') {
            piece[0] = '\\', piece[1] = '\\';
            k = 2;
        } else if (adv > 1 && !c1) {
            memcpy(piece, p + i, adv);
            k = adv;
        } else {
            snprintf(piece, sizeof piece, "\\x%02x", c);
            k = 4;
            adv = 1;
        }
        if (o + k + 4 > cap) { /* room for "..." and the terminator */
            size_t e = o + 3 < cap ? o : (cap > 4 ? cap - 4 : 0);
            if (cap > 3) {
                memcpy(buf + e, "...", 3);
                e += 3;
            }
            buf[e < cap ? e : cap - 1] = 0;
            return buf;
        }
        memcpy(buf + o, piece, k);
        o += k;
        i += adv;
    }
    buf[o] = 0;
    return buf;
}

void *mf_malloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p)
        mf_panic(__FILE__, __LINE__, "out of memory allocating %zu bytes", n);
    return p;
}

void *mf_calloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p)
        mf_panic(__FILE__, __LINE__, "out of memory allocating %zu x %zu bytes", n, size);
    return p;
}

void *mf_realloc(void *p, size_t n) {
    void *q = realloc(p, n ? n : 1);
    if (!q)
        mf_panic(__FILE__, __LINE__, "out of memory reallocating to %zu bytes", n);
    return q;
}

char *mf_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    return memcpy(mf_malloc(n), s, n);
}

/* ---- logging ----------------------------------------------------------------- */

static int log_level = -1;          /* set by mf_log_set_level: wins */
static int log_default = MF_LOG_WARN; /* the runtime's MINFER_LOG, until then warn */

mf_log_level mf_log_get_level(void) {
    return (mf_log_level)(log_level >= 0 ? log_level : log_default);
}

void mf_log_set_level(mf_log_level level) { log_level = (int)level; }

void mf_log_set_default_level(mf_log_level level) { log_default = (int)level; }

void mf_log(mf_log_level level, const char *fmt, ...) {
    static const char *const tag[] = {"debug", "info", "warning", "error"};
    if (level < mf_log_get_level())
        return;
    fprintf(stderr, "minfer: %s: ", tag[level]);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

/* ---- fp16 / bf16 ---------------------------------------------------------------- */

static inline uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float f32_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float mf_fp16_to_fp32(mf_fp16 h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    if (exp == 0x1f) /* inf / nan */
        return f32_from_bits(sign | 0x7f800000u | (man << 13));
    if (exp == 0) {
        if (man == 0)
            return f32_from_bits(sign);
        /* subnormal: value = man * 2^-24 */
        float v = (float)man * (1.0f / 16777216.0f);
        return sign ? -v : v;
    }
    return f32_from_bits(sign | ((exp + 112) << 23) | (man << 13));
}

mf_fp16 mf_fp32_to_fp16(float f) {
    uint32_t x = f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000;
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) /* inf or nan (keep a quiet nan) */
        return (mf_fp16)(sign | 0x7c00 | (ax > 0x7f800000u ? 0x200 | ((ax >> 13) & 0x3ff) : 0));
    if (ax >= 0x477ff000u) /* rounds to >= 65520: overflow to inf */
        return (mf_fp16)(sign | 0x7c00);
    if (ax < 0x38800000u) { /* below the smallest normal half: subnormal or zero */
        /* value / 2^-24 rounded to nearest even; exact in float arithmetic */
        float v = f32_from_bits(ax) * 16777216.0f;
        uint32_t m = (uint32_t)v;
        float frac = v - (float)m;
        if (frac > 0.5f || (frac == 0.5f && (m & 1)))
            m++;
        return (mf_fp16)(sign | m); /* m == 0x400 carries into the exponent correctly */
    }
    uint32_t exp = (ax >> 23) - 112;
    uint32_t man = ax & 0x7fffff;
    uint32_t h = (exp << 10) | (man >> 13);
    uint32_t rest = man & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1)))
        h++; /* may carry into the exponent, which is the right answer */
    return (mf_fp16)(sign | h);
}

mf_bf16 mf_fp32_to_bf16(float f) {
    uint32_t x = f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) /* nan: force quiet */
        return (mf_bf16)((x >> 16) | 64);
    x += 0x7fff + ((x >> 16) & 1);
    return (mf_bf16)(x >> 16);
}

/* ---- time ---------------------------------------------------------------------- */

uint64_t mf_time_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}
