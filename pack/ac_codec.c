/* Codec 4: an adaptive binary range coder for small planes (docs/FORMAT.md,
 * "Codec 4"). A plane is cut into rows, a row's bit string into symbols of
 * B bits; a symbol's bits are coded high first, each with the probability
 * its context's counts give (the KT estimator), so no table is stored: on
 * a few kB of 4-bit codes it costs about 10 bytes of learning where a
 * Huffman table costs 30-150. Integer arithmetic only: the same bytes on
 * every machine. */
#include "pack_internal.h"
#include "core/stz_math.h"

#include <pthread.h>
#include <string.h>

#define PROB_BITS    15
#define COUNT_MAX    1024 /* a context's counts are halved here: the estimate follows drift along the plane */
#define TOP_NODES    256  /* contexts of the tree over a symbol's top bits (node 1 is the root) */
#define CONTEXTS     (TOP_NODES + 256 * 8)
#define RANGE_LOW    (1u << 24)
#define PARAM_MASK   0x7f
#define SIGNED_MODEL 0x40

/* How symbols become binary decisions: B bits, the tree's depth T, or
 * (sign) two's complement numbers coded by magnitude. */
typedef struct {
    unsigned bits, top, sign;
} shape;

typedef struct {
    shape sh;
    uint16_t n[CONTEXTS][2];
} model;

static void model_init(model *m, unsigned bits, unsigned top)
{
    memset(m->n, 0, sizeof m->n);
    m->sh = (shape){bits, top ? top : bits, !top};
}

/* Contexts of the signed model: zero or not, the sign, the magnitude's
 * octave e (unary, a context a step), then its e bits below the top one
 * (a context per octave and position). */
#define CTX_ZERO   0
#define CTX_SIGN   1
#define CTX_OCTAVE 2  /* + step, 8 */
#define CTX_BITS   10 /* + 8 * octave + position */

/* Context of the bit at depth d (0: the symbol's highest) after the higher
 * bits `prefix`: a node of the tree over the top bits, then (top bits, d). */
static unsigned context(const shape *m, unsigned d, unsigned prefix)
{
    return d < m->top ? (1u << d) | prefix : TOP_NODES + ((prefix >> (d - m->top)) << 3) + d;
}

/* 2^32 / t rounded up, for the counts' totals t = 2 (n0 + n1) + 2: a
 * multiplication in place of a division on every bit, the same integers
 * on every machine. */
#define TOTAL_MAX (2 * COUNT_MAX + 2)
static uint32_t inverse[TOTAL_MAX + 1];
static pthread_once_t inverse_once = PTHREAD_ONCE_INIT;
static void inverse_init(void)
{
    for (uint64_t t = 2; t <= TOTAL_MAX; t++)
        inverse[t] = (uint32_t)(((1ull << 32) + t - 1) / t);
}

/* P(bit = 0) in PROB_BITS bits, in [1, 2^PROB_BITS - 1]: the KT estimate
 * (2 n0 + 1) / (2 (n0 + n1) + 2). */
static uint32_t p0(const uint16_t *c)
{
    uint64_t q = ((uint64_t)(2u * c[0] + 1) << PROB_BITS) * inverse[2u * (c[0] + c[1]) + 2];
    uint32_t p = (uint32_t)(q >> 32);
    return p < 1 ? 1 : p >= (1u << PROB_BITS) ? (1u << PROB_BITS) - 1 : p;
}

static void update(uint16_t *c, int bit)
{
    if (++c[bit] + c[!bit] >= COUNT_MAX)
        c[0] = (uint16_t)((c[0] + 1) / 2), c[1] = (uint16_t)((c[1] + 1) / 2);
}

/* ---- the rows' symbols ---- */

/* Symbols of a row of `len` bytes: its bit string cut every `bits` bits,
 * the last symbol filled with zero bits. */
static size_t row_symbols(size_t len, unsigned bits) { return (len * 8 + bits - 1) / bits; }

