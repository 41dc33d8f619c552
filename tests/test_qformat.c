/* The general quantizers (stz_qf_*): every width, method and scale storage
 * on odd lengths and hard blocks; the bit layout against a slow reference;
 * exact round trips of representable values; whole files written, read
 * back, identical for any thread count; the first version's files still
 * read. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "core/stz_core.h"
#include "stz_kernels.h"
#include "stz_policy.h"
#include "stz_model.h"
#include "stz_pipeline.h"
#include "stz_quant.h"
#include "stz_safetensors.h"
#include "test_util.h"

#include <math.h>

#include "kernel_copies.h"

static uint64_t seed = 11;
static float frand(void) /* roughly normal */
{
    float s = 0;
    for (int k = 0; k < 4; k++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        s += (float)((seed >> 40) & 0xffff) / 65536.0f - 0.5f;
    }
    return s;
}

static const stz_qmethod methods[] = {STZ_QMETHOD_ABSMAX, STZ_QMETHOD_FULL, STZ_QMETHOD_MSE, STZ_QMETHOD_ASYM,
                                      STZ_QMETHOD_NL};
static const int widths[] = {2, 3, 4, 5, 6, 8};
static const stz_dtype scale_dtypes[] = {STZ_DTYPE_F16, STZ_DTYPE_F32, STZ_DTYPE_U8};

static int valid(int bits, stz_qmethod m, stz_dtype sd)
{
    return !(m == STZ_QMETHOD_ASYM && sd == STZ_DTYPE_U8) && !(m == STZ_QMETHOD_NL && bits > 6);
}

static void format(stz_qformat *f, int bits, stz_qmethod m, uint32_t block, stz_dtype sd, float base)
{
    memset(f, 0, sizeof *f);
    f->bits = bits, f->method = m, f->block = block, f->scale_dtype = sd, f->scale_base = base;
    if (m == STZ_QMETHOD_NL)
        stz_qf_default_levels(bits, f->levels);
    stz_qf_prepare(f);
}

/* The slow reference of the layout: code i is bits [i*b, (i+1)*b) of the
 * row, the first bit the highest of byte 0. */
static unsigned slow_code(const uint8_t *q, size_t i, int bits)
{
    unsigned v = 0;
    for (int b = 0; b < bits; b++) {
        size_t bit = i * (size_t)bits + (size_t)b;
        v = v << 1 | ((q[bit / 8] >> (7 - bit % 8)) & 1);
    }
    return v;
}

/* The value of code v as FORMAT.md defines it. */
static float slow_value(const stz_qformat *f, unsigned v, float s, float m)
{
    if (f->method == STZ_QMETHOD_NL)
        return f->levels[v] * s;
    if (f->method == STZ_QMETHOD_ASYM)
        return (float)v * s + m;
    int q = (int)v >= 1 << (f->bits - 1) ? (int)v - (1 << f->bits) : (int)v; /* two's complement */
    return (float)q * s;
}

/* Quantizes x[n], checks the layout against the slow reference, the
 * padding bits, and returns the squared error. */
static double check_row(const stz_qformat *f, const float *x, size_t n)
{
    size_t nb = (n + f->block - 1) / f->block, rb = stz_qf_row_bytes(f->bits, n);
    uint8_t *q = malloc(rb + 1);
    float *s = malloc(nb * sizeof *s), *mn = malloc(nb * sizeof *mn), *y = malloc(n * sizeof *y);
    q[rb] = 0xA5; /* a guard byte */
    assert_int_equal(stz_qf_quantize_row(f, x, n, q, s, mn), 0);
    assert_int_equal(q[rb], 0xA5);
    assert_int_equal(rb, (n * (size_t)f->bits + 7) / 8);
    stz_qf_dequantize_row(f, q, s, mn, n, y);
    double e = 0;
    for (size_t i = 0; i < n; i++) {
        size_t b = i / f->block;
        float want = slow_value(f, slow_code(q, i, f->bits), s[b], mn[b]);
        if (y[i] != want)
            fail_msg("bits %d method %s: element %zu of %zu: %g, layout says %g", f->bits, stz_qmethod_name(f->method),
                     i, n, y[i], want);
        e += ((double)x[i] - y[i]) * ((double)x[i] - y[i]);
        if (f->method == STZ_QMETHOD_ABSMAX && fabsf(x[i] - y[i]) > fabsf(s[b]) * 0.5001f)
            fail_msg("absmax bits %d: |x - y| = %g > scale / 2 = %g", f->bits, fabsf(x[i] - y[i]), s[b] / 2);
    }
    if (n * (size_t)f->bits % 8) /* the last byte's unused low bits are zero */
        assert_int_equal(q[rb - 1] & ((1u << (8 - n * (size_t)f->bits % 8)) - 1), 0);
    if (f->scale_dtype == STZ_DTYPE_U8) /* scales are exactly codes' values */
        for (size_t b = 0; b < nb; b++)
            assert_true(s[b] == stz_qf_scale_value(f->scale_base, stz_qf_scale_code(f->scale_base, s[b])));
    if (f->scale_dtype == STZ_DTYPE_F16)
        for (size_t b = 0; b < nb; b++)
            assert_true(s[b] == stz_f16_to_f32(stz_f32_to_f16(s[b])));
    free(q), free(s), free(mn), free(y);
    return e;
}

