/* Lossless container: plane kernels, byte-identical round trips on hard
 * data, thread-count independence, single-tensor extraction, and rejection
 * of corrupted or truncated containers. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "pack/pack_internal.h"
#include "stz_planes.h"
#include "stz_kernels.h"
#include "quant/ggml_types.h"
#include "core/stz_core.h"
#include "stz_pack.h"
#include "stz_quant.h"
#include "stz_safetensors.h"
#include "test_util.h"

#include <math.h>
#include <zstd.h>

/* plain_xform_*: the plane kernels compiled once more from pack/planes.c
 * for the baseline instruction set only (no AVX2 clone). */
#include "kernel_copies.h"

static uint64_t rng_state = 42;
static uint64_t rnd(void)
{
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return rng_state;
}

/* ---- kernels --------------------------------------------------------- */

/* Every transform, the library's (AVX2 where the machine has it) against
 * the baseline build above, on random bytes of lengths around the vector
 * widths: the same planes, and the same bytes merged back. */
static void test_xform_same_bytes_without_avx2(void **state)
{
    (void)state;
    enum { N = 8 * 1031 };
    static uint8_t src[N], a[8][N], b[8][N], back[N];
    for (size_t i = 0; i < N; i++)
        src[i] = (uint8_t)rnd();
    for (int x = 0; x < STZ_XFORM_GGML; x++) { /* ggml: test_blocks_roundtrip */
        unsigned w = stz_xform_width((stz_xform)x), np = stz_xform_planes((stz_xform)x);
        uint8_t *pa[8], *pb[8];
        for (unsigned k = 0; k < 8; k++)
            pa[k] = a[k], pb[k] = b[k];
        for (size_t m = 1; m * w <= N; m += m < 70 ? 1 : 257) {
            memset(a, 0, sizeof a), memset(b, 0, sizeof b);
            stz_xform_split((stz_xform)x, src, m * w, pa);
            plain_xform_split((stz_xform)x, src, m * w, pb);
            for (unsigned k = 0; k < np; k++)
                assert_memory_equal(a[k], b[k], m);
            plain_xform_merge((stz_xform)x, (const uint8_t *const *)pa, m * w, back);
            assert_memory_equal(back, src, m * w);
            stz_xform_merge((stz_xform)x, (const uint8_t *const *)pb, m * w, back);
            assert_memory_equal(back, src, m * w);
        }
    }
}

static void test_xform_layouts(void **state)
{
    (void)state;
    uint8_t src[4], e[2], sm[2], *p[4] = {e, sm};
    stz_put_le16(src, 0xbf80);     /* -1.0 in BF16 */
    stz_put_le16(src + 2, 0x4049); /* 3.14 */
    stz_xform_split(STZ_XFORM_BF16, src, 4, p);
    assert_int_equal(e[0], 0x7f);
    assert_int_equal(sm[0], 0x80);
    assert_int_equal(e[1], 0x80);
    assert_int_equal(sm[1], 0x49);
    uint8_t f[4], a[1], b[1], c[1], d[1], *q[4] = {a, b, c, d};
    stz_put_le32(f, 0xc0490fdb); /* -pi in F32 */
    stz_xform_split(STZ_XFORM_F32, f, 4, q);
    assert_int_equal(a[0], 0x80);
    assert_int_equal(b[0], 0x80 | 0x49);
    assert_int_equal(c[0], 0x0f);
    assert_int_equal(d[0], 0xdb);
    uint8_t h[2], *r[3] = {a, b, c};
    stz_put_le16(h, 0xbe48); /* -1.5703 in F16: sign 1, exp 0x0f, mantissa 0x248 */
    stz_xform_split(STZ_XFORM_F16, h, 2, r);
    assert_int_equal(a[0], 0x0f);
    assert_int_equal(b[0], 0x4 | 0x2);
    assert_int_equal(c[0], 0x48);
    assert_int_equal(stz_xform_for_dtype(STZ_DTYPE_C64), STZ_XFORM_F32);
    assert_int_equal(stz_xform_for_dtype(STZ_DTYPE_F4), STZ_XFORM_NONE);
}

/* The ggml block transform: every type it knows, random bytes (any bit
 * pattern, so every field and code bit is covered), chunks starting at
 * every place inside a block and of lengths around whole blocks: the
 * planes give back the bytes. */
static const int block_types[] = {2, 3, 6, 7, 8, 10, 11, 12, 13, 14, 20, 23};

