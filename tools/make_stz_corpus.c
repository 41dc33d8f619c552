/* Writes tests/corpus/stz/: a small valid container and crafted variants
 * (forged sizes with recomputed checksums, so they pass the integrity
 * checks and reach the structural ones), the same for a GGUF's container,
 * plus MANIFEST with the status each must produce (old_writer.stz, a
 * container from an earlier writer, is kept in the repository). Build: make build; run: build/make_stz_corpus DIR. */
#include "pack/pack_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

static const char *dir;
static FILE *manifest;

static void emit(const char *name, const char *code, const uint8_t *b, size_t n)
{
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "wb");
    if (!f || fwrite(b, 1, n, f) != n) {
        perror(p);
        exit(1);
    }
    fclose(f);
    fprintf(manifest, "%s %s\n", name, code);
}

static uint8_t *load(const char *p, size_t *n)
{
    FILE *f = fopen(p, "rb");
    if (!f)
        exit(1);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc(*n);
    if (fread(b, 1, *n, f) != *n)
        exit(1);
    fclose(f);
    return b;
}

/* A GGUF of one Q5_0 matrix of 300 kB (codes peaked as trained weights'
 * are, so that its chunks keep the ggml transform; 64 kB chunks start
 * inside blocks), packed; then its first record with a forged block type
 * and a forged phase, which a reader must refuse. */
static void gguf_cases(const char *src, const char *pk, const stz_pack_params *p)
{
    enum { ROWS = 436, COLS = 1024, BLOCKS = ROWS * COLS / 32 };
    size_t hn = 4 + 4 + 8 + 8 + 8 + 1 + 4 + 16 + 4 + 8, data = (hn + 31) / 32 * 32, fn = data + (size_t)BLOCKS * 22;
    uint8_t *g = calloc(1, fn), *at = g;
    memcpy(at, "GGUF", 4), stz_put_le32(at + 4, 3), stz_put_le64(at + 8, 1), stz_put_le64(at + 16, 0);
    at += 24;
    stz_put_le64(at, 1), at[8] = 'w', stz_put_le32(at + 9, 2), stz_put_le64(at + 13, COLS), stz_put_le64(at + 21, ROWS);
    stz_put_le32(at + 29, 6), stz_put_le64(at + 33, 0);
    uint64_t x = 7;
    for (size_t b = 0; b < BLOCKS; b++) {
        uint8_t *blk = g + data + b * 22;
        stz_put_le16(blk, 0x2e66);
        uint32_t qh = 0;
        for (int j = 0; j < 32; j++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            int c = 16 + (int)((x >> 60) & 3) - (int)((x >> 56) & 3) + (int)((x >> 52) & 1); /* 13..20 */
            qh |= (uint32_t)(c >> 4) << j;
            blk[6 + (j & 15)] |= (uint8_t)((c & 15) << (j < 16 ? 0 : 4));
        }
        stz_put_le32(blk + 2, qh);
    }
    FILE *f = fopen(src, "wb");
    stz_err err;
    if (!f || fwrite(g, 1, fn, f) != fn || fclose(f) || stz_pack_file(p, src, pk, NULL, &err)) {
        fprintf(stderr, "gguf case failed\n");
        exit(1);
    }
    size_t n;
    uint8_t *v = load(pk, &n), *m = malloc(n);
    remove(src);
    remove(pk);
    uint64_t ioff = stz_le64(v + n - TRAILER_SIZE);
    const uint8_t *e1 = v + ioff + INDEX_HEAD_SIZE + INDEX_ENTRY_SIZE; /* the second chunk: it starts inside a block */
    uint64_t r1 = stz_le64(e1 + 8);
    if (v[r1 + 4] != STZ_XFORM_GGML || !stz_le32(v + r1 + 12)) {
        fprintf(stderr, "gguf case: the second chunk is not a ggml record inside a block\n");
        exit(1);
    }
    emit("valid_gguf.stz", "STZ_OK", v, n);
    memcpy(m, v, n), m[r1 + 6] = 99;
    emit("gguf_record_bad_type.stz", "STZ_E_FORMAT", m, n);
    memcpy(m, v, n), stz_put_le32(m + r1 + 12, 22);
    emit("gguf_record_bad_phase.stz", "STZ_E_FORMAT", m, n);
    memcpy(m, v, n), stz_put_le32(m + r1 + 12, stz_le32(v + r1 + 12) + 1);
    emit("gguf_record_other_phase.stz", "STZ_E_FORMAT", m, n);
    free(v), free(m), free(g);
}