static void test_every_format_odd_lengths(void **state)
{
    (void)state;
    static const size_t lens[] = {1, 2, 3, 5, 7, 33, 172, 1023};
    static const uint32_t blocks[] = {1, 7, 32, 64, 300};
    float *x = malloc(1023 * sizeof *x);
    for (size_t i = 0; i < 1023; i++)
        x[i] = frand() * (i % 97 == 5 ? 8.0f : 1.0f); /* a few outliers */
    for (size_t wi = 0; wi < sizeof widths / sizeof *widths; wi++)
        for (size_t mi = 0; mi < sizeof methods / sizeof *methods; mi++)
            for (size_t si = 0; si < 3; si++)
                for (size_t bi = 0; bi < sizeof blocks / sizeof *blocks; bi++) {
                    if (!valid(widths[wi], methods[mi], scale_dtypes[si]))
                        continue;
                    stz_qformat f;
                    format(&f, widths[wi], methods[mi], blocks[bi], scale_dtypes[si], 8.0f);
                    for (size_t li = 0; li < sizeof lens / sizeof *lens; li++)
                        check_row(&f, x, lens[li]);
                }
    free(x);
}

/* The searching methods never do worse than absmax of the same width, and
 * more bits never hurt; 4-bit nl and mse beat absmax clearly. */
static void test_search_beats_absmax(void **state)
{
    (void)state;
    enum { N = 4096 };
    float *x = malloc(N * sizeof *x);
    for (size_t i = 0; i < N; i++)
        x[i] = frand();
    for (size_t wi = 0; wi < sizeof widths / sizeof *widths; wi++) {
        stz_qformat f;
        format(&f, widths[wi], STZ_QMETHOD_ABSMAX, 32, STZ_DTYPE_F16, 0);
        double ea = check_row(&f, x, N);
        for (stz_qmethod m = STZ_QMETHOD_MSE; m <= STZ_QMETHOD_NL; m++) {
            if (!valid(widths[wi], m, STZ_DTYPE_F16))
                continue;
            format(&f, widths[wi], m, 32, STZ_DTYPE_F16, 0);
            double e = check_row(&f, x, N);
            if (e > ea * 1.001)
                fail_msg("%d bits: %s error %g > absmax %g", widths[wi], stz_qmethod_name(m), e, ea);
            if (widths[wi] == 4 && (m == STZ_QMETHOD_MSE || m == STZ_QMETHOD_NL))
                assert_true(e < 0.8 * ea);
        }
    }
    double last = INFINITY;
    for (int bits = 2; bits <= 6; bits++) {
        stz_qformat f;
        format(&f, bits, STZ_QMETHOD_NL, 32, STZ_DTYPE_U8, 3.0f);
        double e = check_row(&f, x, N);
        assert_true(e < last * 0.5); /* each bit at least halves the squared error */
        last = e;
    }
    free(x);
}

/* nl codes the nearest level (the binary search up to 16 levels, eight
 * at a time and one by one; the table and its correction past 16), with
 * repeated levels too, at every row length around the eight-lane steps. */