static void test_blocks_roundtrip(void **state)
{
    (void)state;
    enum { N = 3 * 210 + 7 };
    static uint8_t src[N], planes[2 * N + 512], back[N];
    size_t regrouped = 0; /* chunks whose codes span several classes */
    for (size_t t = 0; t < sizeof block_types / sizeof *block_types; t++) {
        int type = block_types[t];
        uint32_t bs = stz_ggml_traits_of(type)->bytes, raw[STZ_MAX_PLANES];
        assert_int_equal(stz_blocks_planes(type, bs, 10, raw), 0); /* a phase outside the block */
        for (uint32_t phase = 0; phase < bs; phase += phase < 3 ? 1 : 5)
            for (size_t n = 0; n <= N; n += n < 2 * bs + 3 ? 1 : 97) {
                for (size_t i = 0; i < n; i++)
                    src[i] = (uint8_t)rnd();
                int np = stz_blocks_planes(type, phase, n, raw);
                assert_true(np >= 2 && np <= STZ_MAX_PLANES);
                uint8_t *p[STZ_MAX_PLANES], *at = planes;
                size_t total = 0;
                for (int k = 0; k < np; k++)
                    p[k] = at, at += raw[k], total += raw[k];
                assert_true(total <= stz_planes_bound(n < 65536 ? 65536 : n));
                size_t runs[STZ_BLOCK_RUNS], sum = 0, used = 0;
                int nr = stz_blocks_split(type, phase, src, n, p, runs);
                assert_int_equal(nr, type == 12 || type == 13 || type == 14 ? STZ_BLOCK_RUNS : 0);
                for (int k = 0; k < nr; k++)
                    sum += runs[k], used += runs[k] > 0;
                if (nr) /* the codes plane, by class */
                    assert_true(sum == raw[np - 2]);
                regrouped += used > 1;
                memset(back, 0xA5, sizeof back);
                stz_blocks_merge(type, phase, (const uint8_t *const *)p, n, back);
                if (n && memcmp(src, back, n))
                    fail_msg("ggml type %d, phase %u, %zu bytes: merge(split(x)) != x", type, phase, n);
            }
    }
    assert_true(regrouped > 100);
}

/* The codes plane of the 5- and 6-bit types holds each element's whole
 * code in element order (Q4_K: two to a byte, the first in the low nibble):
 * with scale 1 (and no minimum, so that every sub-block is in class 0 and
 * the grouping keeps block order) llama.cpp's own dequantizer (written from
 * ggml-common.h, quant/) gives code - offset. */
static void test_blocks_codes_in_element_order(void **state)
{
    (void)state;
    static const struct {
        int type;
        uint32_t n;
        int offset;
    } cases[] = {{6, 32, 16}, {7, 32, 0}, {12, 256, 0}, {13, 256, 0}, {14, 256, 32}};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        const stz_ggml_traits *tr = stz_ggml_traits_of(cases[c].type);
        uint8_t blk[256], planes[1024], *p[STZ_MAX_PLANES];
        uint32_t raw[STZ_MAX_PLANES];
        for (uint32_t i = 0; i < tr->bytes; i++)
            blk[i] = (uint8_t)rnd();
        switch (cases[c].type) {
        case 6: stz_put_le16(blk, 0x3C00); break;                           /* d = 1 */
        case 7: stz_put_le16(blk, 0x3C00), stz_put_le16(blk + 2, 0); break; /* d = 1, m = 0 */
        case 12:
        case 13:                                                 /* d = 1, dmin = 0, */
            stz_put_le16(blk, 0x3C00), stz_put_le16(blk + 2, 0); /* 6-bit scales 1, mins 0 */
            memset(blk + 4, 1, 4), memset(blk + 8, 0, 4), memset(blk + 12, 1, 4);
            break;
        default: memset(blk + 192, 1, 16), stz_put_le16(blk + 208, 0x3C00); break; /* scales 1, d = 1 */
        }
        int np = stz_blocks_planes(cases[c].type, 0, tr->bytes, raw);
        uint8_t *at = planes;
        for (int k = 0; k < np; k++)
            p[k] = at, at += raw[k];
        size_t runs[STZ_BLOCK_RUNS];
        stz_blocks_split(cases[c].type, 0, blk, tr->bytes, p, runs);
        const uint8_t *codes = p[np - 2];
        int pairs = cases[c].type == 12;
        assert_int_equal(raw[np - 2], cases[c].n >> pairs);
        float y[256];
        tr->dequantize_ref(blk, cases[c].n, y);
        for (uint32_t j = 0; j < cases[c].n; j++) {
            int code = pairs ? codes[j / 2] >> (4 * (j % 2)) & 15 : codes[j];
            if (y[j] != (float)(code - cases[c].offset))
                fail_msg("%s element %u: ggml gives %g, the codes plane %d", tr->name, j, (double)y[j],
                         code - cases[c].offset);
        }
    }
}

static void test_xform_roundtrip_odd_lengths(void **state)
{
    (void)state;
    static const size_t lens[] = {0, 1, 2, 3, 5, 7, 15, 16, 17, 31, 33, 127, 255, 257, 1023, 4099};
    for (int x = 0; x < STZ_XFORM_GGML; x++) { /* ggml: test_blocks_roundtrip */
        unsigned w = stz_xform_width((stz_xform)x), np = stz_xform_planes((stz_xform)x);
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
            size_t n = lens[li] * w;
            uint8_t *src = malloc(n + 1), *dst = malloc(n + 1), *pl = malloc(np * lens[li] + 1), *p[STZ_MAX_PLANES];
            for (size_t i = 0; i < n; i++)
                src[i] = (uint8_t)rnd();
            for (unsigned k = 0; k < np; k++)
                p[k] = pl + k * lens[li];
            stz_xform_split((stz_xform)x, src, n, p);
            stz_xform_merge((stz_xform)x, (const uint8_t *const *)p, n, dst);
            if (n && memcmp(src, dst, n))
                fail_msg("xform %s, %zu elements: merge(split(x)) != x", stz_xform_name((stz_xform)x), lens[li]);
            free(src), free(dst), free(pl);
        }
    }
}

