/* SafeTensors reader and writer: round trips, writer rules, the corpus of
 * bad files, truncation at every byte, and the shared real models. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "core/stz_core.h"
#include "stz_safetensors.h"
#include "test_util.h"

#include <math.h>

#ifndef STZ_CORPUS_DIR
#error "STZ_CORPUS_DIR must be defined"
#endif

typedef struct {
    const char *name;
    stz_dtype dtype;
    int ndim;
    uint64_t shape[4];
} tdef;

/* Writes tensors with deterministic byte patterns; returns total data bytes. */
static uint64_t write_model(const char *path, const tdef *defs, size_t n, const char *const *meta, unsigned flags)
{
    stz_writer *w;
    stz_err err;
    assert_int_equal(stz_writer_open(&w, path, flags, &err), STZ_OK);
    for (size_t i = 0; meta && meta[i]; i += 2)
        assert_int_equal(stz_writer_set_meta(w, meta[i], meta[i + 1], &err), STZ_OK);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(stz_writer_add(w, defs[i].name, defs[i].dtype, defs[i].ndim, defs[i].shape, &err), STZ_OK);
    uint64_t total = stz_writer_remaining(w), k = 0;
    uint8_t buf[333]; /* odd size: writes cross tensor boundaries */
    while (k < total) {
        size_t m = total - k < sizeof buf ? (size_t)(total - k) : sizeof buf;
        for (size_t j = 0; j < m; j++)
            buf[j] = (uint8_t)((k + j) * 131 + 7);
        assert_int_equal(stz_writer_write(w, buf, m, &err), STZ_OK);
        k += m;
    }
    assert_int_equal(stz_writer_finish(w, &err), STZ_OK);
    stz_writer_free(w);
    return total;
}

static void test_roundtrip_every_dtype(void **state)
{
    (void)state;
    char *dir = tu_tmpdir(), *path = tu_path(dir, "all.safetensors");
    tdef defs[STZ_DTYPE_COUNT + 4];
    char names[STZ_DTYPE_COUNT][32];
    size_t n = 0;
    for (int d = 0; d < STZ_DTYPE_COUNT; d++) {
        snprintf(names[d], sizeof names[d], "t.%s", stz_dtype_name((stz_dtype)d));
        /* 4*3*... keeps 4- and 6-bit types whole bytes */
        defs[n++] = (tdef){names[d], (stz_dtype)d, 3, {4, 3, 5}};
    }
    defs[n++] = (tdef){"scalar", STZ_DTYPE_F64, 0, {0}};
    defs[n++] = (tdef){"empty", STZ_DTYPE_BF16, 2, {0, 17}};
    defs[n++] = (tdef){"odd", STZ_DTYPE_F16, 4, {1, 3, 7, 5}};
    defs[n++] = (tdef){"ünïcødé.名前", STZ_DTYPE_U8, 1, {1}};
    const char *meta[] = {"clé", "värde ✓ 漢字", "quote\"and\\slash", "tab\there\nnewline", NULL};
    uint64_t total = write_model(path, defs, n, meta, 0);

    stz_reader *r;
    stz_err err;
    assert_int_equal(stz_reader_open(&r, path, &err), STZ_OK);
    assert_int_equal(stz_reader_count(r), n);
    assert_string_equal(stz_reader_meta_get(r, "format"), "pt");
    assert_string_equal(stz_reader_meta_get(r, "clé"), "värde ✓ 漢字");
    assert_string_equal(stz_reader_meta_get(r, "quote\"and\\slash"), "tab\there\nnewline");
    assert_int_equal(stz_reader_data_offset(r) % 8, 0); /* padded like the reference writer */
    assert_int_equal(stz_reader_file_size(r), stz_reader_data_offset(r) + total);
    uint64_t k = 0;
    for (size_t i = 0; i < n; i++) {
        const stz_tensor *t = stz_reader_tensor(r, i);
        assert_string_equal(t->name, defs[i].name); /* file order = declaration order */
        assert_int_equal(t->dtype, defs[i].dtype);
        assert_int_equal(t->ndim, defs[i].ndim);
        for (int d = 0; d < t->ndim; d++)
            assert_int_equal(t->shape[d], defs[i].shape[d]);
        assert_int_equal(stz_reader_find(r, t->name), (long)i);
        uint64_t size = t->end - t->begin;
        uint8_t *b = malloc(size + 1);
        assert_int_equal(stz_reader_read(r, t, 0, b, size, &err), STZ_OK);
        for (uint64_t j = 0; j < size; j++)
            assert_int_equal(b[j], (uint8_t)((k + j) * 131 + 7));
        k += size;
        free(b);
    }
    assert_int_equal(stz_reader_find(r, "missing"), -1);
    assert_int_equal(stz_reader_tensor(r, 0)->numel, 60);
    assert_int_equal(stz_reader_tensor(r, STZ_DTYPE_COUNT)->numel, 1);     /* scalar */
    assert_int_equal(stz_reader_tensor(r, STZ_DTYPE_COUNT + 1)->numel, 0); /* empty */
    uint8_t x;
    assert_int_equal(stz_reader_read(r, stz_reader_tensor(r, 0), 60 * 0 + 1000, &x, 1, &err), STZ_E_BOUNDS);
    stz_reader_free(r);

    /* the same bytes through the in-memory reader */
    size_t len;
    uint8_t *img = tu_read(path, &len);
    assert_int_equal(stz_reader_open_mem(&r, img, len, "img", &err), STZ_OK);
    assert_int_equal(stz_reader_count(r), n);
    stz_reader_free(r);
    free(img);
    unlink(path);
    free(path);
    tu_rmdir(dir);
}