static void test_nl_nearest(void **state)
{
    (void)state;
    enum { N = 203 };
    float x[N], s[N], y[N];
    uint8_t q[N];
    for (int bits = 2; bits <= 6; bits++)
        for (int rep = 0; rep < 3; rep++) {
            stz_qformat f;
            format(&f, bits, STZ_QMETHOD_NL, 32, STZ_DTYPE_F32, 0);
            int k = 1 << bits;
            if (rep == 1) /* a fitted codebook can repeat a level */
                f.levels[k / 2] = f.levels[k / 2 + 1], f.levels[1] = f.levels[0], stz_qf_prepare(&f);
            if (rep == 2) /* or crowd them: no table past 16 levels */
                f.levels[2] = f.levels[1] + 1e-5f, f.levels[3] = f.levels[1] + 2e-5f, stz_qf_prepare(&f);
            assert_int_equal(f.lut_exact, k > 16 && rep < 2);
            for (size_t i = 0; i < N; i++) /* some on a midpoint of the levels */
                x[i] = i % 5 == 1 ? (f.levels[i % k] + f.levels[(i + 1) % k]) * 0.5f : frand();
            for (size_t n = 1; n <= N; n += n < 40 ? 1 : 27) {
                assert_int_equal(stz_qf_quantize_row(&f, x, n, q, s, NULL), 0);
                for (size_t i = 0; i < n; i++) {
                    float sc = s[i / 32];
                    unsigned c = slow_code(q, i, bits);
                    double got = fabs(x[i] - f.levels[c] * sc), best = INFINITY;
                    for (int j = 0; j < k; j++)
                        best = fmin(best, fabs(x[i] - f.levels[j] * sc));
                    if (got > best + 1e-6 * (fabs(x[i]) + fabs(sc)))
                        fail_msg("%d bits, n %zu, value %zu: code %u error %g, nearest %g", bits, n, i, c, got, best);
                }
                stz_qf_dequantize_row(&f, q, s, NULL, n, y);
                for (size_t i = 0; i < n; i++)
                    assert_true(y[i] == f.levels[slow_code(q, i, bits)] * s[i / 32]);
            }
        }
}

/* The library's quantizers (the AVX-512 or AVX2 clone where this machine
 * has them) give the same codes, scales, minimums, fitted levels and
 * dequantized values as the same code built for the baseline instruction
 * set, and for AVX2 alone. */
static void test_same_bits_without_avx2(void **state)
{
    (void)state;
    enum { N = 1031 };
    static float x[N], s1[N], s2[N], m1[N], m2[N], y1[N], y2[N];
    static uint8_t q1[N], q2[N];
#if STZ_X86_CLONES
    int avx2 = __builtin_cpu_supports("avx2");
#endif
    static const uint32_t blocks[] = {7, 32, 300};
    for (size_t i = 0; i < N; i++)
        x[i] = frand() * (i % 89 == 3 ? 6.0f : 1.0f);
    for (size_t wi = 0; wi < sizeof widths / sizeof *widths; wi++)
        for (size_t mi = 0; mi < sizeof methods / sizeof *methods; mi++)
            for (size_t si = 0; si < 3; si++)
                for (size_t bi = 0; bi < 3; bi++) {
                    if (!valid(widths[wi], methods[mi], scale_dtypes[si]))
                        continue;
                    stz_qformat f, g;
                    format(&f, widths[wi], methods[mi], blocks[bi], scale_dtypes[si], 4.0f);
                    if (methods[mi] == STZ_QMETHOD_NL) { /* fitted levels alike, then used alike */
                        stz_qf_fit_levels(&f, x, 1, N);
                        g = f;
                        plain_qf_fit_levels(&g, x, 1, N);
                        assert_memory_equal(f.levels, g.levels, sizeof f.levels);
                    }
                    g = f;
                    plain_qf_prepare(&g);
                    for (size_t n = 1; n <= N; n += n < 20 ? 1 : 101) {
                        size_t nb = (n + blocks[bi] - 1) / blocks[bi];
                        memset(m1, 0, sizeof m1), memset(m2, 0, sizeof m2);
                        assert_int_equal(stz_qf_quantize_row(&f, x, n, q1, s1, m1), 0);
                        assert_int_equal(plain_qf_quantize_row(&g, x, n, q2, s2, m2), 0);
                        assert_memory_equal(q1, q2, stz_qf_row_bytes(f.bits, n));
                        assert_memory_equal(s1, s2, nb * sizeof *s1);
                        assert_memory_equal(m1, m2, nb * sizeof *m1);
                        stz_qf_dequantize_row(&f, q1, s1, m1, n, y1);
                        plain_qf_dequantize_row(&g, q1, s1, m1, n, y2);
                        assert_memory_equal(y1, y2, n * sizeof *y1);
#if STZ_X86_CLONES
                        if (!avx2)
                            continue;
                        memset(m2, 0, sizeof m2), avx2_qf_prepare(&g);
                        assert_int_equal(avx2_qf_quantize_row(&g, x, n, q2, s2, m2), 0);
                        assert_memory_equal(q1, q2, stz_qf_row_bytes(f.bits, n));
                        assert_memory_equal(s1, s2, nb * sizeof *s1);
                        assert_memory_equal(m1, m2, nb * sizeof *m1);
                        avx2_qf_dequantize_row(&g, q1, s1, m1, n, y2);
                        assert_memory_equal(y1, y2, n * sizeof *y1);
#endif
                    }
                }
}