/* ---- round trips ----------------------------------------------------- */

typedef struct {
    char *dir;
} fixture;

static int setup(void **state)
{
    fixture *f = calloc(1, sizeof *f);
    f->dir = tu_tmpdir();
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fixture *f = *state;
    tu_rmdir(f->dir);
    free(f);
    return 0;
}

/* Packs `in` with the given settings, unpacks, and checks the bytes. Returns
 * the container's size. */
static uint64_t roundtrip(const char *dir, const char *in, int threads, stz_pack_level level, uint32_t chunk)
{
    char *pk = tu_path(dir, "rt.stz"), *back = tu_path(dir, "rt.back");
    stz_pack_params p = STZ_PACK_PARAMS_DEFAULT;
    p.threads = threads, p.level = level, p.chunk_size = chunk, p.write_flags = STZ_WRITE_FORCE;
    stz_pack_stats st;
    stz_err err;
    if (stz_pack_file(&p, in, pk, &st, &err))
        fail_msg("pack %s: %s", in, err.msg);
    stz_unpack_params u = STZ_UNPACK_PARAMS_DEFAULT;
    u.threads = threads, u.write_flags = STZ_WRITE_FORCE;
    if (stz_verify_file(&u, pk, &err))
        fail_msg("verify %s: %s", in, err.msg);
    if (stz_unpack_file(&u, pk, back, &err))
        fail_msg("unpack %s: %s", in, err.msg);
    if (tu_hash_file(in) != tu_hash_file(back))
        fail_msg("%s: unpacked bytes differ from the original", in);
    struct stat sb;
    stat(pk, &sb);
    assert_int_equal((uint64_t)sb.st_size, st.out_bytes);
    unlink(back);
    free(pk), free(back);
    return st.out_bytes;
}

typedef enum { FILL_RANDOM, FILL_ZERO, FILL_CONST, FILL_SPECIAL, FILL_WEIGHTS } fill_kind;

/* Writes one tensor per (dtype, size) with the given fill. */
static void write_file(const char *path, const stz_dtype *dts, size_t ndt, const uint64_t *sizes, size_t nsz,
                       fill_kind fill)
{
    stz_writer *w;
    stz_err err;
    assert_int_equal(stz_writer_open(&w, path, STZ_WRITE_FORCE, &err), STZ_OK);
    stz_writer_set_meta(w, "note", "pack test ✓", &err);
    char name[64];
    for (size_t d = 0; d < ndt; d++)
        for (size_t s = 0; s < nsz; s++) {
            snprintf(name, sizeof name, "%s.%zu", stz_dtype_name(dts[d]), s);
            uint64_t numel = sizes[s] * (stz_dtype_bits(dts[d]) < 8 ? 8 / 2 : 1) * 2 / 2;
            if (stz_dtype_bits(dts[d]) == 6)
                numel = sizes[s] * 4;
            assert_int_equal(stz_writer_add(w, name, dts[d], 1, &numel, &err), STZ_OK);
        }
    uint64_t left = stz_writer_remaining(w), k = 0;
    uint8_t buf[4096];
    while (left) {
        size_t m = left < sizeof buf ? (size_t)left : sizeof buf;
        for (size_t i = 0; i < m; i++, k++) {
            switch (fill) {
            case FILL_RANDOM: buf[i] = (uint8_t)rnd(); break;
            case FILL_ZERO: buf[i] = 0; break;
            case FILL_CONST: buf[i] = 0x3c; break;
            case FILL_SPECIAL: { /* NaN, Inf, -0, denormals as 16- and 32-bit patterns */
                static const uint8_t pat[] = {0x00, 0x7f, 0xc0, 0x7f, 0x80, 0x7f, 0x80, 0xff, 0x00, 0x80,
                                              0x01, 0x00, 0xff, 0x7f, 0x01, 0x80, 0x00, 0x00, 0xc0, 0xff};
                buf[i] = pat[k % sizeof pat];
                break;
            }
            case FILL_WEIGHTS: /* BF16-like: exponents near 0x79, random mantissas */
                buf[i] = (k & 1) ? (uint8_t)(0x3c + (rnd() % 3) + ((rnd() & 1) << 7)) : (uint8_t)rnd();
                break;
            }
        }
        assert_int_equal(stz_writer_write(w, buf, m, &err), STZ_OK);
        left -= m;
    }
    assert_int_equal(stz_writer_finish(w, &err), STZ_OK);
    stz_writer_free(w);
}

