/* Transform 7 (ggml): llama.cpp's quantized blocks as planes, one per field
 * of the block (docs/FORMAT.md): scale bytes, sub-block scales, codes. The
 * codes of the 5- and 6-bit types are kept whole, one per byte: their low
 * nibbles and high bits sit in different fields of the block, and split
 * that way each part looks close to random (Q5_0: 4.96 bits per code) while
 * the whole code does not (4.60). Q4_K's and Q5_K's codes are grouped by a
 * class of their sub-block's zero point (dmin * min / (d * scale), the code
 * that stands for 0), which shapes their distribution: coded per class they
 * take 3.2% fewer bits (Q4_K: 3.71 bits per code, 3.84 in one stream);
 * Q6_K's by their scale against the block's largest (0.5%). Bytes of
 * partial blocks at the chunk's two ends go to a last plane as they are. */
#include "pack_internal.h"
#include "core/stz_core.h"
#include "quant/ggml_types.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CLASSES STZ_BLOCK_RUNS /* zero-point classes of the grouped codes */

typedef struct {
    uint16_t off, len;
} field;

/* A type's planes, from its row of traits (quant/ggml_types.c): each field
 * not part of the codes to a plane of its own (an F16 scale to two, its
 * low byte and its high one), then the whole codes, then the partial
 * blocks' bytes. */
typedef struct {
    const stz_ggml_traits *t;
    uint16_t bytes; /* of a block */
    uint8_t nf;     /* planes copied byte for byte from fields */
    field f[2 * STZ_GGML_FIELDS];
    uint8_t codes;           /* STZ_CODES_*: whole codes into the plane after the fields */
    uint16_t qh, qs, ncodes; /* where the codes' high bits and low nibbles start; codes plane bytes per block */
} block_layout;

/* Bytes of the codes plane per block: one code per byte, Q4_K's two. */
static uint16_t codes_bytes(const stz_ggml_traits *t)
{
    return (uint16_t)(t->codes == STZ_CODES_Q4_K ? t->block / 2 : t->codes ? t->block : 0);
}

/* 1 and *L filled for the types split into planes, else 0. */
static int layout_of(int type, block_layout *L)
{
    const stz_ggml_traits *t = stz_ggml_traits_of(type);
    if (!t || !t->fields[0].name)
        return 0;
    *L = (block_layout){.t = t, .bytes = (uint16_t)t->bytes, .codes = t->codes, .ncodes = codes_bytes(t)};
    for (const stz_ggml_field *f = t->fields; f < t->fields + STZ_GGML_FIELDS && f->name; f++)
        if (f->kind == STZ_FIELD_CODES && !strcmp(f->name, "qh"))
            L->qh = f->off;
        else if (f->kind == STZ_FIELD_CODES) /* qs, or Q6_K's ql */
            L->qs = f->off;
        else if (f->kind == STZ_FIELD_F16)
            L->f[L->nf++] = (field){f->off, 1}, L->f[L->nf++] = (field){(uint16_t)(f->off + 1), 1};
        else
            L->f[L->nf++] = (field){f->off, f->len};
    return 1;
}

int stz_blocks_known(int type)
{
    block_layout L;
    return layout_of(type, &L);
}

/* The codes of one block b into c, and back. Q5 (32-blocks): element j < 16
 * in the low nibble of qs[j], j + 16 in its high one, bit 4 of element j in
 * bit j of the little-endian word at qh. Q5_K: 64-element groups g, element
 * l < 32 of a group in qs[32g + l]'s low nibble with high bit 2g of qh[l],
 * element 32 + l in the high nibble with bit 2g + 1. Q6_K: two halves of 128,
 * four 32-runs each from the low and high nibbles of ql[l] and ql[l + 32]
 * with 2-bit pairs 0, 2, 4, 6 of qh[l] (ggml-common.h's layouts). */
