/* Plane codecs: raw, constant, Huffman-only zstd frames, full zstd frames,
 * and (ac_codec.c) the adaptive range coder. */
#include "pack_internal.h"
#include "core/stz_math.h"

#include <math.h>
#define XXH_STATIC_LINKING_ONLY /* XXH3_state_t on the stack */
#include <xxhash.h>
#include <stdlib.h>
#include <string.h>

static const char *const codec_names[STZ_CODEC_COUNT] = {"raw", "const", "huf", "zstd", "ac"};
const char *stz_codec_name(stz_codec c) { return (unsigned)c < STZ_CODEC_COUNT ? codec_names[c] : "?"; }

uint64_t stz_pack_digest(uint64_t header_hash, const uint64_t *chunk_hashes, size_t n)
{
    XXH3_state_t st;
    uint8_t le[8];
    XXH3_64bits_reset(&st);
    stz_put_le64(le, header_hash);
    XXH3_64bits_update(&st, le, 8);
    for (size_t i = 0; i < n; i++) {
        stz_put_le64(le, chunk_hashes[i]);
        XXH3_64bits_update(&st, le, 8);
    }
    return XXH3_64bits_digest(&st);
}

/* Four interleaved tables avoid stalls on runs of the same byte. */
double stz_entropy8(const uint8_t *src, size_t n, uint64_t hist[256])
{
    uint32_t h[4][256];
    memset(h, 0, sizeof h);
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        h[0][src[i]]++;
        h[1][src[i + 1]]++;
        h[2][src[i + 2]]++;
        h[3][src[i + 3]]++;
    }
    for (; i < n; i++)
        h[0][src[i]]++;
    double bits = 0;
    for (int s = 0; s < 256; s++) {
        uint64_t c = (uint64_t)h[0][s] + h[1][s] + h[2][s] + h[3][s];
        hist[s] = c;
        if (c)
            bits -= (double)c * stz_log2((double)c / (double)n);
    }
    return n ? bits / (double)n : 0;
}

stz_status stz_plane_enc_init(stz_plane_enc *e, stz_err *err)
{
    memset(e, 0, sizeof *e);
    e->huf = ZSTD_createCCtx();
    e->full = ZSTD_createCCtx();
    if (!e->huf || !e->full) {
        stz_plane_enc_free(e);
        return stz_err_set(err, STZ_E_NOMEM, "out of memory for zstd contexts");
    }
    /* Literals-only frames: we hand zstd blocks of pure literals, so it
     * spends its time on Huffman coding and none on match finding. */
    ZSTD_CCtx_setParameter(e->huf, ZSTD_c_blockDelimiters, ZSTD_sf_explicitBlockDelimiters);
    ZSTD_CCtx_setParameter(e->huf, ZSTD_c_validateSequences, 0);
    ZSTD_CCtx_setParameter(e->huf, ZSTD_c_literalCompressionMode, ZSTD_ps_enable);
    ZSTD_CCtx_setParameter(e->huf, ZSTD_c_compressionLevel, 1);
    return STZ_OK;
}

void stz_plane_enc_free(stz_plane_enc *e)
{
    ZSTD_freeCCtx(e->huf);
    ZSTD_freeCCtx(e->full);
    free(e->seqs);
    free(e->scratch);
    memset(e, 0, sizeof *e);
}

#define SAMPLE 8192

static int all_equal(const uint8_t *p, size_t n)
{
    uint8_t acc = 0, c = p[0];
    for (size_t i = 0; i < n; i++)
        acc |= (uint8_t)(p[i] ^ c);
    return acc == 0;
}

/* Blocks of at most ZSTD_BLOCKSIZE_MAX literals, ending where each run of
 * seg[nseg] ends (one run of n when nseg is 0). */
