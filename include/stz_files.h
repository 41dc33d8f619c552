/*
 * stz_files.h - what a program over libstz needs to write its outputs and
 * reports as stz's own commands do: an output path checked before the long
 * work, written under a temporary name beside it and placed at the end, an
 * output that is the input refused, small text files read with a limit,
 * and JSON documents built with cJSON that notice a failed allocation.
 * The stz program uses these and nothing internal (docs/ARCHITECTURE.md).
 * Experimental: they follow the command layer's needs.
 */
#ifndef STZ_FILES_H
#define STZ_FILES_H

#include "stz.h"
#include "stz_experimental.h"

#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- outputs ----------------------------------------------------------- */

/* May an output be written at `path`? STZ_OK when nothing is there, or a
 * regular file and `force`; STZ_E_EXISTS otherwise, naming what is there
 * (devices, FIFOs, sockets and directories are never replaced, even with
 * force). */
STZ_API stz_status stz_output_check(const char *path, int force, stz_err *err);
/* Renames a finished temporary file `tmp` to `path`. Without force it never
 * replaces a file that appeared meanwhile; with force it replaces only a
 * regular file (or a symbolic link). STZ_E_EXISTS or STZ_E_IO, naming path. */
STZ_API stz_status stz_output_place(const char *tmp, const char *path, int force, stz_err *err);
/* STZ_E_EXISTS ("output is the input file") if out is in, else STZ_OK. */
STZ_API stz_status stz_refuse_input_as_output(const char *in, const char *out, stz_err *err);

/* An intermediate file: its path (malloc'd) and its handle in the table
 * stz_tmp_cleanup_all() empties (stz.h). */
typedef struct {
    char *path;
    int handle;
} stz_tmpfile;
/* An empty intermediate file next to `out` (".OUT.WHAT-XXXXXX", the mode of
 * an ordinary new file), tracked for stz_tmp_cleanup_all() from before it
 * exists (every signal held back meanwhile, so that none can leave it
 * behind): 0, or -1 with errno set. */
STZ_API int stz_tmp_beside(stz_tmpfile *t, const char *out, const char *what);
/* Removes t's file (or what was moved to its name), untracks it, frees
 * its path; nothing when t->path is NULL. */
STZ_API void stz_tmp_remove(stz_tmpfile *t);
/* Closes f (written to t's file; NULL: it could not be opened) and, when
 * every write went through, places t's file at `path` (stz_output_place);
 * STZ_E_IO naming path otherwise. t is removed either way. */
STZ_API stz_status stz_tmp_finish(stz_tmpfile *t, FILE *f, const char *path, int force, stz_err *err);
/* The default name of an output made from the model `model`: its name
 * without trailing slashes and .safetensors, then suffix (stz tune's
 * MODEL.tune.json, stz imatrix's MODEL.imatrix.gguf). Written into dst (cap
 * bytes, NUL-terminated when cap > 0); returns the name's length: a name as
 * long as cap or longer was cut. */
STZ_API size_t stz_output_name_for(char *dst, size_t cap, const char *model, const char *suffix);

/* ---- inputs ------------------------------------------------------------ */

/* Reads a whole small regular file (policy, index, config) into a new
 * NUL-terminated buffer (*text, the caller frees it; *len its length when
 * len is not NULL); refuses FIFOs and devices and files over `limit`. */
STZ_API stz_status stz_read_text(const char *path, size_t limit, char **text, size_t *len, stz_err *err);
/* Bytes of a file, or of every regular file below a directory (model_only:
 * only its .safetensors and .stz files, and the top level's own); 0 when
 * nothing can be read there. */
STZ_API uint64_t stz_path_bytes(const char *path, int model_only);
/* Strict UTF-8 (no overlong forms, no surrogates, at most U+10FFFF): the
 * offset of the first byte of s[0..n) that is not valid UTF-8, or n. */
STZ_API size_t stz_utf8_check(const uint8_t *s, size_t n);
/* Indices 0..n-1 of files by size into order[0..n), largest first (equal
 * sizes in index order): the order in which to start work on them. */
STZ_API void stz_largest_first(const double *sizes, size_t n, size_t *order);

/* ---- JSON documents ---------------------------------------------------- */

struct cJSON;

/* Building JSON with cJSON, whose adders drop an item silently when an
 * allocation fails: stz_json_begin() before a document, stz_json_failed() after it says
 * whether any allocation failed on this thread since. stz_json_put adds
 * item to object o under key (to array o when key is NULL), and on failure
 * frees item (cJSON's own adders leak it) and marks the failure. */
STZ_API void stz_json_begin(void);
STZ_API int stz_json_failed(void);
STZ_API int stz_json_put(struct cJSON *o, const char *key, struct cJSON *item);
/* Routes cJSON's allocations through malloc as stz sees it, so that a failure
 * inside cJSON is noticed by stz_json_failed (cJSON_InitHooks: process-wide,
 * so only a program's command layer calls it, as stz_command does). Without
 * it, only failures that cJSON reports by its return values are seen. */
STZ_API void stz_json_route_allocations(void);

#ifdef __cplusplus
}
#endif
#endif /* STZ_FILES_H */