/* Format 3: small tensors (U8, F32, an empty one between) as members of
 * one chunk, packed; then the index entry's count of tensors after the
 * first forged up and down, the version lowered to 2, and the first
 * member's plane count, codec and stored size forged, which a reader must
 * refuse. (Format 2's shared chunks, valid_shared.stz and shared_*.stz,
 * were written by the writer before format 3 and are kept.) */
static void members_cases(const char *src, const char *pk, const stz_pack_params *p)
{
    stz_writer *w;
    stz_err err;
    uint64_t s1 = 200, s2 = 30, s0 = 0, s3 = 100;
    if (stz_writer_open(&w, src, STZ_WRITE_FORCE, &err) || stz_writer_add(w, "a.u8", STZ_DTYPE_U8, 1, &s1, &err) ||
        stz_writer_add(w, "b.f32", STZ_DTYPE_F32, 1, &s2, &err) ||
        stz_writer_add(w, "empty", STZ_DTYPE_F16, 1, &s0, &err) ||
        stz_writer_add(w, "c.u8", STZ_DTYPE_U8, 1, &s3, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        exit(1);
    }
    for (uint8_t b = 0; stz_writer_remaining(w); b = (uint8_t)(b * 5 + 1))
        stz_writer_write(w, &b, 1, &err);
    if (stz_writer_finish(w, &err) || (stz_writer_free(w), stz_pack_file(p, src, pk, NULL, &err))) {
        fprintf(stderr, "members case failed: %s\n", err.msg);
        exit(1);
    }
    size_t n;
    uint8_t *v = load(pk, &n), *m = malloc(n);
    remove(src);
    remove(pk);
    uint64_t ioff = stz_le64(v + n - TRAILER_SIZE), isize = stz_le64(v + n - TRAILER_SIZE + 8);
    uint8_t *e0 = m + ioff + INDEX_HEAD_SIZE;
    size_t r0 = (size_t)stz_le64(v + ioff + INDEX_HEAD_SIZE + 8), m0 = r0 + RECORD_HEAD_SIZE;
    if (stz_le16(v + 8) != 3 || stz_le64(v + ioff + 8) != 1 || stz_le32(v + ioff + INDEX_HEAD_SIZE + 28) != 3 ||
        v[r0 + 4] != STZ_XFORM_MEMBERS) {
        fprintf(stderr, "members case: not one chunk of four tensors as members in format 3\n");
        exit(1);
    }
    emit("valid_members.stz", "STZ_OK", v, n);
    memcpy(m, v, n), stz_put_le32(e0 + 28, 4), stz_put_le64(m + n - TRAILER_SIZE + 16, XXH3_64bits(m + ioff, isize));
    emit("members_too_many.stz", "STZ_E_FORMAT", m, n);
    memcpy(m, v, n), stz_put_le32(e0 + 28, 1), stz_put_le64(m + n - TRAILER_SIZE + 16, XXH3_64bits(m + ioff, isize));
    emit("members_too_few.stz", "STZ_E_FORMAT", m, n);
    memcpy(m, v, n), stz_put_le16(m + 8, 2), stz_put_le64(m + 56, XXH3_64bits(m, 56));
    emit("members_in_version_2.stz", "STZ_E_FORMAT", m, n);
    memcpy(m, v, n), m[m0 + 1]++;
    emit("member_plane_count.stz", "STZ_E_FORMAT", m, n);
    memcpy(m, v, n), m[m0 + MEMBER_HEAD_SIZE] = 9;
    emit("member_bad_codec.stz", "STZ_E_FORMAT", m, n);
    memcpy(m, v, n), m[m0 + MEMBER_HEAD_SIZE + 1]++;
    emit("member_plane_sizes.stz", "STZ_E_FORMAT", m, n);
    free(v), free(m);
}

/* Chunk i's record in the container v: its first plane coded with codec 4
 * (stz's adaptive range coder), or 0. */
static size_t ac_record(const uint8_t *v, size_t n, size_t i)
{
    uint64_t ioff = stz_le64(v + n - TRAILER_SIZE);
    size_t r = (size_t)stz_le64(v + ioff + INDEX_HEAD_SIZE + 32 * i + 8);
    return v[r + 4] != STZ_XFORM_MEMBERS && v[r + 5] && v[r + RECORD_HEAD_SIZE] == STZ_CODEC_AC ? r : 0;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: make_stz_corpus DIR\n");
        return 2;
    }
    dir = argv[1];
    char src[1024], pk[1024], mp[1024];
    snprintf(src, sizeof src, "%s/valid.safetensors.tmp", dir);
    snprintf(pk, sizeof pk, "%s/valid.stz.tmp", dir);
    snprintf(mp, sizeof mp, "%s/MANIFEST", dir);
    manifest = fopen(mp, "w");
    fprintf(manifest, "# file expected-status (written by tools/make_stz_corpus.c)\n");

    /* a small model: BF16 and F32 chunks of their own (over 16 KiB), I8 and
     * an empty tensor as members of a chunk (format 3) */
    stz_writer *w;
    stz_err err;
    uint64_t s1 = 12000, s2 = 4200, s3 = 50, s0 = 0;
    if (stz_writer_open(&w, src, STZ_WRITE_FORCE, &err) || stz_writer_add(w, "w.bf16", STZ_DTYPE_BF16, 1, &s1, &err) ||
        stz_writer_add(w, "w.f32", STZ_DTYPE_F32, 1, &s2, &err) ||
        stz_writer_add(w, "w.i8", STZ_DTYPE_I8, 1, &s3, &err) ||
        stz_writer_add(w, "empty", STZ_DTYPE_F16, 1, &s0, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    uint64_t x = 1;
    for (uint64_t i = 0; i < stz_writer_remaining(w) + i; i++) {
        if (!stz_writer_remaining(w))
            break;
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        uint8_t b = (i & 1) && i < 6000 ? (uint8_t)(0x3c + (x >> 62)) : (uint8_t)(x >> 56);
        stz_writer_write(w, &b, 1, &err);
    }
    stz_writer_finish(w, &err);
    stz_writer_free(w);
    stz_pack_params p = STZ_PACK_PARAMS_DEFAULT;
    p.chunk_size = STZ_PACK_MIN_CHUNK;
    p.write_flags = STZ_WRITE_FORCE;
    if (stz_pack_file(&p, src, pk, NULL, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    size_t n;
    uint8_t *v = load(pk, &n), *m = malloc(n);
    remove(src);
    remove(pk);
    uint64_t ioff = stz_le64(v + n - TRAILER_SIZE), isize = stz_le64(v + n - TRAILER_SIZE + 8);
    uint8_t *ent0 = NULL;
#define RESET()        memcpy(m, v, n)
#define REHASH_HEAD()  stz_put_le64(m + 56, XXH3_64bits(m, 56))
#define REHASH_INDEX() stz_put_le64(m + n - TRAILER_SIZE + 16, XXH3_64bits(m + ioff, isize))

    emit("valid.stz", "STZ_OK", v, n);
    emit("empty.stz", "STZ_E_TRUNCATED", v, 0);
    emit("truncated_tail.stz", "STZ_E_TRUNCATED", v, n - 7);
    emit("truncated_half.stz", "STZ_E_TRUNCATED", v, n / 2);
    RESET();
    m[1] = 'X';
    emit("bad_magic.stz", "STZ_E_FORMAT", m, n);
    RESET();
    stz_put_le16(m + 8, STZ_PACK_FORMAT_VERSION + 1);
    REHASH_HEAD();
    emit("future_version.stz", "STZ_E_UNSUPPORTED", m, n);
    RESET();
    m[20] ^= 1;
    emit("header_field_flip.stz", "STZ_E_CHECKSUM", m, n);
    RESET();
    stz_put_le32(m + 12, 1u << 31);
    REHASH_HEAD();
    emit("forged_chunk_size.stz", "STZ_E_FORMAT", m, n);
    RESET();
    stz_put_le64(m + 24, 1ull << 40);
    REHASH_HEAD();
    emit("forged_header_len.stz", "STZ_E_FORMAT", m, n);
    RESET();
    stz_put_le64(m + 32, 1ull << 40);
    REHASH_HEAD();
    emit("forged_header_stored.stz", "STZ_E_FORMAT", m, n);
    RESET();
    stz_put_le64(m + 16, stz_le64(v + 16) + 4);
    REHASH_HEAD();
    emit("forged_original_size.stz", "STZ_E_OFFSETS", m, n);
    RESET();
    m[FILE_HEADER_SIZE + 12] ^= 0x40;
    emit("header_section_flip.stz", "STZ_E_FORMAT", m, n);
    RESET();
    m[ioff + 40] ^= 1;
    emit("index_flip.stz", "STZ_E_CHECKSUM", m, n);
    RESET();
    stz_put_le64(m + n - TRAILER_SIZE + 8, 1ull << 50);
    emit("forged_index_size.stz", "STZ_E_FORMAT", m, n);
    RESET();
    m[n - 1] ^= 0xff;
    emit("bad_end_magic.stz", "STZ_E_TRUNCATED", m, n);
    ent0 = m + ioff + INDEX_HEAD_SIZE;
    RESET();
    stz_put_le32(ent0 + 16, 1u << 30);
    REHASH_INDEX();
    emit("forged_record_size.stz", "STZ_E_FORMAT", m, n);
    RESET();
    stz_put_le32(ent0 + 20, 1u << 30);
    REHASH_INDEX();
    emit("forged_raw_size.stz", "STZ_E_FORMAT", m, n);
    RESET();
    stz_put_le32(ent0 + 24, 77);
    REHASH_INDEX();
    emit("forged_tensor_index.stz", "STZ_E_FORMAT", m, n);
    RESET();
    stz_put_le64(ent0 + 8, 3);
    REHASH_INDEX();
    emit("forged_record_offset.stz", "STZ_E_FORMAT", m, n);
    /* first chunk record: BF16, two planes; corrupt its head and payload */
    const uint8_t *v0 = v + ioff + INDEX_HEAD_SIZE;
    uint64_t r0 = stz_le64(v0 + 8), rs = stz_le32(v0 + 16);
    RESET();
    m[r0 + 4] = 9;
    emit("record_bad_xform.stz", "STZ_E_FORMAT", m, n);
    RESET();
    m[r0 + RECORD_HEAD_SIZE] = 7;
    emit("record_bad_codec.stz", "STZ_E_FORMAT", m, n);
    RESET();
    stz_put_le32(m + r0 + RECORD_HEAD_SIZE + 4, stz_le32(v + r0 + RECORD_HEAD_SIZE + 4) + 1);
    emit("record_plane_sizes.stz", "STZ_E_FORMAT", m, n);
    RESET();
    m[r0 + rs - 2] ^= 0x08;
    emit("payload_flip.stz", "STZ_E_CHECKSUM", m, n);
    RESET();
    m[r0 + 16] ^= 0x01;
    emit("record_checksum_flip.stz", "STZ_E_CHECKSUM", m, n);
    RESET();
    stz_put_le64(m + n - TRAILER_SIZE + 24, 12345);
    emit("whole_hash_wrong.stz", "STZ_E_CHECKSUM", m, n);
    RESET();
    m[10] = STZ_ORIG_GGUF;
    REHASH_HEAD();
    emit("flag_gguf_on_safetensors.stz", "STZ_E_FORMAT", m, n);
    RESET();
    m[10] = 2;
    REHASH_HEAD();
    emit("flag_unknown.stz", "STZ_E_FORMAT", m, n);
    size_t ra = 0; /* a record whose first plane codec 4 coded: not in format 2, and its payload flipped */
    for (size_t i = 0; i < stz_le64(v + ioff + 8) && !ra; i++)
        ra = ac_record(v, n, i);
    if (!ra || stz_le16(v + 8) != 3) {
        fprintf(stderr, "no plane of codec 4 in a format 3 container\n");
        return 1;
    }
    RESET();
    stz_put_le16(m + 8, 2);
    REHASH_HEAD();
    emit("ac_in_version_2.stz", "STZ_E_FORMAT", m, n);
    RESET();
    m[ra + RECORD_HEAD_SIZE + v[ra + 5] * PLANE_HEAD_SIZE + 3] ^= 0x20;
    emit("ac_payload_flip.stz", "STZ_E_FORMAT", m, n); /* the decoder ends before or after its bytes do */
    free(v);
    free(m);
    gguf_cases(src, pk, &p);
    members_cases(src, pk, &p);
    /* kept, not written: valid.stz as the first writer made it (four F32
     * planes where today's stores the small tensor's bytes unsplit), which
     * every later reader must still read */
    fprintf(manifest, "old_writer.stz STZ_OK\n");
    /* kept, not written: format 2's shared chunks, from the writer before format 3 */
    fprintf(manifest, "valid_shared.stz STZ_OK\nshared_too_many.stz STZ_E_FORMAT\n");
    fprintf(manifest, "shared_too_few.stz STZ_E_FORMAT\nshared_in_version_1.stz STZ_E_FORMAT\n");
    fclose(manifest);
    return 0;
}