static unsigned get_symbol(const uint8_t *row, size_t len, size_t at, unsigned bits)
{
    if (bits == 8)
        return row[at >> 3];
    if (bits == 4)
        return (row[at >> 3] >> (4 - (at & 7))) & 15u;
    unsigned s = 0;
    for (unsigned i = 0; i < bits; i++, at++)
        s = s << 1 | (at < len * 8 ? (row[at >> 3] >> (7 - (at & 7))) & 1u : 0u);
    return s;
}

static void put_symbol(uint8_t *row, size_t len, size_t at, unsigned bits, unsigned s)
{
    if (bits == 8 || bits == 4) { /* whole in one byte */
        row[at >> 3] |= (uint8_t)(s << (8 - bits - (at & 7)));
        return;
    }
    for (unsigned i = 0; i < bits && at + i < len * 8; i++)
        if ((s >> (bits - 1 - i)) & 1)
            row[(at + i) >> 3] |= (uint8_t)(0x80u >> ((at + i) & 7));
}

/* ---- encoder (LZMA's carry-less range coder) ---- */

typedef struct {
    uint64_t low;
    uint32_t range;
    uint8_t cache;
    uint64_t pending;
    int started; /* the first byte out, always 0, is not stored */
    uint8_t *out;
    size_t n, cap;
} encoder;

static void put_byte(encoder *e, uint8_t b)
{
    if (!e->started) {
        e->started = 1;
        return;
    }
    if (e->n < e->cap)
        e->out[e->n] = b;
    e->n++;
}

static void shift_low(encoder *e)
{
    if ((uint32_t)e->low < 0xff000000u || (e->low >> 32)) {
        uint8_t carry = (uint8_t)(e->low >> 32), b = e->cache;
        for (; e->pending; e->pending--, b = 0xff)
            put_byte(e, (uint8_t)(b + carry));
        e->cache = (uint8_t)(e->low >> 24);
    }
    e->pending++;
    e->low = (e->low & 0x00ffffffu) << 8;
}

static void encode_bit(encoder *e, uint16_t *c, int bit)
{
    uint32_t bound = (e->range >> PROB_BITS) * p0(c);
    if (bit)
        e->low += bound, e->range -= bound;
    else
        e->range = bound;
    update(c, bit);
    while (e->range < RANGE_LOW)
        e->range <<= 8, shift_low(e);
}

/* Symbol s as the model's binary decisions: contexts into ctx, bits into
 * bit, their count returned (at most MAX_STEPS; the decoder walks the same
 * steps bit by bit). */
#define MAX_STEPS 16
static int binarize(const shape *m, unsigned s, uint16_t *ctx, uint8_t *bit)
{
    int k = 0;
    if (!m->sign) {
        for (unsigned d = 0, prefix = 0; d < m->bits; d++, k++) {
            bit[k] = (uint8_t)((s >> (m->bits - 1 - d)) & 1);
            ctx[k] = (uint16_t)context(m, d, prefix);
            prefix = prefix << 1 | bit[k];
        }
        return k;
    }
    int v = (int)(s ^ (1u << (m->bits - 1))) - (1 << (m->bits - 1)); /* sign-extended */
    unsigned mag = (unsigned)(v < 0 ? -v : v), oct = 0;
    ctx[k] = CTX_ZERO, bit[k++] = mag != 0;
    if (!mag)
        return k;
    ctx[k] = CTX_SIGN, bit[k++] = v < 0;
    while (mag >> (oct + 1))
        oct++;
    for (unsigned j = 0; j < m->bits - 1; j++) { /* octaves 0 .. bits - 1: the last needs no stop */
        ctx[k] = (uint16_t)(CTX_OCTAVE + j), bit[k++] = oct > j;
        if (oct <= j)
            break;
    }
    for (unsigned d = oct; d-- > 0;)
        ctx[k] = (uint16_t)(CTX_BITS + 8 * oct + d), bit[k++] = (mag >> d) & 1;
    return k;
}

