/* Plane transforms: rearrange the bits of each element so that bits that
 * behave alike (exponents, mantissa bytes) sit in their own byte plane. */
#include "core/stz_core.h"
#include "stz_planes.h"
#include "pack_internal.h"
#include "stz_pack.h"

static const struct {
    const char *name;
    unsigned width, planes;
} xform_table[STZ_XFORM_COUNT] = {
    [STZ_XFORM_NONE] = {"none", 1, 1},       [STZ_XFORM_BF16] = {"bf16", 2, 2},
    [STZ_XFORM_F16] = {"f16", 2, 3},         [STZ_XFORM_F32] = {"f32", 4, 4},
    [STZ_XFORM_BYTES2] = {"bytes2", 2, 2},   [STZ_XFORM_BYTES4] = {"bytes4", 4, 4},
    [STZ_XFORM_BYTES8] = {"bytes8", 8, 8},   [STZ_XFORM_GGML] = {"ggml", 1, 0},
    [STZ_XFORM_MEMBERS] = {"members", 1, 0},
};

static const char *const plane_names[STZ_XFORM_GGML][STZ_MAX_PLANES] = {
    [STZ_XFORM_NONE] = {"bytes"},
    [STZ_XFORM_BF16] = {"exponent", "sign+mantissa"},
    [STZ_XFORM_F16] = {"exponent", "sign+mantissa-hi", "mantissa-lo"},
    [STZ_XFORM_F32] = {"exponent", "sign+mantissa-hi", "mantissa-mid", "mantissa-lo"},
    [STZ_XFORM_BYTES2] = {"byte0", "byte1"},
    [STZ_XFORM_BYTES4] = {"byte0", "byte1", "byte2", "byte3"},
    [STZ_XFORM_BYTES8] = {"byte0", "byte1", "byte2", "byte3", "byte4", "byte5", "byte6", "byte7"},
};

const char *stz_xform_name(stz_xform x) { return (unsigned)x < STZ_XFORM_COUNT ? xform_table[x].name : "?"; }

const char *stz_plane_name(stz_xform x, int block_type, int k, char *buf, size_t cap)
{
    if (x == STZ_XFORM_GGML)
        return stz_blocks_plane_name(block_type, k, buf, cap);
    return (unsigned)x < STZ_XFORM_GGML && (unsigned)k < STZ_MAX_PLANES && plane_names[x][k] ? plane_names[x][k] : "?";
}

unsigned stz_xform_width(stz_xform x) { return (unsigned)x < STZ_XFORM_COUNT ? xform_table[x].width : 0; }
unsigned stz_xform_planes(stz_xform x) { return (unsigned)x < STZ_XFORM_COUNT ? xform_table[x].planes : 0; }

stz_xform stz_xform_for_dtype(stz_dtype d)
{
    switch (d) {
    case STZ_DTYPE_BF16: return STZ_XFORM_BF16;
    case STZ_DTYPE_F16: return STZ_XFORM_F16;
    case STZ_DTYPE_F32:
    case STZ_DTYPE_C64: /* pairs of F32 */ return STZ_XFORM_F32;
    case STZ_DTYPE_I16:
    case STZ_DTYPE_U16: return STZ_XFORM_BYTES2;
    case STZ_DTYPE_I32:
    case STZ_DTYPE_U32: return STZ_XFORM_BYTES4;
    case STZ_DTYPE_F64:
    case STZ_DTYPE_I64:
    case STZ_DTYPE_U64: return STZ_XFORM_BYTES8;
    default: return STZ_XFORM_NONE; /* 1-byte and sub-byte types */
    }
}

/*
 * Layouts (element read little-endian; bit 0 is the least significant):
 *   BF16 v: p0 = v[14:7] (exponent)       p1 = v[15] << 7 | v[6:0]
 *   F16  v: p0 = v[14:10] (exponent)      p1 = v[15] << 2 | v[9:8]   p2 = v[7:0]
 *   F32  v: p0 = v[30:23] (exponent)      p1 = v[31] << 7 | v[22:16]
 *           p2 = v[15:8]                  p3 = v[7:0]
 *   BYTESw: pk = byte k of the element;   NONE: p0 = the bytes.
 * The sign moves next to the mantissa: the exponent plane then holds only
 * the exponent, whose few common values entropy-code well.
 */
/* Each layout has its own function so that the plane pointers are
 * restrict-qualified locals: otherwise byte stores might alias the pointer
 * array and the loops would not vectorise. Each has an AVX2 clone where the
 * machine has it (byte moves: the same bytes either way). */