static void codes_split(const block_layout *L, const uint8_t *b, uint8_t *c)
{
    const uint8_t *qh = b + L->qh, *qs = b + L->qs;
    if (L->codes == STZ_CODES_Q4_K) { /* sub-block 2g: low nibbles of qs[32g..], 2g + 1: high; pairs of neighbours */
        for (int g = 0; g < 4; g++)
            for (int i = 0; i < 16; i++) {
                uint8_t a = qs[32 * g + 2 * i], z = qs[32 * g + 2 * i + 1];
                c[32 * g + i] = (uint8_t)((a & 15) | (z & 15) << 4);
                c[32 * g + 16 + i] = (uint8_t)((a >> 4) | (z >> 4) << 4);
            }
    } else if (L->codes == STZ_CODES_Q5) {
        uint32_t h = stz_le32(qh);
        for (int j = 0; j < 16; j++) {
            c[j] = (uint8_t)((qs[j] & 15) | ((h >> j) & 1) << 4);
            c[j + 16] = (uint8_t)((qs[j] >> 4) | ((h >> (j + 16)) & 1) << 4);
        }
    } else if (L->codes == STZ_CODES_Q5_K) {
        for (int g = 0; g < 4; g++)
            for (int l = 0; l < 32; l++) {
                c[64 * g + l] = (uint8_t)((qs[32 * g + l] & 15) | ((qh[l] >> (2 * g)) & 1) << 4);
                c[64 * g + 32 + l] = (uint8_t)((qs[32 * g + l] >> 4) | ((qh[l] >> (2 * g + 1)) & 1) << 4);
            }
    } else { /* Q6_K: qs is ql */
        for (const uint8_t *ql = qs; ql < qs + 128; ql += 64, qh += 32, c += 128)
            for (int l = 0; l < 32; l++) {
                c[l] = (uint8_t)((ql[l] & 15) | (qh[l] & 3) << 4);
                c[l + 32] = (uint8_t)((ql[l + 32] & 15) | ((qh[l] >> 2) & 3) << 4);
                c[l + 64] = (uint8_t)((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4);
                c[l + 96] = (uint8_t)((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4);
            }
    }
}

/* Inverse of codes_split; bits above a code's width are dropped (a corrupt
 * plane then fails the chunk's hash). */
static void codes_merge(const block_layout *L, const uint8_t *c, uint8_t *b)
{
    uint8_t *qh = b + L->qh, *qs = b + L->qs;
    if (L->codes == STZ_CODES_Q4_K) {
        for (int g = 0; g < 4; g++)
            for (int i = 0; i < 16; i++) {
                uint8_t lo = c[32 * g + i], hi = c[32 * g + 16 + i];
                qs[32 * g + 2 * i] = (uint8_t)((lo & 15) | (hi & 15) << 4);
                qs[32 * g + 2 * i + 1] = (uint8_t)((lo >> 4) | (hi >> 4) << 4);
            }
    } else if (L->codes == STZ_CODES_Q5) {
        uint32_t h = 0;
        for (int j = 0; j < 16; j++) {
            qs[j] = (uint8_t)((c[j] & 15) | (c[j + 16] & 15) << 4);
            h |= (uint32_t)((c[j] >> 4) & 1) << j | (uint32_t)((c[j + 16] >> 4) & 1) << (j + 16);
        }
        stz_put_le32(qh, h);
    } else if (L->codes == STZ_CODES_Q5_K) {
        memset(qh, 0, 32);
        for (int g = 0; g < 4; g++)
            for (int l = 0; l < 32; l++) {
                uint8_t lo = c[64 * g + l], hi = c[64 * g + 32 + l];
                qs[32 * g + l] = (uint8_t)((lo & 15) | (hi & 15) << 4);
                qh[l] |= (uint8_t)(((lo >> 4) & 1) << (2 * g) | ((hi >> 4) & 1) << (2 * g + 1));
            }
    } else { /* Q6_K: qs is ql */
        for (uint8_t *ql = qs; ql < qs + 128; ql += 64, qh += 32, c += 128)
            for (int l = 0; l < 32; l++) {
                ql[l] = (uint8_t)((c[l] & 15) | (c[l + 64] & 15) << 4);
                ql[l + 32] = (uint8_t)((c[l + 32] & 15) | (c[l + 96] & 15) << 4);
                qh[l] = (uint8_t)((c[l] >> 4 & 3) | (c[l + 32] >> 4 & 3) << 2 | (c[l + 64] >> 4 & 3) << 4 |
                                  (c[l + 96] >> 4 & 3) << 6);
            }
    }
}

/* A chunk of n bytes starting `phase` bytes into a block: *head bytes end
 * that block, *m whole blocks follow, then *tail bytes of a block. */
static void cut(const block_layout *L, uint32_t phase, size_t n, size_t *head, size_t *m, size_t *tail)
{
    size_t h = phase ? L->bytes - phase : 0;
    *head = h < n ? h : n;
    *m = (n - *head) / L->bytes;
    *tail = n - *head - *m * L->bytes;
}

int stz_blocks_planes(int type, uint32_t phase, size_t n, uint32_t *raw)
{
    block_layout lay, *L = &lay;
    if (!layout_of(type, L) || phase >= L->bytes)
        return 0;
    size_t head, m, tail;
    cut(L, phase, n, &head, &m, &tail);
    int k = 0;
    for (; k < L->nf; k++)
        raw[k] = (uint32_t)(m * L->f[k].len);
    if (L->codes)
        raw[k++] = (uint32_t)(m * L->ncodes);
    raw[k++] = (uint32_t)(head + tail);
    return k;
}

/* m runs of len bytes, src + i * ss to dst + i * ds; constant lengths for
 * the fields blocks have, so that each copy is a move or two. */
#define RUNS(L)                                                                                                        \
    case L:                                                                                                            \
        for (size_t i = 0; i < m; i++)                                                                                 \
            memcpy(dst + i * ds, src + i * ss, L);                                                                     \
        break
static void copy_runs(uint8_t *restrict dst, size_t ds, const uint8_t *restrict src, size_t ss, size_t len, size_t m)
{
    switch (len) {
        RUNS(1);
        RUNS(2);
        RUNS(4);
        RUNS(12);
        RUNS(16);
        RUNS(32);
        RUNS(64);
        RUNS(128);
    default:
        for (size_t i = 0; i < m; i++)
            memcpy(dst + i * ds, src + i * ss, len);
    }
}

/* ---- Q4_K, Q5_K, Q6_K: codes grouped by a class of their sub-block ---- */

static int grouped(const block_layout *L)
{
    return L->codes == STZ_CODES_Q4_K || L->codes == STZ_CODES_Q5_K || L->codes == STZ_CODES_Q6_K;
}

/* Sub-blocks per block: 8 of 32 elements, Q6_K's 16 of 16. */
static int subs(const block_layout *L) { return L->codes == STZ_CODES_Q6_K ? 16 : 8; }

/* Q4_K, Q5_K: the class of each of a block's 8 sub-blocks, from its d and
 * dmin (F16 bits) and 12 bytes of 6-bit scales and minimums (ggml's
 * get_scale_min_k4): where the value 0 falls, dmin * min / (d * scale)
 * codes, in eighths of the code range (16 codes for Q4_K, 32 for Q5_K), the
 * top class from its end up; 0 when that is not a number (a zero or
 * non-finite scale). Exact everywhere: F16 values times 6-bit integers are
 * exact in double, the one division is correctly rounded, the rest are
 * powers of two. */
static void zero_classes(uint16_t d16, uint16_t m16, const uint8_t *q, const block_layout *L, uint8_t *cls)
{
    double d = stz_f16_to_f32(d16), dm = stz_f16_to_f32(m16), span = L->codes == STZ_CODES_Q4_K ? 16 : 32;
    for (int j = 0; j < 8; j++) {
        int sc = j < 4 ? q[j] & 63 : (q[j + 4] & 15) | (q[j - 4] >> 6) << 4;
        int mn = j < 4 ? q[j + 4] & 63 : (q[j + 4] >> 4) | (q[j] >> 6) << 4;
        double r = dm * mn / (d * sc);
        cls[j] = !(r >= 0) ? 0 : r >= span ? CLASSES - 1 : (uint8_t)(r * CLASSES / span);
    }
}

/* Q6_K: the class of each of its 16 sub-blocks, the size of its 8-bit scale
 * against the block's largest, |s| * 8 / (max |s| + 1): a sub-block whose
 * scale is small next to the block's spreads its codes wider. */
static void scale_classes(const uint8_t *sc, uint8_t *cls)
{
    int mx = 0;
    for (int j = 0; j < 16; j++)
        mx = abs((int8_t)sc[j]) > mx ? abs((int8_t)sc[j]) : mx;
    for (int j = 0; j < 16; j++)
        cls[j] = (uint8_t)(abs((int8_t)sc[j]) * CLASSES / (mx + 1));
}

/* Block i's classes, from the chunk's bytes (b: the block) or its planes. */
static void classes_raw(const block_layout *L, const uint8_t *b, uint8_t *cls)
{
    if (L->codes == STZ_CODES_Q6_K)
        scale_classes(b + 192, cls);
    else
        zero_classes(stz_le16(b), stz_le16(b + 2), b + 4, L, cls);
}

static void classes_planes(const block_layout *L, const uint8_t *const *p, size_t i, uint8_t *cls)
{
    if (L->codes == STZ_CODES_Q6_K) /* planes: scales, d.lo, d.hi, codes */
        scale_classes(p[0] + 16 * i, cls);
    else /* d.lo, d.hi, dmin.lo, dmin.hi, scales, codes */
        zero_classes((uint16_t)(p[0][i] | p[1][i] << 8), (uint16_t)(p[2][i] | p[3][i] << 8), p[4] + 12 * i, L, cls);
}

/* Where each class's run starts in the codes plane of m blocks (from the
 * raw blocks at b, or the planes p), and its length. */
static void class_runs(const block_layout *L, const uint8_t *b, const uint8_t *const *p, size_t m, size_t *start,
                       size_t *len)
{
    uint8_t cls[16];
    int ns = subs(L);
    size_t per = L->ncodes / (size_t)ns;
    memset(len, 0, CLASSES * sizeof *len);
    for (size_t i = 0; i < m; i++) {
        if (b)
            classes_raw(L, b + i * L->bytes, cls);
        else
            classes_planes(L, p, i, cls);
        for (int j = 0; j < ns; j++)
            len[cls[j]] += per;
    }
    for (size_t k = 0, at = 0; k < CLASSES; at += len[k], k++)
        start[k] = at;
}

/* The m blocks' codes into plane c: in block order (returns 0), or
 * grouped by class (returns CLASSES, the runs' lengths in len). */
static int split_codes(const block_layout *L, const uint8_t *b, size_t m, uint8_t *c, size_t *len)
{
    if (!grouped(L)) {
        for (size_t i = 0; i < m; i++)
            codes_split(L, b + i * L->bytes, c + i * L->ncodes);
        return 0;
    }
    int ns = subs(L);
    size_t at[CLASSES], per = L->ncodes / (size_t)ns;
    uint8_t cls[16], one[256];
    class_runs(L, b, NULL, m, at, len);
    for (size_t i = 0; i < m; i++) {
        classes_raw(L, b + i * L->bytes, cls);
        codes_split(L, b + i * L->bytes, one);
        for (int j = 0; j < ns; j++) {
            memcpy(c + at[cls[j]], one + j * per, per);
            at[cls[j]] += per;
        }
    }
    return CLASSES;
}

static void merge_codes(const block_layout *L, const uint8_t *const *p, const uint8_t *c, size_t m, uint8_t *b)
{
    if (!grouped(L)) {
        for (size_t i = 0; i < m; i++)
            codes_merge(L, c + i * L->ncodes, b + i * L->bytes);
        return;
    }
    int ns = subs(L);
    size_t at[CLASSES], len[CLASSES], per = L->ncodes / (size_t)ns;
    uint8_t cls[16], one[256];
    class_runs(L, NULL, p, m, at, len);
    for (size_t i = 0; i < m; i++) {
        classes_planes(L, p, i, cls);
        for (int j = 0; j < ns; j++) {
            memcpy(one + j * per, c + at[cls[j]], per);
            at[cls[j]] += per;
        }
        codes_merge(L, one, b + i * L->bytes);
    }
}

int stz_blocks_split(int type, uint32_t phase, const uint8_t *src, size_t n, uint8_t *const *p, size_t *runs)
{
    block_layout lay, *L = &lay;
    layout_of(type, L);
    size_t head, m, tail;
    cut(L, phase, n, &head, &m, &tail);
    const uint8_t *b = src + head;
    for (int k = 0; k < L->nf; k++)
        copy_runs(p[k], L->f[k].len, b + L->f[k].off, L->bytes, L->f[k].len, m);
    int nruns = L->codes ? split_codes(L, b, m, p[L->nf], runs) : 0;
    uint8_t *rest = p[L->nf + (L->codes != 0)];
    memcpy(rest, src, head);
    memcpy(rest + head, b + m * L->bytes, tail);
    return nruns;
}

void stz_blocks_merge(int type, uint32_t phase, const uint8_t *const *p, size_t n, uint8_t *dst)
{
    block_layout lay, *L = &lay;
    layout_of(type, L);
    size_t head, m, tail;
    cut(L, phase, n, &head, &m, &tail);
    uint8_t *b = dst + head;
    for (int k = 0; k < L->nf; k++)
        copy_runs(b + L->f[k].off, L->bytes, p[k], L->f[k].len, L->f[k].len, m);
    if (L->codes)
        merge_codes(L, p, p[L->nf], m, b);
    const uint8_t *rest = p[L->nf + (L->codes != 0)];
    memcpy(dst, rest, head);
    memcpy(b + m * L->bytes, rest + head, tail);
}

const char *stz_blocks_plane_name(int type, int k, char *buf, size_t cap)
{
    block_layout L;
    snprintf(buf, cap, "%s", "");
    if (!layout_of(type, &L))
        return buf;
    for (const stz_ggml_field *f = L.t->fields; f < L.t->fields + STZ_GGML_FIELDS && f->name; f++) {
        int n = f->kind == STZ_FIELD_CODES ? 0 : f->kind == STZ_FIELD_F16 ? 2 : 1;
        if (k < n)
            return snprintf(buf, cap, "%s%s", f->name, n == 1 ? "" : k ? ".hi" : ".lo"), buf;
        k -= n;
    }
    return snprintf(buf, cap, "%s", k == 0 && L.codes ? "codes" : k == (L.codes != 0) ? "partial" : ""), buf;
}

uint32_t stz_blocks_phase(int type, uint64_t offset)
{
    block_layout L;
    return layout_of(type, &L) ? (uint32_t)(offset % L.bytes) : 0;
}