static void test_roundtrip_dtypes_and_sizes(void **state)
{
    fixture *f = *state;
    char *in = tu_path(f->dir, "in.safetensors");
    stz_dtype all[STZ_DTYPE_COUNT];
    for (int d = 0; d < STZ_DTYPE_COUNT; d++)
        all[d] = (stz_dtype)d;
    /* element counts around the 64 KiB chunk for 1-, 2-, 4- and 8-byte types */
    static const uint64_t sizes[] = {0,    1,     2,     3,     7,     1023,  8191,  8192,
                                     8193, 16383, 16384, 16385, 32769, 65535, 65536, 65537};
    fill_kind fills[] = {FILL_RANDOM, FILL_ZERO, FILL_CONST, FILL_SPECIAL, FILL_WEIGHTS};
    for (size_t fi = 0; fi < sizeof fills / sizeof fills[0]; fi++) {
        write_file(in, all, STZ_DTYPE_COUNT, sizes, sizeof sizes / sizeof sizes[0], fills[fi]);
        roundtrip(f->dir, in, 1 + (int)(fi % 3), STZ_PACK_FAST, STZ_PACK_MIN_CHUNK);
    }
    /* best level on one of them */
    write_file(in, all, 6, sizes, 8, FILL_WEIGHTS);
    roundtrip(f->dir, in, 2, STZ_PACK_BEST, STZ_PACK_MIN_CHUNK);
    unlink(in);
    free(in);
}

static void test_roundtrip_corpus(void **state)
{
    fixture *f = *state;
    static const char *good[] = {"good_minimal",         "good_padded",    "good_pretty",
                                 "good_empty",           "good_meta_only", "good_scalar_and_empty",
                                 "good_unsorted_header", "good_subbyte",   "good_null_metadata"};
    char name[128];
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        snprintf(name, sizeof name, "%s/%s.safetensors", STZ_CORPUS_DIR, good[i]);
        roundtrip(f->dir, name, 2, STZ_PACK_FAST, 1u << 20);
    }
}

/* The shared real weights, when they are there: issue targets 1.504x on
 * the BF16 file (its small tensors get the LZ trial), 1.18x on F32. */
static void test_roundtrip_shared(void **state)
{
    fixture *f = *state;
    static const char *shared[] = {"stories260K.bf16.safetensors", "stories260K.f32.safetensors"};
    for (int i = 0; i < 2; i++) {
        char *p = tu_path(STZ_SHARED_DATA_DIR, shared[i]);
        if (!tu_exists(p)) {
            printf("skip: %s is not there\n", p);
            free(p);
            skip();
        }
        struct stat sb;
        stat(p, &sb);
        uint64_t out = roundtrip(f->dir, p, 2, STZ_PACK_FAST, 1u << 20);
        double ratio = (double)sb.st_size / (double)out;
        assert_true(ratio >= (i == 0 ? 1.504 : 1.18));
        free(p);
    }
}

static void test_same_bytes_any_threads(void **state)
{
    fixture *f = *state;
    char *in = tu_path(f->dir, "in.safetensors"), *a = tu_path(f->dir, "a.stz"), *b = tu_path(f->dir, "b.stz");
    stz_dtype dts[] = {STZ_DTYPE_BF16, STZ_DTYPE_F32, STZ_DTYPE_I8};
    static const uint64_t sizes[] = {100003, 70001, 3};
    write_file(in, dts, 3, sizes, 3, FILL_WEIGHTS);
    stz_pack_params p = STZ_PACK_PARAMS_DEFAULT;
    p.chunk_size = STZ_PACK_MIN_CHUNK;
    stz_err err;
    if (stz_pack_file(&p, in, a, NULL, &err))
        fail_msg("%s", err.msg);
    p.threads = 3;
    assert_int_equal(stz_pack_file(&p, in, b, NULL, &err), STZ_OK);
    assert_true(tu_hash_file(a) == tu_hash_file(b));
    /* no silent overwrite, never over the input */
    assert_int_equal(stz_pack_file(&p, in, b, NULL, &err), STZ_E_EXISTS);
    p.write_flags = STZ_WRITE_FORCE;
    assert_int_equal(stz_pack_file(&p, in, in, NULL, &err), STZ_E_EXISTS);
    /* input that is not SafeTensors: the reader's error, saying what it is, no output */
    char *junk = tu_path(f->dir, "junk"), *jo = tu_path(f->dir, "junk.stz");
    tu_write(junk, "not a model at all", 18);
    assert_int_equal(stz_pack_file(&p, junk, jo, NULL, &err), STZ_E_FORMAT);
    assert_non_null(strstr(err.msg, "a text file"));
    tu_write(junk, "\xff\xff\xff\xff\xff\xff\xff\xff{}", 10);
    assert_int_equal(stz_pack_file(&p, junk, jo, NULL, &err), STZ_E_HEADER_SIZE);
    assert_false(tu_exists(jo));
    unlink(junk), unlink(in), unlink(a), unlink(b);
    free(junk), free(jo), free(in), free(a), free(b);
}