/* Values that are codes times a storable scale come back exactly; all-zero,
 * constant and single-outlier blocks behave. */
static void test_exact_and_hard_blocks(void **state)
{
    (void)state;
    float x[64], y[64], s[4], mn[4];
    uint8_t q[64];
    for (size_t wi = 0; wi < sizeof widths / sizeof *widths; wi++) {
        int bits = widths[wi], qmax = (1 << (bits - 1)) - 1;
        stz_qformat f;
        /* uniform: codes -qmax..qmax (the extreme present) at scale 0.25 */
        format(&f, bits, STZ_QMETHOD_ABSMAX, 64, STZ_DTYPE_F32, 0);
        for (int i = 0; i < 64; i++)
            x[i] = 0.25f * (float)(i == 0 ? qmax : (i * 7) % (2 * qmax + 1) - qmax);
        stz_qf_quantize_row(&f, x, 64, q, s, mn);
        stz_qf_dequantize_row(&f, q, s, mn, 64, y);
        assert_memory_equal(x, y, sizeof x);
        if (bits <= 6) { /* nl: levels at a U8 scale */
            format(&f, bits, STZ_QMETHOD_NL, 64, STZ_DTYPE_U8, 1.0f);
            float sc = stz_qf_scale_value(1.0f, 100); /* positive: codes below 128 */
            for (int i = 0; i < 64; i++)
                x[i] = f.levels[i == 0 ? (1 << bits) - 1 : (i * 5) % (1 << bits)] * sc;
            stz_qf_quantize_row(&f, x, 64, q, s, mn);
            stz_qf_dequantize_row(&f, q, s, mn, 64, y);
            assert_memory_equal(x, y, sizeof x);
        }
        for (stz_qmethod m = STZ_QMETHOD_ABSMAX; m <= STZ_QMETHOD_NL; m++) {
            if (!valid(bits, m, STZ_DTYPE_F16))
                continue;
            format(&f, bits, m, 64, STZ_DTYPE_F16, 0);
            memset(x, 0, sizeof x); /* all zero: zeros */
            stz_qf_quantize_row(&f, x, 64, q, s, mn);
            stz_qf_dequantize_row(&f, q, s, mn, 64, y);
            assert_memory_equal(x, y, sizeof x);
            x[17] = -3.5f; /* one outlier among zeros: exact, zeros stay zeros (nl: the level nearest 0) */
            stz_qf_quantize_row(&f, x, 64, q, s, mn);
            stz_qf_dequantize_row(&f, q, s, mn, 64, y);
            assert_true(fabsf(y[17] + 3.5f) <= 3.5f * 0.01f);
            /* zeros stay zeros, but for nl (the level nearest 0) and asym (half a step) */
            float tol = m == STZ_QMETHOD_NL     ? 3.5f * 0.02f
                        : m == STZ_QMETHOD_ASYM ? 3.5f / (float)((1 << bits) - 1) / 2
                                                : 0;
            for (int i = 0; i < 64; i++)
                if (i != 17 && fabsf(y[i]) > tol + 1e-6f)
                    fail_msg("%d bits %s: a zero became %g", bits, stz_qmethod_name(m), y[i]);
            for (int i = 0; i < 64; i++) /* constant */
                x[i] = 0.7f;
            stz_qf_quantize_row(&f, x, 64, q, s, mn);
            stz_qf_dequantize_row(&f, q, s, mn, 64, y);
            for (int i = 0; i < 64; i++)
                assert_true(fabsf(y[i] - 0.7f) <= 0.7f * 0.02f);
        }
    }
    /* F16 overflow is reported, not stored as infinity */
    stz_qformat f;
    format(&f, 4, STZ_QMETHOD_NL, 8, STZ_DTYPE_F16, 0);
    for (int i = 0; i < 8; i++)
        x[i] = 1e6f;
    assert_int_equal(stz_qf_quantize_row(&f, x, 8, q, s, mn), -1);
}