static void encode_symbol(encoder *e, model *m, unsigned s)
{
    uint16_t ctx[MAX_STEPS];
    uint8_t bit[MAX_STEPS];
    for (int k = 0, n = binarize(&m->sh, s, ctx, bit); k < n; k++)
        encode_bit(e, m->n[ctx[k]], bit[k]);
}

/* The parameters: byte 0 holds B - 1 (bits 0-2), T - 1 (bits 3-5), T the
 * depth of the tree over a symbol's top bits, and (bit 6) the signed model
 * in place of the tree (T - 1 then 0); then the row length R as an
 * unsigned LEB128 number (0: the plane is one row). */
static size_t put_params(uint8_t *dst, unsigned bits, unsigned top, uint32_t row)
{
    size_t k = 0;
    dst[k++] = (uint8_t)(top ? (bits - 1) | (top - 1) << 3 : (bits - 1) | SIGNED_MODEL);
    do
        dst[k++] = (uint8_t)((row & 0x7f) | (row > 0x7f ? 0x80 : 0));
    while ((row >>= 7));
    return k;
}

size_t stz_ac_encode(const uint8_t *src, size_t n, unsigned bits, unsigned top, uint32_t row, uint8_t *dst, size_t cap)
{
    static __thread model m; /* 4.6 kB: kept off small thread stacks */
    if (cap < 8 || !n)
        return 0;
    row = row < n ? row : 0; /* a row as long as the plane is one row */
    size_t head = put_params(dst, bits, top, row), len = row ? row : n;
    encoder e = {.range = 0xffffffffu, .pending = 1, .out = dst + head, .cap = cap - head};
    pthread_once(&inverse_once, inverse_init);
    model_init(&m, bits, top);
    for (size_t at = 0; at < n && e.n <= e.cap; at += len) {
        size_t rl = n - at < len ? n - at : len;
        for (size_t k = 0, ns = row_symbols(rl, bits); k < ns; k++)
            encode_symbol(&e, &m, get_symbol(src + at, rl, k * bits, bits));
    }
    for (int k = 0; k < 5; k++)
        shift_low(&e);
    return e.n <= e.cap ? head + e.n : 0;
}

/* ---- choosing a model without coding ---- */

/* About the bits the KT estimator spends on a context seen a times with 0
 * and b times with 1 (its code length does not depend on their order). */
static double kt_bits(uint64_t a, uint64_t b)
{
    double n = (double)(a + b), x = (double)a, y = (double)b;
    if (!a || !b)
        return n > 0 ? 0.5 * stz_log2(n) + 1 : 0;
    return n * stz_log2(n) - x * stz_log2(x) - y * stz_log2(y) + 0.5 * stz_log2(n) + 1;
}

/* The bits symbols of histogram hist[2^bits] take under the model
 * (bits, top), as each context's counts give them (their halving left
 * out): within a few percent of the coder's, enough to choose. */
static double estimate(const uint64_t *hist, unsigned bits, unsigned top)
{
    static __thread uint64_t c[CONTEXTS][2];
    shape sh = {bits, top ? top : bits, !top};
    uint16_t ctx[MAX_STEPS];
    uint8_t bit[MAX_STEPS];
    memset(c, 0, sizeof c);
    for (unsigned s = 0; s < 1u << bits; s++)
        for (int k = 0, n = hist[s] ? binarize(&sh, s, ctx, bit) : 0; k < n; k++)
            c[ctx[k]][bit[k]] += hist[s];
    double total = 0;
    for (int k = 0; k < CONTEXTS; k++)
        total += kt_bits(c[k][0], c[k][1]);
    return total;
}

/* Histogram of the symbols of src[n] in rows of `row` bytes. */
static void histogram(const uint8_t *src, size_t n, unsigned bits, uint32_t row, uint64_t *hist)
{
    size_t len = row && row < n ? row : n;
    memset(hist, 0, sizeof *hist << bits);
    for (size_t at = 0; at < n; at += len) {
        size_t rl = n - at < len ? n - at : len;
        for (size_t k = 0, ns = row_symbols(rl, bits); k < ns; k++)
            hist[get_symbol(src + at, rl, k * bits, bits)]++;
    }
}

