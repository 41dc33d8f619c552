/* The method "trellis" (docs/FORMAT.md, "Trellis codes"): QTIP's bitshift
 * trellis (Tseng et al. 2024) along the columns of a matrix.
 *
 * The rows are cut into segments of STZ_TRELLIS_ROWS (the last one takes
 * the rest, up to twice that). In a segment, each column's codes (B bits a
 * row, stored where int-B codes are) are one circular stream: the state of
 * row t is the L = 12 bits of the codes of rows t - k + 1 .. t (k = L / B,
 * the earliest highest, rows counted around the segment), and the value
 * of row t is code(state) / 256 times the row's block scale, code() being
 * QTIP's "1mad": the sum of the four bytes of 34038481 s + 76625530
 * (mod 2^32), less 510, an integer in [-510, 510] spread like a Gaussian
 * (over 256 exactly, and the scales of a block's size: F16 holds them).
 *
 * Viterbi finds the stream nearest a column. A circular stream costs
 * exactly B bits a row; QTIP's way to it: the free path of the column
 * rotated by half gives the state where the column ends, and the path
 * that starts and ends on that state's low L - B bits is the stream. Each
 * value then depends on k rows' codes, so error feedback (feedback.c)
 * quantizes a whole column of a segment at a time, and pushes its errors
 * onto the columns after it. */
#include "quant_tensor.h"
#include "stz_kernels.h"
#include "core/stz_core.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define TR_STATES  (1u << STZ_TRELLIS_L)
#define TR_ALPHA   1.0f       /* a block's scale: its RMS times this, over the code's standard deviation */
#define TR_CODE_SD 0.5773480f /* sqrt(4 (256^2 - 1) / 12) / 256: the standard deviation of code() / 256 */

int stz_trellis_code(uint32_t s)
{
    uint32_t x = s * 34038481u + 76625530u;
    return (int)((x & 255) + (x >> 8 & 255) + (x >> 16 & 255) + (x >> 24)) - 510;
}

int stz_trellis_fits(int bits, uint64_t rows)
{
    return bits >= 2 && bits <= 4 && rows >= (uint64_t)(STZ_TRELLIS_L / bits);
}

size_t stz_trellis_segments(uint64_t rows) { return rows / STZ_TRELLIS_ROWS ? (size_t)(rows / STZ_TRELLIS_ROWS) : 1; }

void stz_trellis_segment(uint64_t rows, uint64_t r, uint64_t *begin, uint64_t *end)
{
    size_t n = stz_trellis_segments(rows), i = r / STZ_TRELLIS_ROWS < n ? (size_t)(r / STZ_TRELLIS_ROWS) : n - 1;
    *begin = (uint64_t)i * STZ_TRELLIS_ROWS;
    *end = i + 1 == n ? rows : *begin + STZ_TRELLIS_ROWS;
}

struct stz_trellis_work {
    float value[TR_STATES]; /* code() of each state */
    float cost[TR_STATES], next[TR_STATES], best[TR_STATES], err[TR_STATES];
    uint8_t *back;   /* per row and state kept: the dropped bits of the best predecessor */
    uint16_t *state; /* the path */
    float *xr, *sr;  /* the column rotated */
};

stz_trellis_work *stz_trellis_work_new(void)
{
    stz_trellis_work *w = malloc(sizeof *w);
    size_t n = 2 * STZ_TRELLIS_ROWS;
    if (w) {
        w->back = malloc(n * (TR_STATES >> 2)), w->state = malloc(n * sizeof *w->state);
        w->xr = malloc(2 * n * sizeof *w->xr), w->sr = w->xr ? w->xr + n : NULL;
    }
    if (!w || !w->back || !w->state || !w->xr) {
        stz_trellis_work_free(w);
        return NULL;
    }
    for (uint32_t s = 0; s < TR_STATES; s++)
        w->value[s] = (float)stz_trellis_code(s) / 256.0f;
    return w;
}

void stz_trellis_work_free(stz_trellis_work *w)
{
    if (w)
        free(w->back), free(w->state), free(w->xr);
    free(w);
}

/* viterbi for a constant `bits`, so that every loop vectorises: the best
 * predecessor of each kept part of a state (min over the dropped high
 * bits), then each state's squared error added. */