/* U8 scale codes: 0 is zero, the sign bit mirrors, each code is 1/8 octave. */
static void test_u8_scales(void **state)
{
    (void)state;
    assert_true(stz_qf_scale_value(2.0f, 0) == 0);
    assert_true(stz_qf_scale_value(2.0f, 120) == 2.0f); /* the base */
    assert_true(stz_qf_scale_value(2.0f, 112) == 1.0f); /* one octave down */
    assert_true(stz_qf_scale_value(2.0f, 127) > 3.6f);  /* the largest: 2^(7/8) times the base */
    assert_true(stz_qf_scale_value(2.0f, 120 | 0x80) == -2.0f);
    for (int c = 1; c < 256; c++) {
        if (c == 0x80)
            continue;
        float v = stz_qf_scale_value(0.37f, (uint8_t)c);
        assert_int_equal(stz_qf_scale_code(0.37f, v), c);
    }
}

/* ---- files ------------------------------------------------------------- */

static char *dir;

static void write_model(const char *path, const float *v, uint64_t rows, uint64_t cols)
{
    stz_writer *w;
    stz_err err;
    uint64_t shape[2] = {rows, cols};
    assert_int_equal(stz_writer_open(&w, path, STZ_WRITE_FORCE, &err), STZ_OK);
    assert_int_equal(stz_writer_add(w, "w", STZ_DTYPE_F32, 2, shape, &err), STZ_OK);
    assert_int_equal(stz_writer_write(w, v, rows * cols * 4, &err), STZ_OK);
    assert_int_equal(stz_writer_finish(w, &err), STZ_OK);
    stz_writer_free(w);
}

static stz_status quantize(const char *json, const char *in, const char *out, int threads, stz_err *err)
{
    stz_policy *p;
    assert_int_equal(stz_policy_parse(&p, json, strlen(json), "p", err), STZ_OK);
    stz_quant_params qp = STZ_QUANT_PARAMS_DEFAULT;
    qp.write_flags = STZ_WRITE_FORCE, qp.threads = threads;
    stz_status st = stz_quantize_file(&qp, p, in, out, NULL, err);
    stz_policy_free(p);
    return st;
}