static void test_writer_rules(void **state)
{
    (void)state;
    char *dir = tu_tmpdir(), *path = tu_path(dir, "w.safetensors");
    stz_writer *w;
    stz_err err;
    uint64_t shape[2] = {2, 3};

    /* errors while declaring */
    assert_int_equal(stz_writer_open(&w, path, 0, &err), STZ_OK);
    assert_int_equal(stz_writer_add(w, "a", STZ_DTYPE_F32, 2, shape, &err), STZ_OK);
    assert_int_equal(stz_writer_add(w, "a", STZ_DTYPE_F32, 2, shape, &err), STZ_E_DUPLICATE);
    assert_non_null(strstr(err.msg, "'a'"));
    assert_int_equal(stz_writer_add(w, "__metadata__", STZ_DTYPE_F32, 2, shape, &err), STZ_E_ARG);
    assert_int_equal(stz_writer_add(w, "", STZ_DTYPE_F32, 2, shape, &err), STZ_E_ARG);
    assert_int_equal(stz_writer_add(w, "bad\xff", STZ_DTYPE_F32, 2, shape, &err), STZ_E_ARG);
    uint64_t odd = 3;
    assert_int_equal(stz_writer_add(w, "f4", STZ_DTYPE_F4, 1, &odd, &err), STZ_E_SHAPE);
    /* too few bytes: finish fails, nothing is left behind */
    float v[6] = {0};
    assert_int_equal(stz_writer_write(w, v, 8, &err), STZ_OK);
    assert_int_equal(stz_writer_add(w, "late", STZ_DTYPE_F32, 2, shape, &err), STZ_E_ARG);
    assert_int_equal(stz_writer_write(w, v, 24, &err), STZ_E_BOUNDS); /* 8 + 24 > 24 */
    assert_int_equal(stz_writer_finish(w, &err), STZ_E_BOUNDS);
    assert_int_equal(tu_count_entries(dir), 1); /* the temporary file, still open */
    stz_writer_free(w);
    assert_int_equal(tu_count_entries(dir), 0);

    /* many names: the duplicate check stays exact past table growth */
    assert_int_equal(stz_writer_open(&w, path, 0, &err), STZ_OK);
    char name[32];
    uint64_t one = 1;
    for (int i = 0; i < 5000; i++) {
        snprintf(name, sizeof name, "t%d", i);
        assert_int_equal(stz_writer_add(w, name, STZ_DTYPE_U8, 1, &one, &err), STZ_OK);
    }
    assert_int_equal(stz_writer_add(w, "t4321", STZ_DTYPE_U8, 1, &one, &err), STZ_E_DUPLICATE);
    stz_writer_free(w); /* abandoned: removed */
    assert_int_equal(tu_count_entries(dir), 0);

    /* an existing output needs force */
    tdef d = {"x", STZ_DTYPE_I32, 1, {3}};
    write_model(path, &d, 1, NULL, 0);
    uint64_t h = tu_hash_file(path);
    assert_int_equal(stz_writer_open(&w, path, 0, &err), STZ_E_EXISTS);
    assert_non_null(strstr(err.msg, path));
    assert_int_equal(tu_hash_file(path), h);
    d.shape[0] = 5;
    write_model(path, &d, 1, NULL, STZ_WRITE_FORCE);
    assert_true(tu_hash_file(path) != h);
    assert_int_equal(tu_count_entries(dir), 1);
    /* an output in a missing directory is a clean I/O error */
    assert_int_equal(stz_writer_open(&w, "/nonexistent-dir/x.safetensors", 0, &err), STZ_E_IO);
    unlink(path);
    free(path);
    tu_rmdir(dir);
}

