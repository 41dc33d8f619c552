/* JSON with cJSON: allocation failures that cJSON's adders swallow made
 * visible, duplicate and unknown keys (stz_core.h). */
#include "stz_core.h"

#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static _Thread_local int json_oom;
static void *json_malloc(size_t n)
{
    void *p = malloc(n);
    json_oom |= !p;
    return p;
}
static void json_hooks(void)
{
    cJSON_Hooks h = {json_malloc, free};
    cJSON_InitHooks(&h);
}
static pthread_once_t json_hooks_once = PTHREAD_ONCE_INIT;

void stz_json_route_allocations(void) { pthread_once(&json_hooks_once, json_hooks); }

void stz_json_begin(void) { json_oom = 0; }

int stz_json_failed(void) { return json_oom; }

int stz_json_put(cJSON *o, const char *key, cJSON *item)
{
    if (o && item && (key ? cJSON_AddItemToObject(o, key, item) : cJSON_AddItemToArray(o, item)))
        return 1;
    cJSON_Delete(item);
    json_oom = 1;
    return 0;
}

const char *stz_json_duplicate_key(const cJSON *obj)
{
    size_t n = 0, k = 0;
    if (!cJSON_IsObject(obj))
        return NULL;
    for (const cJSON *e = obj->child; e; e = e->next)
        n++;
    if (n < 2)
        return NULL;
    const char **keys = malloc(n * sizeof *keys);
    if (!keys) /* fall back to the quadratic scan rather than skip the check */
        for (const cJSON *a = obj->child; a; a = a->next)
            for (const cJSON *b = a->next; b; b = b->next)
                if (!strcmp(a->string, b->string))
                    return a->string;
    if (!keys)
        return NULL;
    for (const cJSON *e = obj->child; e; e = e->next)
        keys[k++] = e->string;
    const char *dup = stz_first_duplicate(keys, n);
    free(keys);
    return dup;
}

const char *stz_json_unknown_key(const cJSON *obj, const char *const *allowed)
{
    for (const cJSON *e = cJSON_IsObject(obj) ? obj->child : NULL; e; e = e->next) {
        size_t i = 0;
        while (allowed[i] && strcmp(allowed[i], e->string))
            i++;
        if (!allowed[i])
            return e->string;
    }
    return NULL;
}
