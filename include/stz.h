/*
 * stz.h - core types of the stz library: status codes, error details,
 * dtypes and progress callbacks. Every other public header includes it.
 *
 * Conventions (they hold for the whole library):
 *  - Functions that can fail return an stz_status and take a last argument
 *    `stz_err *err` (may be NULL). On failure err->code equals the returned
 *    status and err->msg says what went wrong, naming the file, the tensor
 *    and the rule broken wherever there is one.
 *  - Objects are opaque and freed by a NULL-safe `*_free`.
 *  - The library never prints and never exits; the CLI does both.
 */
#ifndef STZ_H
#define STZ_H

#include <stddef.h>
#include <stdint.h>

/* What libstz.so exports: the functions declared with STZ_API in include/
 * (everything else is hidden). */
#if defined(__GNUC__) || defined(__clang__)
#define STZ_API __attribute__((visibility("default")))
#else
#define STZ_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

#define STZ_VERSION_MAJOR  0
#define STZ_VERSION_MINOR  1
#define STZ_VERSION_PATCH  0
#define STZ_VERSION_STRING "0.1.0"
/* The library's STZ_VERSION_STRING, as built (Python's stz.__version__). */
STZ_API const char *stz_version(void);

/* Stable status codes: values never change once released. */
typedef enum {
    STZ_OK = 0,
    STZ_E_IO = 1,           /* open/read/write/rename failed (errno text in msg) */
    STZ_E_NOMEM = 2,        /* allocation failed */
    STZ_E_ARG = 3,          /* caller passed an invalid argument */
    STZ_E_TRUNCATED = 4,    /* file ends before the data it declares */
    STZ_E_HEADER_SIZE = 5,  /* header length is over the limit or past the file end */
    STZ_E_JSON = 6,         /* header is not UTF-8 JSON, or not a JSON object */
    STZ_E_FORMAT = 7,       /* a required field is missing or has the wrong type */
    STZ_E_DTYPE = 8,        /* unknown or unsupported dtype */
    STZ_E_SHAPE = 9,        /* bad dimension, or element count overflows */
    STZ_E_OFFSETS = 10,     /* data_offsets wrong: gap, overlap, size, coverage */
    STZ_E_DUPLICATE = 11,   /* a tensor name appears twice */
    STZ_E_METADATA = 12,    /* __metadata__ is not an object of strings */
    STZ_E_EXISTS = 13,      /* output exists (no force) or is the input itself */
    STZ_E_CHECKSUM = 14,    /* stored checksum does not match the data */
    STZ_E_BOUNDS = 15,      /* destination buffer too small */
    STZ_E_UNSUPPORTED = 16, /* valid request that this version cannot do */
    STZ_E_POLICY = 17,      /* policy file is invalid */
    STZ_E_NUMERIC = 18,     /* NaN/Inf or other value that cannot be processed */
    STZ_E_LAPACK = 19,      /* a LAPACK routine reported failure */
    STZ_E_INTERRUPTED = 20, /* stopped by a signal or a callback */
    STZ_STATUS_COUNT_
} stz_status;

/* Short stable name of a status ("STZ_E_OFFSETS"); never NULL. */
STZ_API const char *stz_status_name(stz_status s);
/* One-line English description of a status; never NULL. */
STZ_API const char *stz_status_str(stz_status s);

#define STZ_ERR_MSG_MAX 1024
typedef struct stz_err {
    stz_status code;
    char msg[STZ_ERR_MSG_MAX];
} stz_err;