static stz_status status_by_name(const char *s)
{
    for (int i = 0; i < STZ_STATUS_COUNT_; i++)
        if (!strcmp(stz_status_name((stz_status)i), s))
            return (stz_status)i;
    fail_msg("unknown status name %s in MANIFEST", s);
    return STZ_OK;
}

static void check_corpus_file(const char *p, const char *file, const char *code)
{
    stz_reader *r = NULL;
    stz_err err;
    stz_err_clear(&err);
    stz_status got = stz_reader_open(&r, p, &err), want = status_by_name(code);
    if (got != want)
        fail_msg("%s: expected %s, got %s (%s)", file, code, stz_status_name(got), err.msg);
    if (got != STZ_OK) {
        assert_null(r);
        assert_int_equal(err.code, got);
        assert_non_null(strstr(err.msg, file)); /* names the file */
    } else {
        for (size_t i = 0; i < stz_reader_count(r); i++) { /* every byte readable */
            const stz_tensor *t = stz_reader_tensor(r, i);
            uint8_t b[64];
            assert_true(t->end - t->begin <= sizeof b);
            assert_int_equal(stz_reader_read(r, t, 0, b, t->end - t->begin, &err), STZ_OK);
        }
    }
    stz_reader_free(r);
}

static void test_corpus(void **state)
{
    (void)state;
    assert_true(tu_each_manifest(STZ_CORPUS_DIR, check_corpus_file) >= 50);
}

/* Every strict prefix of a valid file is rejected with the error of the
 * region it ends in. */
static void test_truncated_everywhere(void **state)
{
    (void)state;
    char *dir = tu_tmpdir(), *path = tu_path(dir, "t.safetensors");
    tdef defs[] = {{"a", STZ_DTYPE_F32, 2, {3, 5}}, {"b", STZ_DTYPE_BF16, 1, {7}}, {"c", STZ_DTYPE_U8, 0, {0}}};
    write_model(path, defs, 3, NULL, 0);
    size_t len;
    uint8_t *img = tu_read(path, &len);
    uint64_t data_off = 8 + stz_le64(img);
    for (size_t cut = 0; cut < len; cut++) {
        stz_reader *r = NULL;
        stz_err err;
        stz_status st = stz_reader_open_mem(&r, img, cut, "cut", &err);
        stz_status want = cut < 8 ? STZ_E_TRUNCATED : cut < data_off ? STZ_E_HEADER_SIZE : STZ_E_TRUNCATED;
        if (st != want)
            fail_msg("cut at %zu: expected %s, got %s (%s)", cut, stz_status_name(want), stz_status_name(st), err.msg);
        assert_null(r);
    }
    stz_reader *r;
    assert_int_equal(stz_reader_open_mem(&r, img, len, "whole", NULL), STZ_OK);
    stz_reader_free(r);
    free(img);
    unlink(path);
    free(path);
    tu_rmdir(dir);
}

static void test_open_errors(void **state)
{
    (void)state;
    stz_reader *r;
    stz_err err;
    assert_int_equal(stz_reader_open(&r, "/nonexistent/model.safetensors", &err), STZ_E_IO);
    assert_non_null(strstr(err.msg, "/nonexistent/model.safetensors"));
    assert_int_equal(stz_reader_open(&r, "/", &err), STZ_E_IO); /* a directory */
    assert_null(r);
    assert_string_equal(stz_status_name(STZ_E_OFFSETS), "STZ_E_OFFSETS");
    assert_string_equal(stz_status_name((stz_status)999), "STZ_E_UNKNOWN");
}

/* A file that appears at the output path while a writer works is never
 * replaced without force; with force it is. A FIFO is refused at once. */