/* Appends one little-endian F32 value. */
static void write_f32(stz_writer *w, float v)
{
    uint8_t b[4];
    uint32_t u;
    stz_err err;
    memcpy(&u, &v, 4);
    stz_put_le32(b, u);
    assert_int_equal(stz_writer_write(w, b, 4, &err), STZ_OK);
}

static void test_upcast_f32_compresses(void **state)
{
    fixture *f = *state;
    char *in = tu_path(f->dir, "up.safetensors"), *pk = tu_path(f->dir, "up.stz");
    stz_writer *w;
    stz_err err;
    uint64_t n = 1 << 18;
    assert_int_equal(stz_writer_open(&w, in, 0, &err), STZ_OK);
    assert_int_equal(stz_writer_add(w, "w", STZ_DTYPE_F32, 1, &n, &err), STZ_OK);
    for (uint64_t i = 0; i < n; i++) /* BF16-representable values stored as F32 */
        write_f32(w, stz_bf16_to_f32(stz_f32_to_bf16(((float)(rnd() % 20001) - 10000.0f) * 1e-5f)));
    assert_int_equal(stz_writer_finish(w, &err), STZ_OK);
    stz_writer_free(w);
    stz_pack_params p = STZ_PACK_PARAMS_DEFAULT;
    stz_pack_stats st;
    assert_int_equal(stz_pack_file(&p, in, pk, &st, &err), STZ_OK);
    /* the two low mantissa planes are constant: at least half disappears */
    assert_true((double)st.in_bytes / (double)st.out_bytes > 2.0);
    unlink(in), unlink(pk);
    free(in), free(pk);
}

/* The default container of `in` (freed here) is within 1% of zstd -3 on
 * the whole file (chunks are separate frames). */
static void assert_within_zstd(fixture *f, char *in, const char *what)
{
    size_t n;
    uint8_t *raw = tu_read(in, &n);
    size_t cap = ZSTD_compressBound(n);
    uint8_t *z = malloc(cap);
    size_t zs = ZSTD_compress(z, cap, raw, n, 3);
    assert_false(ZSTD_isError(zs));
    uint64_t packed = roundtrip(f->dir, in, 2, STZ_PACK_FAST, 1u << 20);
    printf("%s: %zu bytes, zstd -3 %zu, stz %llu\n", what, n, zs, (unsigned long long)packed);
    assert_true((double)packed <= (double)zs / 0.99);
    free(raw), free(z), free(in);
}

/* Zero-heavy F32 (a mostly-zero table, 50% pruned weights) packs within 1%
 * of plain zstd -3 of the whole file (the plane coder alone: 13% larger),
 * and round-trips exactly. */
static void test_sparse_never_worse_than_zstd(void **state)
{
    fixture *f = *state;
    char *in = tu_path(f->dir, "sparse.safetensors");
    stz_writer *w;
    stz_err err;
    uint64_t s1[2] = {80, 4097}, s2[2] = {512, 512};
    assert_int_equal(stz_writer_open(&w, in, STZ_WRITE_FORCE, &err), STZ_OK);
    assert_int_equal(stz_writer_add(w, "table", STZ_DTYPE_F32, 2, s1, &err), STZ_OK);
    assert_int_equal(stz_writer_add(w, "pruned", STZ_DTYPE_F32, 2, s2, &err), STZ_OK);
    for (int k = 0; k < 2; k++)
        for (uint64_t i = 0; i < (k ? 512u * 512 : 80u * 4097); i++)
            write_f32(w, k ? (rnd() % 2 ? 0.0f : ((float)(rnd() % 20001) - 10000.0f) * 1e-4f)
                           : (i % 4097 < 100 ? (float)(rnd() % 1000) * 1e-3f : 0.0f));
    assert_int_equal(stz_writer_finish(w, &err), STZ_OK);
    stz_writer_free(w);
    assert_within_zstd(f, in, "zero-heavy F32");
}

/* A table whose values come from a small set scattered through the chunk
 * (a DFT basis: cos(2 pi k n / N), N distinct values, no element equal to
 * the one before it), larger than the size under which every chunk tries
 * zstd: the hashed count of repeated words sees it, where a sample
 * comparing neighbours did not (0.77x of zstd -3 before). One table: zstd
 * on the whole file would also match across tensors (a sine table against
 * its cosine), which separate chunks cannot. */
static void test_tables_never_worse_than_zstd(void **state)
{
    fixture *f = *state;
    char *in = tu_path(f->dir, "dft.safetensors");
    stz_writer *w;
    stz_err err;
    uint64_t shape[2] = {257, 512};
    assert_int_equal(stz_writer_open(&w, in, STZ_WRITE_FORCE, &err), STZ_OK);
    assert_int_equal(stz_writer_add(w, "dft_real", STZ_DTYPE_F32, 2, shape, &err), STZ_OK);
    for (uint64_t k = 0; k < shape[0]; k++)
        for (uint64_t j = 0; j < shape[1]; j++)
            write_f32(w, (float)cos(2 * 3.14159265358979323846 * (double)((k * j) % 512) / 512));
    assert_int_equal(stz_writer_finish(w, &err), STZ_OK);
    stz_writer_free(w);
    assert_within_zstd(f, in, "DFT table F32");
}

