/* llama.cpp's own decoders for the ggml types whose values come from
 * ggml's codebook tables (iq1_s, iq1_m, iq2_xxs, iq2_xs, iq2_s, iq3_xxs,
 * iq3_s: about 34 kB of grid constants chosen from data, which stz does
 * not copy). They are taken from a libggml-base loaded at run time, the
 * library llama.cpp builds and installs: STZ_GGML_LIB names it by an
 * absolute path or a bare file name (empty: none is loaded; a relative path
 * such as ./x.so is refused, as it would load whatever the current
 * directory holds); unset, libggml-base.so. A bare name is searched for in
 * the system's library path only (never the current directory: no RUNPATH
 * entry of stz's is empty or relative).
 * The library's traits must describe each type as ggml-common.h does
 * (name, elements and bytes per block), or it is not used. */
#include "ggml_types.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The leading fields of ggml.h's struct ggml_type_traits, the same in every
 * ggml that has ggml_get_type_traits (since October 2024). */
typedef struct {
    const char *type_name;
    int64_t blck_size, blck_size_interleave;
    size_t type_size;
    bool is_quantized;
    stz_ggml_to_float to_float;
} ggml_traits_head;

#define MAX_TYPE 64 /* above every ggml type number */

static pthread_once_t lib_once = PTHREAD_ONCE_INIT;
static const ggml_traits_head *(*lib_traits)(int type);
static stz_ggml_to_float lib_fn[MAX_TYPE]; /* the checked decoders, by type */
static const char *lib_name;               /* the environment's or a literal: never copied, never cut */
static char *lib_why;                      /* malloc'd once, kept for the process */

/* The library's to_float for every type stz decodes through it, each kept
 * only if the library describes the type as ggml-common.h does. */
static void lib_check(void)
{
    for (int type = 0; type < MAX_TYPE; type++) {
        const stz_ggml_traits *t = stz_ggml_traits_of(type);
        const ggml_traits_head *g = t && t->lib ? lib_traits(type) : NULL;
        if (g && g->type_name && !strcmp(g->type_name, t->name) && g->blck_size == (int64_t)t->block &&
            g->type_size == t->bytes)
            lib_fn[type] = g->to_float;
    }
}

static void lib_refuse(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void lib_refuse(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (vasprintf(&lib_why, fmt, ap) < 0)
        lib_why = NULL;
    va_end(ap);
}

static void lib_load(void)
{
    const char *env = getenv("STZ_GGML_LIB"), *tried[] = {"libggml-base.so", "libggml-base.so.0"};
    void *h = NULL;
    if (env && !*env) {
        lib_refuse("STZ_GGML_LIB is empty, so none is loaded");
        return;
    }
    if (env && *env != '/' && strchr(env, '/')) {
        lib_refuse(
            "STZ_GGML_LIB=%s is a relative path, which would load from the current directory: give an "
            "absolute path or a bare library name",
            env);
        return;
    }
    for (size_t i = 0; !h && i < (env ? 1 : 2); i++)
        h = dlopen(lib_name = env ? env : tried[i], RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        if (env)
            lib_refuse("STZ_GGML_LIB=%s cannot be loaded (%s)", env, dlerror());
        else
            lib_refuse("no libggml-base.so on the library path; set STZ_GGML_LIB to one");
        return;
    }
    *(void **)&lib_traits = dlsym(h, "ggml_get_type_traits");
    if (!lib_traits) {
        lib_refuse("%s has no ggml_get_type_traits (not llama.cpp's libggml-base of October 2024 or later)", lib_name);
        dlclose(h);
        return;
    }
    lib_check();
}

stz_ggml_to_float stz_ggml_lib_decoder(const stz_ggml_traits *t, char *why, size_t n)
{
    const char *lead = "its values come from ggml's codebook tables, which stz takes from llama.cpp's libggml-base";
    pthread_once(&lib_once, lib_load);
    if (t->type >= 0 && t->type < MAX_TYPE && lib_fn[t->type])
        return lib_fn[t->type];
    if (!lib_traits)
        snprintf(why, n, "%s: %s", lead, lib_why ? lib_why : "out of memory");
    else
        snprintf(why, n, "%s: %s does not describe %s as ggml-common.h does (blocks of %u elements in %u bytes)", lead,
                 lib_name, t->name, t->block, t->bytes);
    return NULL;
}