static void test_output_race_and_fifo(void **state)
{
    (void)state;
    char *dir = tu_tmpdir(), *out = tu_path(dir, "out.bin"), *fifo = tu_path(dir, "fifo");
    stz_err err;
    for (int force = 0; force < 2; force++) {
        stz_outfile of;
        assert_int_equal(stz_outfile_open(&of, out, force, &err), STZ_OK);
        assert_int_equal(stz_outfile_write(&of, "stz", 3, &err), STZ_OK);
        FILE *f = fopen(out, "wb"); /* someone else's file, created meanwhile */
        fputs("theirs", f);
        fclose(f);
        stz_status st = stz_outfile_commit(&of, &err);
        stz_outfile_abort(&of);
        char buf[8] = {0};
        f = fopen(out, "rb");
        assert_true(fread(buf, 1, sizeof buf - 1, f) > 0);
        fclose(f);
        assert_int_equal(st, force ? STZ_OK : STZ_E_EXISTS);
        assert_string_equal(buf, force ? "stz" : "theirs");
        assert_int_equal(tu_count_entries(dir), 1); /* no temporary file left */
        unlink(out);
    }
    stz_outfile of; /* a declared size no disk holds fails before any write, naming the output and the need */
    assert_int_equal(stz_outfile_open(&of, out, 0, &err), STZ_OK);
    assert_int_equal(stz_check_space(&of, 1000, "test", &err), STZ_OK);
    assert_int_equal(stz_check_space(&of, UINT64_MAX / 2, "unpacking x.stz", &err), STZ_E_IO);
    assert_non_null(strstr(err.msg, "not enough free space"));
    assert_non_null(strstr(err.msg, "unpacking x.stz needs 9223372036854775807 bytes"));
    assert_non_null(strstr(err.msg, out));
    stz_outfile_abort(&of);
    assert_int_equal(tu_count_entries(dir), 0);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    stz_reader *r;
    assert_int_equal(stz_reader_open(&r, fifo, &err), STZ_E_IO); /* returns: does not wait for a writer */
    assert_non_null(strstr(err.msg, "a FIFO"));
    unlink(fifo);
    free(out), free(fifo);
    tu_rmdir(dir);
}

static void check_shared(const char *file, stz_dtype dtype)
{
    char *p = tu_path(STZ_SHARED_DATA_DIR, file);
    if (!tu_exists(p)) {
        free(p);
        skip();
    }
    stz_reader *r;
    stz_err err;
    assert_int_equal(stz_reader_open(&r, p, &err), STZ_OK);
    assert_int_equal(stz_reader_count(r), 47);
    uint64_t params = 0;
    for (size_t i = 0; i < stz_reader_count(r); i++) {
        assert_int_equal(stz_reader_tensor(r, i)->dtype, dtype);
        params += stz_reader_tensor(r, i)->numel;
    }
    assert_int_equal(params, 260032);
    assert_true(stz_reader_find(r, "tok_embeddings.weight") >= 0);
    assert_non_null(stz_reader_meta_get(r, "config"));
    stz_reader_free(r);
    free(p);
}

static void test_shared_f32(void **state)
{
    (void)state;
    check_shared("stories260K.f32.safetensors", STZ_DTYPE_F32);
}
static void test_shared_bf16(void **state)
{
    (void)state;
    check_shared("stories260K.bf16.safetensors", STZ_DTYPE_BF16);
}

static void test_half_conversions(void **state)
{
    (void)state;
    /* every finite F16 survives F16 -> F32 -> F16; NaN stays NaN */
    for (uint32_t h = 0; h < 65536; h++) {
        float f = stz_f16_to_f32((uint16_t)h);
        if (isnan(f))
            assert_true((stz_f32_to_f16(f) & 0x7c00) == 0x7c00 && (stz_f32_to_f16(f) & 0x3ff));
        else
            assert_int_equal(stz_f32_to_f16(f), h);
    }
    assert_true(stz_f16_to_f32(0x3c00) == 1.0f);
    assert_true(stz_f16_to_f32(0x0001) == ldexpf(1, -24)); /* smallest subnormal */
    assert_int_equal(stz_f32_to_f16(65520.0f), 0x7c00);    /* rounds up to Inf */
    assert_int_equal(stz_f32_to_f16(65504.0f), 0x7bff);
    assert_int_equal(stz_f32_to_f16(ldexpf(1, -25)), 0); /* ties to even: 0 */
    assert_int_equal(stz_f32_to_f16(ldexpf(3, -26)), 1); /* 0.75 ulp: rounds up */
    /* BF16: round to nearest even */
    assert_int_equal(stz_f32_to_bf16(1.0f), 0x3f80);
    float f;
    uint32_t u = 0x3f808000; /* exactly halfway, even below */
    memcpy(&f, &u, 4);
    assert_int_equal(stz_f32_to_bf16(f), 0x3f80);
    u = 0x3f818000; /* halfway, odd below: rounds up */
    memcpy(&f, &u, 4);
    assert_int_equal(stz_f32_to_bf16(f), 0x3f82);
    assert_true(isnan(stz_bf16_to_f32(stz_f32_to_bf16(NAN))));
    assert_int_equal(stz_f32_to_bf16(INFINITY), 0x7f80);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_every_dtype),
        cmocka_unit_test(test_writer_rules),
        cmocka_unit_test(test_corpus),
        cmocka_unit_test(test_truncated_everywhere),
        cmocka_unit_test(test_open_errors),
        cmocka_unit_test(test_output_race_and_fifo),
        cmocka_unit_test(test_shared_f32),
        cmocka_unit_test(test_shared_bf16),
        cmocka_unit_test(test_half_conversions),
    };
    return cmocka_run_group_tests_name("safetensors", tests, NULL, NULL);
}