/* A small tensor of 4-bit nl codes (the levels are used about equally:
 * 3.9 bits of entropy per code) saves well under zstd's 1/64 rule for
 * Huffman-coded literals at level 1, and is Huffman-coded all the same. */
static void test_small_plane_huffman(void **state)
{
    (void)state;
    enum { N = 11008 }; /* 5504 bytes, like a 172 x 64 matrix */
    static float x[N], sc[N / 32];
    static uint8_t q[N / 2], dst[2 * N], back[N / 2];
    rng_state = 42;                /* the same values whatever ran before */
    for (size_t i = 0; i < N; i++) /* between a normal and a Laplace, as trained weights are */
        x[i] = (float)(i % 8 ? (double)(rnd() % 1000) + (double)(rnd() % 1000) + (double)(rnd() % 1000) - 1498.5
                             : 300 * log(((double)(rnd() % 1000000) + 0.5) / 1e6) * (rnd() % 2 ? 1 : -1));
    stz_qformat f = {.bits = 4, .method = STZ_QMETHOD_NL, .block = 32, .scale_dtype = STZ_DTYPE_F32};
    stz_qf_default_levels(4, f.levels);
    stz_qf_prepare(&f);
    assert_int_equal(stz_qf_quantize_row(&f, x, N, q, sc, NULL), 0);
    stz_plane_enc e;
    stz_err err;
    stz_codec codec;
    size_t stored;
    assert_int_equal(stz_plane_enc_init(&e, &err), STZ_OK);
    assert_int_equal(stz_plane_encode(&e, 0, q, sizeof q, dst, sizeof dst, &codec, &stored, &err), STZ_OK);
    stz_plane_enc_free(&e);
    printf("4-bit nl codes: %zu -> %zu bytes\n", sizeof q, stored);
    assert_int_equal(codec, STZ_CODEC_HUF);
    assert_true(stored < sizeof q && stored > sizeof q - sizeof q / 64);
    ZSTD_DCtx *d = ZSTD_createDCtx();
    assert_int_equal(stz_plane_decode(d, codec, dst, stored, back, sizeof back, &err), STZ_OK);
    assert_memory_equal(q, back, sizeof q);
    ZSTD_freeDCtx(d);
}

/* Codec 4 on the same 4-bit codes: no table to store, so smaller than
 * Huffman's frame; as B-bit codes in their rows too. */
static void test_small_plane_ac(void **state)
{
    (void)state;
    enum { N = 5504 };
    static uint8_t q[N], dst[2 * N], back[N];
    rng_state = 7;
    for (size_t i = 0; i < N; i++) /* nibbles peaked at 7 and 8, as nl codes are */
        q[i] = (uint8_t)((7 + rnd() % 5 - rnd() % 4) << 4 | (7 + rnd() % 5 - rnd() % 4));
    stz_plane_enc e;
    stz_err err;
    stz_codec codec;
    size_t huf, ac;
    assert_int_equal(stz_plane_enc_init(&e, &err), STZ_OK);
    assert_int_equal(stz_plane_encode(&e, 0, q, N, dst, sizeof dst, &codec, &huf, &err), STZ_OK);
    assert_int_equal(codec, STZ_CODEC_HUF);
    e.hint = (stz_plane_hint){.ac = 1, .bits = 4, .row = 43};
    assert_int_equal(stz_plane_encode(&e, 0, q, N, dst, sizeof dst, &codec, &ac, &err), STZ_OK);
    stz_plane_enc_free(&e);
    printf("peaked nibbles: Huffman %zu bytes, codec 4 %zu\n", huf, ac);
    assert_int_equal(codec, STZ_CODEC_AC);
    assert_true(ac < huf - huf / 100);
    ZSTD_DCtx *d = ZSTD_createDCtx();
    assert_int_equal(stz_plane_decode(d, codec, dst, ac, back, N, &err), STZ_OK);
    assert_memory_equal(q, back, N);
    ZSTD_freeDCtx(d);
}

/* Every model of codec 4 (B = 1-8 bits, trees of every depth, the signed
 * model) round trips any bytes, in rows of any length; too small an output
 * is 0; a cut, longer or flipped payload decodes to an error or to other
 * bytes, never past its buffers (ASan). */