static size_t huf_encode(stz_plane_enc *e, const uint8_t *src, size_t n, const size_t *seg, int nseg, uint8_t *dst,
                         size_t cap)
{
    size_t nb = nseg ? (size_t)nseg : 1;
    for (int k = 0; k < nseg; k++)
        nb += seg[k] / ZSTD_BLOCKSIZE_MAX;
    nb += n / ZSTD_BLOCKSIZE_MAX;
    if (nb > e->seq_cap) {
        ZSTD_Sequence *s = realloc(e->seqs, nb * sizeof *s);
        if (!s)
            return (size_t)-1;
        e->seqs = s;
        e->seq_cap = nb;
    }
    size_t b = 0;
    for (int k = 0; k < (nseg ? nseg : 1); k++)
        for (size_t left = nseg ? seg[k] : n; left;) {
            size_t len = left < ZSTD_BLOCKSIZE_MAX ? left : ZSTD_BLOCKSIZE_MAX;
            e->seqs[b++] = (ZSTD_Sequence){.offset = 0, .litLength = (unsigned)len, .matchLength = 0, .rep = 0};
            left -= len;
        }
    /* zstd stores a block's literals raw unless Huffman saves 1/64 of them
     * (1/256 from strategy btultra2 on); small planes, 4-bit codes say, often
     * save 2-3% after their table: let them, at a cost too small to see.
     * Large planes keep level 1's rule, which costs less CPU. */
    ZSTD_CCtx_setParameter(e->huf, ZSTD_c_strategy, b == 1 ? ZSTD_btultra2 : 0);
    return ZSTD_compressSequences(e->huf, dst, cap, e->seqs, b, src, n);
}

/* Codec 4 where smaller than *stored, with the model estimated to code
 * the plane smallest: bytes as bytes (a tree over their 8 bits, or as
 * signed numbers) or as nibbles, or the hint's B-bit codes in their rows
 * (the only one for bytes that look `uniform`: stz's 3-bit codes look
 * random as bytes). Scratch holds ZSTD_compressBound(n) bytes. */
static void try_ac(stz_plane_enc *e, const uint8_t *src, size_t n, size_t cap, int uniform, uint8_t *dst,
                   stz_codec *codec, size_t *stored)
{
    unsigned b = e->hint.bits;
    const unsigned tries[4][3] = {{8, 8, 0}, {8, 0, 0}, {4, 4, 0}, {b, b, e->hint.row}};
    int from = uniform ? 3 : 0, to = b && b < 8 && b != 4 ? 4 : 3;
    if (from >= to)
        return;
    const unsigned *t = tries[from + stz_ac_choose(src, n, tries + from, to - from)];
    size_t r = stz_ac_encode(src, n, t[0], t[1], t[2], e->scratch, cap);
    if (r && r < *stored) {
        *codec = STZ_CODEC_AC, *stored = r;
        memcpy(dst, e->scratch, r);
    }
}

stz_status stz_plane_encode(stz_plane_enc *e, int try_zstd, const uint8_t *src, size_t n, uint8_t *dst, size_t cap,
                            stz_codec *codec, size_t *stored, stz_err *err)
{
    return stz_plane_encode_runs(e, try_zstd, src, n, NULL, 0, dst, cap, codec, stored, err);
}

