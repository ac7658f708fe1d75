/* IEEE binary16 <-> binary32, round to nearest even: the helpers clang calls
 * for every __fp16 conversion (MSL's half). compiler-rt names them
 * __gnu_f2h_ieee / __gnu_h2f_ieee; libgcc on x86-64 has neither. */
#include <stdint.h>
#include <string.h>

uint16_t __gnu_f2h_ieee(float f);
float __gnu_h2f_ieee(uint16_t h);
uint16_t __truncsfhf2(float f);
float __extendhfsf2(uint16_t h);

uint16_t __gnu_f2h_ieee(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) /* inf or nan (nan keeps a quiet payload bit) */
        return (uint16_t)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u | ((ax >> 13) & 0x3ffu) : 0));
    if (ax >= 0x477ff000u) /* rounds to >= 65520: overflow to inf */
        return (uint16_t)(sign | 0x7c00u);
    if (ax < 0x38800000u) { /* below the smallest normal half: subnormal or zero */
        if (ax < 0x33000000u) /* below half the smallest subnormal: +-0 */
            return (uint16_t)sign;
        uint32_t e = ax >> 23;           /* 102 .. 112 */
        uint32_t m = (ax & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126u - e;       /* 14 .. 24 */
        uint32_t q = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1u);
        uint32_t halfway = 1u << (shift - 1u);
        if (rem > halfway || (rem == halfway && (q & 1u)))
            q++;
        return (uint16_t)(sign | q);
    }
    uint32_t q = (ax >> 13) - (112u << 10); /* rebias 127 -> 15 */
    uint32_t rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (q & 1u)))
        q++; /* a carry into the exponent is still the right answer */
    return (uint16_t)(sign | q);
}

float __gnu_h2f_ieee(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu, x;
    if (e == 0x1f)
        x = sign | 0x7f800000u | (m << 13);
    else if (e != 0)
        x = sign | ((e + 112u) << 23) | (m << 13);
    else if (m == 0)
        x = sign;
    else { /* subnormal: normalise */
        int sh = 0;
        while (!(m & 0x400u)) { m <<= 1; sh++; }
        x = sign | ((uint32_t)(113 - sh) << 23) | ((m & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &x, 4);
    return f;
}

/* The same conversions under the names newer compilers use. */
uint16_t __truncsfhf2(float f) { return __gnu_f2h_ieee(f); }
float __extendhfsf2(uint16_t h) { return __gnu_h2f_ieee(h); }