static void test_ac_roundtrip(void **state)
{
    (void)state;
    static const size_t lens[] = {1, 2, 5, 100, 4097};
    static const uint32_t rows[] = {0, 1, 3, 7, 64};
    static uint8_t src[4097], enc[8192], back[4097];
    rng_state = 11;
    int runs = 0;
    for (int skew = 0; skew < 2; skew++)
        for (size_t l = 0; l < sizeof lens / sizeof *lens; l++)
            for (unsigned bits = 1; bits <= 8; bits++)
                for (unsigned top = 0; top <= bits; top++) {
                    if (top == 0 && bits < 2)
                        continue;
                    size_t n = lens[l];
                    for (size_t i = 0; i < n; i++)
                        src[i] = (uint8_t)(skew ? (rnd() % 4 ? 0x80 + rnd() % 3 : rnd()) : rnd());
                    uint32_t row = rows[(bits + top + l) % 5];
                    size_t r = stz_ac_encode(src, n, bits, top, row, enc, sizeof enc);
                    assert_true(r > 1);
                    memset(back, 0xa5, n);
                    if (stz_ac_decode(enc, r, back, n) || memcmp(src, back, n))
                        fail_msg("bits %u top %u row %u: %zu bytes do not round trip", bits, top, row, n);
                    if (r > 8) /* one byte short: it does not fit */
                        assert_int_equal(stz_ac_encode(src, n, bits, top, row, enc, r - 1), 0);
                    stz_ac_encode(src, n, bits, top, row, enc, sizeof enc);
                    assert_int_not_equal(stz_ac_decode(enc, r - 1, back, n), 0);
                    enc[r] = 0;
                    assert_int_not_equal(stz_ac_decode(enc, r + 1, back, n), 0);
                    enc[r / 2] ^= 0x10;
                    (void)stz_ac_decode(enc, r, back, n);
                    runs++;
                }
    assert_int_equal(runs, 2 * 5 * 43); /* 8 widths, each with trees of depth 1 to B and (B > 1) the signed model */
}

static void test_extract_tensor(void **state)
{
    fixture *f = *state;
    char *in = tu_path(f->dir, "in.safetensors"), *pk = tu_path(f->dir, "x.stz"), *t = tu_path(f->dir, "t.bin");
    stz_dtype dts[] = {STZ_DTYPE_BF16, STZ_DTYPE_U8};
    static const uint64_t sizes[] = {70001, 5, 0};
    write_file(in, dts, 2, sizes, 3, FILL_WEIGHTS);
    stz_pack_params p = STZ_PACK_PARAMS_DEFAULT;
    p.chunk_size = STZ_PACK_MIN_CHUNK;
    stz_err err;
    assert_int_equal(stz_pack_file(&p, in, pk, NULL, &err), STZ_OK);
    stz_reader *r;
    assert_int_equal(stz_reader_open(&r, in, &err), STZ_OK);
    stz_unpack_params u = STZ_UNPACK_PARAMS_DEFAULT;
    u.write_flags = STZ_WRITE_FORCE;
    for (size_t i = 0; i < stz_reader_count(r); i++) {
        const stz_tensor *ti = stz_reader_tensor(r, i);
        assert_int_equal(stz_unpack_tensor(&u, pk, ti->name, t, &err), STZ_OK);
        size_t n;
        uint8_t *got = tu_read(t, &n), *want = malloc(ti->end - ti->begin + 1);
        assert_int_equal(n, ti->end - ti->begin);
        assert_int_equal(stz_reader_read(r, ti, 0, want, n, &err), STZ_OK);
        assert_memory_equal(got, want, n);
        free(got), free(want);
    }
    assert_int_equal(stz_unpack_tensor(&u, pk, "no.such.tensor", t, &err), STZ_E_ARG);
    assert_non_null(strstr(err.msg, "no.such.tensor"));
    /* the container's view of the header */
    stz_container *c;
    assert_int_equal(stz_container_open(&c, pk, &err), STZ_OK);
    assert_int_equal(stz_reader_count(stz_container_header(c)), stz_reader_count(r));
    assert_int_equal(stz_container_original_size(c), stz_reader_file_size(r));
    stz_chunk_planes pl;
    assert_int_equal(stz_container_planes(c, 0, &pl, &err), STZ_OK);
    assert_int_equal(pl.xform, STZ_XFORM_BF16);
    assert_int_equal(pl.nplanes, 2);
    assert_true(pl.codec[0] == STZ_CODEC_HUF || pl.codec[0] == STZ_CODEC_AC); /* exponents: few values */
    assert_int_equal(pl.codec[1], STZ_CODEC_RAW);                             /* sign + random mantissa */
    stz_container_free(c);
    stz_reader_free(r);
    unlink(in), unlink(pk), unlink(t);
    free(in), free(pk), free(t);
}

/* ---- corruption ------------------------------------------------------ */

static int in_set(stz_status s, const stz_status *set, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s == set[i])
            return 1;
    return 0;
}