stz_status stz_plane_encode_runs(stz_plane_enc *e, int try_zstd, const uint8_t *src, size_t n, const size_t *seg,
                                 int nseg, uint8_t *dst, size_t cap, stz_codec *codec, size_t *stored, stz_err *err)
{
    *codec = STZ_CODEC_RAW;
    *stored = n;
    if (cap < n)
        return stz_err_set(err, STZ_E_BOUNDS, "plane of %zu bytes, room for %zu", n, cap);
    if (n == 0)
        return STZ_OK;
    /* Decide from an evenly spread sample: a full histogram would cost as
     * much as the Huffman coder's own. */
    uint8_t sample[SAMPLE];
    size_t ns = n < SAMPLE ? n : SAMPLE;
    for (size_t i = 0; i < ns; i++)
        sample[i] = src[(uint64_t)i * n / ns];
    uint64_t hist[256];
    double h = stz_entropy8(sample, ns, hist);
    if (hist[src[0]] == ns && all_equal(src, n)) {
        *codec = STZ_CODEC_CONST;
        *stored = 1;
        dst[0] = src[0];
        return STZ_OK;
    }
    /* Near-uniform bytes (mantissas) cannot shrink by 1%: store them.
     * Trials go to scratch space of full size; the smallest is kept. */
    size_t bound = ZSTD_compressBound(n);
    if ((h < 7.9 || try_zstd || e->hint.ac) && bound > e->scratch_cap) {
        uint8_t *sc = realloc(e->scratch, bound);
        if (!sc)
            return stz_err_set(err, STZ_E_NOMEM, "out of memory for a %zu-byte plane", n);
        e->scratch = sc;
        e->scratch_cap = bound;
    }
    if (h < 7.9) {
        size_t r = huf_encode(e, src, n, seg, nseg, e->scratch, bound);
        if (ZSTD_isError(r))
            return stz_err_set(err, STZ_E_IO, "zstd literal coding failed: %s", ZSTD_getErrorName(r));
        if (r < *stored) {
            *codec = STZ_CODEC_HUF, *stored = r;
            memcpy(dst, e->scratch, r);
        }
    }
    if (try_zstd) {
        ZSTD_CCtx_setParameter(e->full, ZSTD_c_compressionLevel, try_zstd);
        size_t r = ZSTD_compress2(e->full, e->scratch, bound, src, n);
        if (ZSTD_isError(r))
            return stz_err_set(err, STZ_E_IO, "zstd compression failed: %s", ZSTD_getErrorName(r));
        if (r < *stored) {
            *codec = STZ_CODEC_ZSTD, *stored = r;
            memcpy(dst, e->scratch, r);
        }
    }
    if (e->hint.ac && n <= STZ_AC_MAX)
        try_ac(e, src, n, bound, h >= 7.9, dst, codec, stored);
    if (*codec == STZ_CODEC_RAW)
        memcpy(dst, src, n);
    return STZ_OK;
}

stz_status stz_plane_decode(ZSTD_DCtx *d, stz_codec codec, const uint8_t *src, size_t stored, uint8_t *dst, size_t n,
                            stz_err *err)
{
    switch (codec) {
    case STZ_CODEC_RAW:
        if (stored != n)
            return stz_err_set(err, STZ_E_FORMAT, "raw plane of %zu bytes stored as %zu", n, stored);
        memcpy(dst, src, n);
        return STZ_OK;
    case STZ_CODEC_CONST:
        if (stored != 1)
            return stz_err_set(err, STZ_E_FORMAT, "constant plane stored as %zu bytes, not 1", stored);
        memset(dst, src[0], n);
        return STZ_OK;
    case STZ_CODEC_HUF:
    case STZ_CODEC_ZSTD: {
        unsigned long long fcs = ZSTD_getFrameContentSize(src, stored);
        if (fcs != n)
            return stz_err_set(err, STZ_E_FORMAT, "zstd frame declares %lld bytes, plane has %zu",
                               fcs >= ZSTD_CONTENTSIZE_ERROR ? -1LL : (long long)fcs, n);
        size_t r = ZSTD_decompressDCtx(d, dst, n, src, stored);
        if (ZSTD_isError(r))
            return stz_err_set(err, STZ_E_FORMAT, "zstd frame does not decode: %s", ZSTD_getErrorName(r));
        if (r != n)
            return stz_err_set(err, STZ_E_FORMAT, "zstd frame decodes to %zu bytes, plane has %zu", r, n);
        return STZ_OK;
    }
    case STZ_CODEC_AC:
        if (stz_ac_decode(src, stored, dst, n))
            return stz_err_set(err, STZ_E_FORMAT, "range-coded plane of %zu bytes does not decode to %zu", stored, n);
        return STZ_OK;
    default: return stz_err_set(err, STZ_E_FORMAT, "unknown plane codec %d", (int)codec);
    }
}