int stz_ac_choose(const uint8_t *src, size_t n, const unsigned (*tries)[3], int ntries)
{
    uint64_t hist[256];
    double best = 0;
    int pick = 0;
    for (int k = 0; k < ntries; k++) {
        if (k == 0 || tries[k][0] != tries[k - 1][0] || tries[k][2] != tries[k - 1][2]) /* the same symbols */
            histogram(src, n, tries[k][0], tries[k][2], hist);
        double b = estimate(hist, tries[k][0], tries[k][1]);
        if (k == 0 || b < best)
            best = b, pick = k;
    }
    return pick;
}

/* ---- decoder ---- */

typedef struct {
    uint32_t range, code;
    const uint8_t *in;
    size_t n, at, over; /* bytes read past the end */
} decoder;

static uint8_t next_byte(decoder *d)
{
    if (d->at < d->n)
        return d->in[d->at++];
    d->over++;
    return 0;
}

static int decode_bit(decoder *d, uint16_t *c)
{
    uint32_t bound = (d->range >> PROB_BITS) * p0(c);
    int bit = d->code >= bound;
    if (bit)
        d->code -= bound, d->range -= bound;
    else
        d->range = bound;
    update(c, bit);
    while (d->range < RANGE_LOW)
        d->range <<= 8, d->code = d->code << 8 | next_byte(d);
    return bit;
}

static unsigned decode_signed(decoder *d, model *m)
{
    if (!decode_bit(d, m->n[CTX_ZERO]))
        return 0;
    int neg = decode_bit(d, m->n[CTX_SIGN]);
    unsigned oct = 0, mag = 1;
    while (oct < m->sh.bits - 1 && decode_bit(d, m->n[CTX_OCTAVE + oct]))
        oct++;
    for (unsigned k = oct; k-- > 0;)
        mag = mag << 1 | (unsigned)decode_bit(d, m->n[CTX_BITS + 8 * oct + k]);
    return (neg ? 0u - mag : mag) & ((1u << m->sh.bits) - 1);
}

static unsigned decode_symbol(decoder *d, model *m)
{
    if (m->sh.sign)
        return decode_signed(d, m);
    unsigned prefix = 0;
    for (unsigned k = 0; k < m->sh.bits; k++)
        prefix = prefix << 1 | (unsigned)decode_bit(d, m->n[context(&m->sh, k, prefix)]);
    return prefix;
}

int stz_ac_decode(const uint8_t *src, size_t stored, uint8_t *dst, size_t n)
{
    static __thread model m;
    size_t k = 1;
    uint64_t row = 0;
    if (stored < 2 || (src[0] & ~PARAM_MASK))
        return -1;
    unsigned bits = (src[0] & 7u) + 1, top = (src[0] >> 3 & 7u) + 1, sign = !!(src[0] & SIGNED_MODEL);
    for (int shift = 0;; shift += 7) { /* at most 5 bytes, a 32-bit value */
        if (k >= stored || shift > 28)
            return -1;
        row |= (uint64_t)(src[k] & 0x7f) << shift;
        if (!(src[k++] & 0x80))
            break;
    }
    if (top > bits || (sign && (top > 1 || bits < 2)) || row > n || row > UINT32_MAX)
        return -1;
    decoder d = {.range = 0xffffffffu, .in = src + k, .n = stored - k};
    for (int i = 0; i < 4; i++)
        d.code = d.code << 8 | next_byte(&d);
    pthread_once(&inverse_once, inverse_init);
    model_init(&m, bits, sign ? 0 : top);
    memset(dst, 0, n);
    size_t len = row ? (size_t)row : n;
    for (size_t at = 0; at < n; at += len) {
        size_t rl = n - at < len ? n - at : len;
        for (size_t j = 0, ns = row_symbols(rl, bits); j < ns && !d.over; j++)
            put_symbol(dst + at, rl, j * bits, bits, decode_symbol(&d, &m));
    }
    return d.over || d.at != d.n ? -1 : 0;
}
