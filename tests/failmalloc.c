/*
 * Allocation-failure testing, as SQLite does it: linked into a test build of
 * the stz program with -Wl,--wrap for the allocation functions (stz's own
 * calls, the library's and the program's; zstd, cJSON and OpenBLAS allocate
 * for themselves), it makes the Nth allocation fail:
 *
 *   STZ_FAIL_AT=N     the Nth call to malloc, calloc, realloc, strdup or
 *                     strndup returns NULL (once; the others succeed)
 *   STZ_FAIL_COUNT=1  prints "allocations: COUNT" on stderr at exit
 *
 * tests/test_oom.sh runs the main commands for every N up to their count.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void *__real_malloc(size_t n);
void *__real_calloc(size_t k, size_t n);
void *__real_realloc(void *p, size_t n);
char *__real_strdup(const char *s);
char *__real_strndup(const char *s, size_t n);

static atomic_long calls;
static long fail_at; /* 0: never */

static void report(void) { fprintf(stderr, "allocations: %ld\n", atomic_load(&calls)); }

__attribute__((constructor)) static void setup(void)
{
    const char *at = getenv("STZ_FAIL_AT"), *count = getenv("STZ_FAIL_COUNT");
    fail_at = at ? atol(at) : 0;
    if (count && *count == '1')
        atexit(report);
}

static int fail_now(void) { return atomic_fetch_add(&calls, 1) + 1 == fail_at; }

void *__wrap_malloc(size_t n) { return fail_now() ? NULL : __real_malloc(n); }
void *__wrap_calloc(size_t k, size_t n) { return fail_now() ? NULL : __real_calloc(k, n); }
void *__wrap_realloc(void *p, size_t n) { return fail_now() ? NULL : __real_realloc(p, n); }
char *__wrap_strdup(const char *s) { return fail_now() ? NULL : __real_strdup(s); }
char *__wrap_strndup(const char *s, size_t n) { return fail_now() ? NULL : __real_strndup(s, n); }
