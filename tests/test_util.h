/* Helpers shared by the test programs (header-only, static). */
#ifndef STZ_TEST_UTIL_H
#define STZ_TEST_UTIL_H

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

/* A fresh directory under $TMPDIR (or /tmp); removed by tu_rmdir. */
static inline char *tu_tmpdir(void)
{
    const char *base = getenv("TMPDIR");
    char *p = malloc(512);
    snprintf(p, 512, "%s/stz-test-XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(p)) {
        perror("mkdtemp");
        abort();
    }
    return p;
}

static inline char *tu_path(const char *dir, const char *name)
{
    char *p = malloc(strlen(dir) + strlen(name) + 2);
    sprintf(p, "%s/%s", dir, name);
    return p;
}

/* Number of entries in dir other than . and .. */
static inline int tu_count_entries(const char *dir)
{
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    if (d)
        closedir(d);
    return n;
}

static inline void tu_rmdir(char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        char *p = tu_path(dir, e->d_name);
        unlink(p);
        free(p);
    }
    if (d)
        closedir(d);
    rmdir(dir);
    free(dir);
}

/* Whole file into memory; *n gets its size. NULL if unreadable. */
static inline uint8_t *tu_read(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    *n = 0;
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *b = malloc((size_t)sz + 1);
    *n = fread(b, 1, (size_t)sz, f);
    fclose(f);
    return b;
}

/* Unlinks first: truncating a file in place makes ext4 flush it on close. */
static inline void tu_write(const char *path, const void *data, size_t n)
{
    unlink(path);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, n, f) != n)
        abort();
    fclose(f);
}

static inline uint64_t tu_hash_file(const char *path)
{
    size_t n;
    uint8_t *b = tu_read(path, &n);
    uint64_t h = b ? XXH3_64bits(b, n) : 0;
    free(b);
    return h;
}

static inline uint64_t tu_file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (uint64_t)st.st_size : 0;
}

static inline int tu_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* Calls fn(path, file, expected-status-name) for each "FILE STATUS" line of
 * DIR/MANIFEST; returns the number of entries. */
static inline int tu_each_manifest(const char *dir, void (*fn)(const char *path, const char *file, const char *code))
{
    char *manifest = tu_path(dir, "MANIFEST");
    FILE *f = fopen(manifest, "r");
    char line[512], file[256], code[64];
    int n = 0;
    while (f && fgets(line, sizeof line, f)) {
        if (line[0] == '#' || sscanf(line, "%255s %63s", file, code) != 2)
            continue;
        char *p = tu_path(dir, file);
        fn(p, file, code);
        free(p);
        n++;
    }
    if (f)
        fclose(f);
    free(manifest);
    return n;
}

/* A roughly normal float (a sum of four uniforms) from the generator
 * state *seed (a 64-bit LCG). */
static inline float tu_normal(uint64_t *seed)
{
    float s = 0;
    for (int k = 0; k < 4; k++) {
        *seed = *seed * 6364136223846793005ull + 1442695040888963407ull;
        s += (float)(*seed >> 40) / (float)(1 << 24) - 0.5f;
    }
    return s;
}

#ifdef STZ_POLICY_H
/* A policy parsed from JSON; the test fails with the parser's message if it
 * is refused (cmocka programs only: include cmocka.h first). */
static inline stz_policy *tu_policy(const char *json)
{
    stz_policy *p;
    stz_err err;
    if (stz_policy_parse(&p, json, strlen(json), "test", &err))
        fail_msg("%s", err.msg);
    return p;
}
#endif

#endif