/* Sets err (if not NULL) and returns code. printf-style message. */
STZ_API stz_status stz_err_set(stz_err *err, stz_status code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;
/* Clears err to STZ_OK with an empty message. */
STZ_API void stz_err_clear(stz_err *err);

/* ---- dtypes ---------------------------------------------------------- */

/* Every SafeTensors dtype. Values are stable. */
typedef enum {
    STZ_DTYPE_BOOL = 0,
    STZ_DTYPE_U8,
    STZ_DTYPE_I8,
    STZ_DTYPE_I16,
    STZ_DTYPE_U16,
    STZ_DTYPE_F16,
    STZ_DTYPE_BF16,
    STZ_DTYPE_I32,
    STZ_DTYPE_U32,
    STZ_DTYPE_F32,
    STZ_DTYPE_F64,
    STZ_DTYPE_I64,
    STZ_DTYPE_U64,
    STZ_DTYPE_C64,
    STZ_DTYPE_F8_E4M3,
    STZ_DTYPE_F8_E5M2,
    STZ_DTYPE_F8_E8M0,
    STZ_DTYPE_F8_E4M3FNUZ,
    STZ_DTYPE_F8_E5M2FNUZ,
    STZ_DTYPE_F4,
    STZ_DTYPE_F6_E2M3,
    STZ_DTYPE_F6_E3M2,
    STZ_DTYPE_COUNT
} stz_dtype;

/* Spelling used in SafeTensors headers ("BF16"); NULL if out of range. */
STZ_API const char *stz_dtype_name(stz_dtype d);
/* Parses a header spelling (exact, case-sensitive); returns 0 or -1. */
STZ_API int stz_dtype_parse(const char *s, stz_dtype *out);
/* Same, case-insensitive (for command lines: "bf16"). */
STZ_API int stz_dtype_parse_nocase(const char *s, stz_dtype *out);
/* Bits per element: 4 (F4), 6 (F6_*), 8, 16, 32 or 64. 0 if out of range. */
STZ_API unsigned stz_dtype_bits(stz_dtype d);
/* 1 for floating-point dtypes (F*, BF16, C64), else 0. */
STZ_API int stz_dtype_is_float(stz_dtype d);

/*
 * Bytes taken by n elements of d, following the SafeTensors rule:
 * n*bits must be a multiple of 8. Returns STZ_E_SHAPE on overflow or
 * misalignment (message names the problem, not the tensor).
 */
STZ_API stz_status stz_dtype_nbytes(stz_dtype d, uint64_t n, uint64_t *bytes, stz_err *err);

/* ---- progress -------------------------------------------------------- */

/*
 * Long operations report progress through this callback: `done` of `total`
 * units (bytes unless said otherwise). Called from the calling thread only.
 * Returning non-zero asks the operation to stop with STZ_E_INTERRUPTED.
 */
typedef int (*stz_progress_fn)(void *user, uint64_t done, uint64_t total);

/* ---- output files ---------------------------------------------------- */

/*
 * Every output is written under a temporary name in its destination
 * directory and renamed at the end. stz_tmp_cleanup_all() removes the
 * temporary files and directories still open in this process; it is
 * async-signal-safe (system calls only, no allocation), so a SIGINT/SIGTERM
 * handler may call it before exiting. While other threads still put files
 * into a temporary directory it empties it again, for up to a second.
 */
STZ_API void stz_tmp_cleanup_all(void);

/* Frees what a library call handed over as its caller's to free (a
 * report's text, stz_tune_report_json); NULL is ignored. For callers that
 * do not share the library's C library, such as Python's ctypes. */
STZ_API void stz_free(void *p);

/* Interruption, for a SIGINT/SIGTERM handler (async-signal-safe): after
 * stz_interrupt_request(), every read from a pipe or terminal and every
 * write to standard output that stz is blocked in, or starts, gives up
 * within 0.2 s with STZ_E_INTERRUPTED, and so do a tensor's read (between
 * its 8 MiB pieces), its quantization (between rows) and the library's
 * parallel stages (before their next item); a caller's progress callback
 * can ask stz_interrupt_pending() to stop the rest. The flag is process-wide and
 * stays set until stz_interrupt_clear() (for a caller that goes on after
 * an interrupted operation, as stz_command does). */
STZ_API void stz_interrupt_request(void);
STZ_API int stz_interrupt_pending(void);
STZ_API void stz_interrupt_clear(void);

/*
 * Runs a stz command in this process, as the program would run `stz ARGS`
 * (argv[0] is the command's name: "compress", "eval", ...), for bindings
 * (python/stz). What the program would print with --json is returned in
 * *json (malloc'ed, free it with stz_command_free; NULL if the command
 * printed none), an error in *err (code and message, not printed; usage
 * errors are STZ_E_ARG). Returns the program's exit status (docs/CLI.md):
 * 0, 1 (error), 2 (usage), 3 (a gate failed; *json says which). Progress
 * is not shown; pass --json (and -q) to get results. One command at a time
 * per process (a second concurrent call gets STZ_E_ARG); the interruption
 * flag is cleared before it starts. In the shared library (libstz.so)
 * only: it is the program's command layer. Process-wide effects, as in the
 * program: cJSON's allocation hooks are set to stz's (cJSON_InitHooks, so
 * that an allocation failure inside cJSON is reported), and commands that
 * factor an SVD set OpenBLAS's thread count.
 */
STZ_API int stz_command(int argc, const char *const *argv, char **json, stz_err *err);
STZ_API void stz_command_free(char *json);

/* sizeof the public structure `name`, for the structures bindings mirror
 * ("stz_err", "stz_tensor", "stz_qtensor", "stz_model_set", "stz_metrics",
 * "stz_eval_row", "stz_eval_problem", "stz_eval_result"), 0 for another
 * name. Python's ctypes copies are checked against it when the library
 * loads, so that a library of another layout is refused rather than
 * misread. In the shared library (libstz.so), beside stz_command. */
STZ_API size_t stz_struct_size(const char *name);

#ifdef __cplusplus
}
#endif
#endif /* STZ_H */