#ifndef PLANE_CLONES /* tests/test_pack.c builds this file once more without them */
#define PLANE_CLONES STZ_CLONES("avx2", "default")
#endif
PLANE_CLONES static void split_bf16(const uint8_t *restrict src, size_t m, uint8_t *restrict e, uint8_t *restrict sm)
{
    for (size_t i = 0; i < m; i++) {
        uint16_t v = stz_le16(src + 2 * i);
        e[i] = (uint8_t)(v >> 7);
        sm[i] = (uint8_t)(((v >> 8) & 0x80) | (v & 0x7f));
    }
}

PLANE_CLONES static void merge_bf16(const uint8_t *restrict e, const uint8_t *restrict sm, size_t m,
                                    uint8_t *restrict dst)
{
    for (size_t i = 0; i < m; i++) {
        unsigned x = e[i], y = sm[i];
        stz_put_le16(dst + 2 * i, (uint16_t)(((y & 0x80) << 8) | (x << 7) | (y & 0x7f)));
    }
}

PLANE_CLONES static void split_f16(const uint8_t *restrict src, size_t m, uint8_t *restrict e, uint8_t *restrict sh,
                                   uint8_t *restrict lo)
{
    for (size_t i = 0; i < m; i++) {
        uint16_t v = stz_le16(src + 2 * i);
        e[i] = (uint8_t)((v >> 10) & 0x1f);
        sh[i] = (uint8_t)(((v >> 13) & 0x4) | ((v >> 8) & 0x3));
        lo[i] = (uint8_t)v;
    }
}

PLANE_CLONES static void merge_f16(const uint8_t *restrict e, const uint8_t *restrict sh, const uint8_t *restrict lo,
                                   size_t m, uint8_t *restrict dst)
{
    for (size_t i = 0; i < m; i++) {
        unsigned x = e[i] & 0x1f, y = sh[i];
        stz_put_le16(dst + 2 * i, (uint16_t)(((y & 0x4) << 13) | (x << 10) | ((y & 0x3) << 8) | lo[i]));
    }
}

PLANE_CLONES static void split_f32(const uint8_t *restrict src, size_t m, uint8_t *restrict e, uint8_t *restrict sm,
                                   uint8_t *restrict b1, uint8_t *restrict b0)
{
    for (size_t i = 0; i < m; i++) {
        uint32_t v = stz_le32(src + 4 * i);
        e[i] = (uint8_t)(v >> 23);
        sm[i] = (uint8_t)(((v >> 24) & 0x80) | ((v >> 16) & 0x7f));
        b1[i] = (uint8_t)(v >> 8);
        b0[i] = (uint8_t)v;
    }
}

PLANE_CLONES static void merge_f32(const uint8_t *restrict e, const uint8_t *restrict sm, const uint8_t *restrict b1,
                                   const uint8_t *restrict b0, size_t m, uint8_t *restrict dst)
{
    for (size_t i = 0; i < m; i++) {
        uint32_t x = e[i], y = sm[i];
        stz_put_le32(dst + 4 * i, ((y & 0x80) << 24) | (x << 23) | ((y & 0x7f) << 16) | ((uint32_t)b1[i] << 8) | b0[i]);
    }
}

void stz_xform_split(stz_xform x, const uint8_t *src, size_t n, uint8_t *const *p)
{
    size_t w = stz_xform_width(x), m = n / w;
    switch (x) {
    case STZ_XFORM_BF16: split_bf16(src, m, p[0], p[1]); break;
    case STZ_XFORM_F16: split_f16(src, m, p[0], p[1], p[2]); break;
    case STZ_XFORM_F32: split_f32(src, m, p[0], p[1], p[2], p[3]); break;
    default:
        for (size_t k = 0; k < w; k++) {
            uint8_t *restrict d = p[k];
            for (size_t i = 0; i < m; i++)
                d[i] = src[w * i + k];
        }
        break;
    }
}

void stz_xform_merge(stz_xform x, const uint8_t *const *p, size_t n, uint8_t *dst)
{
    size_t w = stz_xform_width(x), m = n / w;
    switch (x) {
    case STZ_XFORM_BF16: merge_bf16(p[0], p[1], m, dst); break;
    case STZ_XFORM_F16: merge_f16(p[0], p[1], p[2], m, dst); break;
    case STZ_XFORM_F32: merge_f32(p[0], p[1], p[2], p[3], m, dst); break;
    default:
        for (size_t k = 0; k < w; k++) {
            const uint8_t *restrict s = p[k];
            for (size_t i = 0; i < m; i++)
                dst[w * i + k] = s[i];
        }
        break;
    }
}