static inline __attribute__((always_inline)) void viterbi_k(stz_trellis_work *w, const int bits, const float *x,
                                                            const float *sc, size_t n, long tail)
{
    enum { S = TR_STATES };
    const uint32_t keep = S >> bits, fan = 1u << bits;
    float *cost = w->cost, *next = w->next, *m = w->best, *e = w->err;
    for (uint32_t s = 0; s < S; s++) {
        float d = x[0] - sc[0] * w->value[s];
        cost[s] = tail < 0 || (long)(s >> bits) == tail ? d * d : FLT_MAX;
    }
    for (size_t t = 1; t < n; t++) {
        uint8_t *bk = w->back + t * keep;
        memcpy(m, cost, keep * sizeof *m), memset(bk, 0, keep);
        for (uint32_t h = 1; h < fan; h++)
            for (uint32_t lo = 0; lo < keep; lo++) {
                float c = cost[h * keep + lo];
                bk[lo] = c < m[lo] ? (uint8_t)h : bk[lo];
                m[lo] = c < m[lo] ? c : m[lo];
            }
        float xt = x[t], a = sc[t];
        for (uint32_t s = 0; s < S; s++) {
            float d = xt - a * w->value[s];
            e[s] = d * d;
        }
        for (uint32_t lo = 0; lo < keep; lo++)
            for (uint32_t j = 0; j < fan; j++)
                next[lo * fan + j] = m[lo] + e[lo * fan + j];
        float *sw = cost;
        cost = next, next = sw;
    }
    uint32_t end = 0;
    float bestc = FLT_MAX;
    for (uint32_t s = 0; s < S; s++)
        if ((tail < 0 || (long)(s & (keep - 1)) == tail) && cost[s] < bestc)
            bestc = cost[s], end = s;
    w->state[n - 1] = (uint16_t)end;
    for (size_t t = n - 1; t > 0; t--) {
        uint32_t lo = w->state[t] >> bits;
        w->state[t - 1] = (uint16_t)(w->back[t * keep + lo] * keep + lo);
    }
}

#if STZ_X86_CLONES
#define TR_CLONES STZ_CLONES("arch=x86-64-v4", "avx2", "default")
#else
#define TR_CLONES
#endif

/* The states of the path nearest x[0..n) (row t's values sc[t] times
 * code() / 256), into w->state. tail < 0: any start and end; else the
 * first state's high L - B bits and the last state's low ones are tail. */
TR_CLONES static void viterbi(stz_trellis_work *w, int bits, const float *x, const float *sc, size_t n, long tail)
{
    if (bits == 2)
        viterbi_k(w, 2, x, sc, n, tail);
    else if (bits == 3)
        viterbi_k(w, 3, x, sc, n, tail);
    else
        viterbi_k(w, 4, x, sc, n, tail);
}

void stz_trellis_column(stz_trellis_work *w, int bits, const float *x, const float *sc, size_t n, uint8_t *codes,
                        float *y)
{
    size_t h = n / 2;
    for (size_t t = 0; t < n; t++)
        w->xr[t] = x[(t + h) % n], w->sr[t] = sc[(t + h) % n];
    viterbi(w, bits, w->xr, w->sr, n, -1);
    long tail = (long)(w->state[n - 1 - h] & ((TR_STATES >> bits) - 1));
    viterbi(w, bits, x, sc, n, tail);
    for (size_t t = 0; t < n; t++)
        codes[t] = (uint8_t)(w->state[t] & ((1u << bits) - 1)), y[t] = sc[t] * w->value[w->state[t]];
}

float stz_trellis_scale(const stz_qformat *f, const float *x, size_t len)
{
    double ss = 0;
    for (size_t i = 0; i < len; i++)
        ss += (double)x[i] * x[i];
    return stz_qf_store_scale(f, (float)(sqrt(ss / (double)(len ? len : 1)) * TR_ALPHA / TR_CODE_SD));
}

/* Shifts row r's codes (q holds rows from q0) into each column's state. */
static void shift_in(int bits, const uint8_t *q, uint64_t q0, uint64_t r, size_t cols, uint8_t *c, uint16_t *st)
{
    stz_qf_unpack_codes(bits, q + (r - q0) * stz_qf_row_bytes(bits, cols), cols, c);
    for (size_t x = 0; x < cols; x++)
        st[x] = (uint16_t)((st[x] << bits | c[x]) & (TR_STATES - 1));
}

int stz_trellis_dequantize_rows(const stz_qformat *f, const uint8_t *q, uint64_t q0, uint64_t rows, uint64_t r0,
                                size_t nr, const float *scales, size_t cols, float *y)
{
    int bits = f->bits, k = STZ_TRELLIS_L / bits;
    size_t nb = stz_q_blocks(cols, f->block);
    uint8_t *c = malloc(cols + 1);
    uint16_t *st = malloc(cols * sizeof *st + 1);
    if (!c || !st) {
        free(c), free(st);
        return -1;
    }
    for (size_t i = 0; i < nr; i++) {
        uint64_t r = r0 + i, a, b;
        stz_trellis_segment(rows, r, &a, &b);
        if (i == 0 || r == a) { /* a run starts: the states of rows r - k + 1 .. r - 1, around the segment */
            memset(st, 0, cols * sizeof *st);
            for (uint64_t j = (uint64_t)k - 1; j >= 1; j--)
                shift_in(bits, q, q0, a + (r - a + j * (b - a - 1)) % (b - a), cols, c, st);
        }
        shift_in(bits, q, q0, r, cols, c, st);
        const float *s = scales + i * nb;
        for (size_t x = 0; x < cols; x++)
            y[i * cols + x] = (float)stz_trellis_code(st[x]) / 256.0f * s[x / f->block];
    }
    free(c), free(st);
    return 0;
}