static void test_corruption_rejected(void **state)
{
    fixture *f = *state;
    char *in = tu_path(f->dir, "in.safetensors"), *pk = tu_path(f->dir, "c.stz"), *bad = tu_path(f->dir, "bad.stz"),
         *out = tu_path(f->dir, "out.safetensors");
    stz_dtype dts[] = {STZ_DTYPE_BF16, STZ_DTYPE_I32};
    static const uint64_t sizes[] = {40000, 9};
    write_file(in, dts, 2, sizes, 2, FILL_WEIGHTS);
    stz_pack_params p = STZ_PACK_PARAMS_DEFAULT;
    p.chunk_size = STZ_PACK_MIN_CHUNK;
    stz_err err;
    assert_int_equal(stz_pack_file(&p, in, pk, NULL, &err), STZ_OK);
    size_t n;
    uint8_t *img = tu_read(pk, &n), *mod = malloc(n);
    stz_unpack_params u = STZ_UNPACK_PARAMS_DEFAULT;
    static const stz_status allowed[] = {STZ_E_CHECKSUM,    STZ_E_FORMAT,      STZ_E_TRUNCATED,
                                         STZ_E_UNSUPPORTED, STZ_E_HEADER_SIZE, STZ_E_JSON,
                                         STZ_E_OFFSETS,     STZ_E_SHAPE,       STZ_E_DTYPE};
    /* every byte flipped in turn (a stride keeps it quick on big files) */
    size_t step = n / 3000 + 1, tried = 0;
    for (size_t i = 0; i < n; i += (i < 200 || i > n - 900) ? 1 : step, tried++) {
        memcpy(mod, img, n);
        mod[i] ^= (uint8_t)(1u << (i % 8));
        tu_write(bad, mod, n);
        stz_status s = stz_unpack_file(&u, bad, out, &err);
        if (s == STZ_OK) {
            /* a flip zstd does not read (a frame flag) may decode the same:
             * fine, as long as the output is exactly the original */
            if (tu_hash_file(out) != tu_hash_file(in))
                fail_msg("flip at byte %zu of %zu: accepted with wrong output", i, n);
            unlink(out);
            continue;
        }
        if (!in_set(s, allowed, sizeof allowed / sizeof allowed[0]))
            fail_msg("flip at byte %zu of %zu: got %s (%s)", i, n, stz_status_name(s), err.msg);
        assert_false(tu_exists(out)); /* no output from a corrupt container */
        assert_true(err.msg[0] != 0);
        assert_int_equal(stz_verify_file(&u, bad, &err), s);
    }
    assert_true(tried > 1000);
    /* every truncation */
    for (size_t cut = 0; cut < n; cut += (cut < 100 || cut > n - 200) ? 1 : step) {
        tu_write(bad, img, cut);
        stz_status s = stz_verify_file(&u, bad, &err);
        if (!in_set(s, allowed, 3))
            fail_msg("cut at %zu of %zu: got %s (%s)", cut, n, stz_status_name(s), err.msg);
    }
    /* a payload flip is a checksum or format error that names the tensor */
    memcpy(mod, img, n);
    stz_container *c;
    assert_int_equal(stz_container_open(&c, pk, &err), STZ_OK);
    const stz_chunk_info *ch = stz_container_chunk(c, 0);
    mod[ch->file_offset + ch->record_size - 3] ^= 0x10; /* inside the raw mantissa plane */
    stz_container_free(c);
    tu_write(bad, mod, n);
    assert_int_equal(stz_verify_file(&u, bad, &err), STZ_E_CHECKSUM);
    assert_non_null(strstr(err.msg, "BF16.0"));
    free(img), free(mod);
    unlink(in), unlink(pk), unlink(bad);
    free(in), free(pk), free(bad), free(out);
}

static void check_container_file(const char *p, const char *file, const char *code)
{
    stz_unpack_params u = STZ_UNPACK_PARAMS_DEFAULT;
    stz_err err;
    stz_err_clear(&err);
    stz_status got = stz_verify_file(&u, p, &err);
    if (strcmp(stz_status_name(got), code) != 0)
        fail_msg("%s: expected %s, got %s (%s)", file, code, stz_status_name(got), err.msg);
    if (got)
        assert_non_null(strstr(err.msg, file)); /* names the file */
}

static void test_container_corpus(void **state)
{
    (void)state;
    assert_true(tu_each_manifest(STZ_STZ_CORPUS_DIR, check_container_file) >= 20);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_xform_layouts),
        cmocka_unit_test(test_xform_same_bytes_without_avx2),
        cmocka_unit_test(test_xform_roundtrip_odd_lengths),
        cmocka_unit_test(test_blocks_roundtrip),
        cmocka_unit_test(test_blocks_codes_in_element_order),
        cmocka_unit_test_setup_teardown(test_roundtrip_dtypes_and_sizes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_roundtrip_corpus, setup, teardown),
        cmocka_unit_test_setup_teardown(test_roundtrip_shared, setup, teardown),
        cmocka_unit_test_setup_teardown(test_same_bytes_any_threads, setup, teardown),
        cmocka_unit_test_setup_teardown(test_upcast_f32_compresses, setup, teardown),
        cmocka_unit_test_setup_teardown(test_extract_tensor, setup, teardown),
        cmocka_unit_test_setup_teardown(test_corruption_rejected, setup, teardown),
        cmocka_unit_test(test_container_corpus),
        cmocka_unit_test(test_small_plane_huffman),
        cmocka_unit_test(test_small_plane_ac),
        cmocka_unit_test(test_ac_roundtrip),
        cmocka_unit_test_setup_teardown(test_sparse_never_worse_than_zstd, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tables_never_worse_than_zstd, setup, teardown),
    };
    return cmocka_run_group_tests_name("pack", tests, NULL, NULL);
}