static void test_files(void **state)
{
    (void)state;
    enum { R = 700, C = 3001 }; /* 8.4 MB of F32: several batches; odd rows */
    float *v = malloc((size_t)R * C * sizeof *v), *y = malloc((size_t)R * C * sizeof *y);
    for (size_t i = 0; i < (size_t)R * C; i++)
        v[i] = frand() * 0.02f;
    char *m = tu_path(dir, "m.safetensors"), *q = tu_path(dir, "q.safetensors"), *q3 = tu_path(dir, "q3.safetensors");
    write_model(m, v, R, C);
    static const char *const rules[] = {
        "\"action\": \"int4\", \"method\": \"nl\", \"block_size\": 32, \"scale_dtype\": \"U8\"",
        "\"action\": \"int3\", \"method\": \"nl-fit\", \"block_size\": 64, \"scale_dtype\": \"U8\"",
        "\"action\": \"int5\", \"method\": \"mse\", \"block_size\": 32, \"scale_dtype\": \"U8\"",
        "\"action\": \"int6\", \"method\": \"full\", \"block_size\": 17",
        "\"action\": \"int2\", \"method\": \"asym\", \"block_size\": 32",
        "\"action\": \"int8\", \"method\": \"asym\", \"block_size\": 64, \"scale_dtype\": \"F32\"",
        "\"action\": \"int8\", \"method\": \"mse\", \"block_size\": 32, \"scale_dtype\": \"U8\""};
    for (size_t k = 0; k < sizeof rules / sizeof *rules; k++) {
        char json[512];
        snprintf(json, sizeof json, "{\"rules\": [{\"match\": \"w\", %s}]}", rules[k]);
        stz_err err;
        if (quantize(json, m, q, 1, &err) || quantize(json, m, q3, 3, &err))
            fail_msg("%s: %s", rules[k], err.msg);
        size_t n1, n3; /* the same bytes for any thread count */
        uint8_t *b1 = tu_read(q, &n1), *b3 = tu_read(q3, &n3);
        assert_int_equal(n1, n3);
        assert_memory_equal(b1, b3, n1);
        free(b1), free(b3);
        stz_qmodel *qm; /* read back: close to the original, rows read alone agree */
        assert_int_equal(stz_qmodel_open(&qm, q, &err), STZ_OK);
        const stz_qtensor *t = stz_qmodel_tensor(qm, 0);
        assert_int_equal(t->rows, R);
        assert_int_equal(t->cols, C);
        assert_int_equal(stz_qmodel_read_rows(qm, 0, 0, R, y, &err), STZ_OK);
        double e = 0, n2 = 0;
        for (size_t i = 0; i < (size_t)R * C; i++)
            e += ((double)v[i] - y[i]) * ((double)v[i] - y[i]), n2 += (double)v[i] * v[i];
        int bits = t->bits;
        double bound = bits == 2   ? 0.45
                       : bits == 3 ? 0.2
                       : bits == 4 ? 0.1
                       : bits == 5 ? 0.05
                       : bits == 6 ? 0.03
                                   : 0.01;
        if (sqrt(e / n2) > bound)
            fail_msg("%s: relative error %g > %g", rules[k], sqrt(e / n2), bound);
        float row[C];
        assert_int_equal(stz_qmodel_read_rows(qm, 0, 123, 1, row, &err), STZ_OK);
        assert_memory_equal(row, y + 123 * C, sizeof row);
        stz_qmodel_free(qm);
        /* and stz_dequantize_file gives the same values */
        stz_quant_params qp = STZ_QUANT_PARAMS_DEFAULT;
        qp.write_flags = STZ_WRITE_FORCE;
        char *d = tu_path(dir, "d.safetensors");
        assert_int_equal(stz_dequantize_file(&qp, q, d, STZ_DTYPE_F32, &err), STZ_OK);
        stz_reader *r;
        assert_int_equal(stz_reader_open(&r, d, &err), STZ_OK);
        float *z = malloc((size_t)R * C * sizeof *z);
        assert_int_equal(stz_reader_read(r, stz_reader_tensor(r, 0), 0, z, (size_t)R * C * 4, &err), STZ_OK);
        assert_memory_equal(z, y, (size_t)R * C * 4);
        stz_reader_free(r);
        free(z), free(d);
    }
    /* NaN is refused naming the element, whatever the method */
    v[5 * C + 9] = NAN;
    write_model(m, v, R, C);
    stz_err err;
    assert_int_equal(quantize("{\"rules\": [{\"match\": \"w\", \"action\": \"int4\", \"method\": \"nl\", "
                              "\"scale_dtype\": \"U8\"}]}",
                              m, q3, 1, &err),
                     STZ_E_NUMERIC);
    assert_non_null(strstr(err.msg, "element 15014 is NaN"));
    free(v), free(y), free(m), free(q), free(q3);
}

/* Files of the first version (INT8, INT4 absmax and mse, SVD) still read. */
static void test_old_files(void **state)
{
    (void)state;
    static const char *const names[] = {"int4.safetensors", "int4mse.safetensors", "int8.safetensors",
                                        "mixed.safetensors", "svd.safetensors"};
    for (size_t k = 0; k < 5; k++) {
        char *p = tu_path(STZ_CORPUS_DIR "/../quant", names[k]), *d = tu_path(dir, "old.safetensors");
        stz_quant_params qp = STZ_QUANT_PARAMS_DEFAULT;
        qp.write_flags = STZ_WRITE_FORCE;
        stz_err err;
        if (stz_dequantize_file(&qp, p, d, STZ_DTYPE_F32, &err))
            fail_msg("%s: %s", names[k], err.msg);
        free(p), free(d);
    }
}

int main(void)
{
    dir = tu_tmpdir();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_format_odd_lengths),
        cmocka_unit_test(test_search_beats_absmax),
        cmocka_unit_test(test_exact_and_hard_blocks),
        cmocka_unit_test(test_u8_scales),
        cmocka_unit_test(test_nl_nearest),
        cmocka_unit_test(test_same_bits_without_avx2),
        cmocka_unit_test(test_files),
        cmocka_unit_test(test_old_files),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    tu_rmdir(dir);
    return rc;
}
