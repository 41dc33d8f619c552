/* Status codes, error messages and the dtype traits table. */
#include "stz.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

static const struct {
    const char *name, *text;
} status_table[STZ_STATUS_COUNT_] = {
    [STZ_OK] = {"STZ_OK", "success"},
    [STZ_E_IO] = {"STZ_E_IO", "input/output error"},
    [STZ_E_NOMEM] = {"STZ_E_NOMEM", "out of memory"},
    [STZ_E_ARG] = {"STZ_E_ARG", "invalid argument"},
    [STZ_E_TRUNCATED] = {"STZ_E_TRUNCATED", "file is truncated"},
    [STZ_E_HEADER_SIZE] = {"STZ_E_HEADER_SIZE", "invalid header length"},
    [STZ_E_JSON] = {"STZ_E_JSON", "header is not valid JSON"},
    [STZ_E_FORMAT] = {"STZ_E_FORMAT", "invalid file structure"},
    [STZ_E_DTYPE] = {"STZ_E_DTYPE", "unknown or unsupported dtype"},
    [STZ_E_SHAPE] = {"STZ_E_SHAPE", "invalid shape"},
    [STZ_E_OFFSETS] = {"STZ_E_OFFSETS", "invalid data offsets"},
    [STZ_E_DUPLICATE] = {"STZ_E_DUPLICATE", "duplicate tensor name"},
    [STZ_E_METADATA] = {"STZ_E_METADATA", "invalid __metadata__"},
    [STZ_E_EXISTS] = {"STZ_E_EXISTS", "output file exists"},
    [STZ_E_CHECKSUM] = {"STZ_E_CHECKSUM", "checksum mismatch"},
    [STZ_E_BOUNDS] = {"STZ_E_BOUNDS", "size out of bounds"},
    [STZ_E_UNSUPPORTED] = {"STZ_E_UNSUPPORTED", "not supported"},
    [STZ_E_POLICY] = {"STZ_E_POLICY", "invalid policy"},
    [STZ_E_NUMERIC] = {"STZ_E_NUMERIC", "invalid numeric value"},
    [STZ_E_LAPACK] = {"STZ_E_LAPACK", "LAPACK routine failed"},
    [STZ_E_INTERRUPTED] = {"STZ_E_INTERRUPTED", "interrupted"},
};

const char *stz_status_name(stz_status s)
{
    return (unsigned)s < STZ_STATUS_COUNT_ ? status_table[s].name : "STZ_E_UNKNOWN";
}

const char *stz_status_str(stz_status s)
{
    return (unsigned)s < STZ_STATUS_COUNT_ ? status_table[s].text : "unknown status";
}

stz_status stz_err_set(stz_err *err, stz_status code, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        err->code = code;
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return code;
}

stz_status stz_err_in(stz_err *err, stz_status st, const char *path)
{
    if (!st || !err || !path || strncmp(err->msg, "out of memory", 13)) /* the message is set only on errors */
        return st;
    size_t n = strlen(path) + 2, len = strlen(err->msg);
    if (n + len < sizeof err->msg) {
        memmove(err->msg + n, err->msg, len + 1); /* a bare message: say for which file */
        memcpy(err->msg, path, n - 2);
        memcpy(err->msg + n - 2, ": ", 2);
    }
    return st;
}

void stz_err_clear(stz_err *err)
{
    if (err) {
        err->code = STZ_OK;
        err->msg[0] = 0;
    }
}

/* ---- dtype traits ---------------------------------------------------- */

static const struct {
    const char *name;
    unsigned bits;
    int is_float;
} dtype_table[STZ_DTYPE_COUNT] = {
    [STZ_DTYPE_BOOL] = {"BOOL", 8, 0},
    [STZ_DTYPE_U8] = {"U8", 8, 0},
    [STZ_DTYPE_I8] = {"I8", 8, 0},
    [STZ_DTYPE_I16] = {"I16", 16, 0},
    [STZ_DTYPE_U16] = {"U16", 16, 0},
    [STZ_DTYPE_F16] = {"F16", 16, 1},
    [STZ_DTYPE_BF16] = {"BF16", 16, 1},
    [STZ_DTYPE_I32] = {"I32", 32, 0},
    [STZ_DTYPE_U32] = {"U32", 32, 0},
    [STZ_DTYPE_F32] = {"F32", 32, 1},
    [STZ_DTYPE_F64] = {"F64", 64, 1},
    [STZ_DTYPE_I64] = {"I64", 64, 0},
    [STZ_DTYPE_U64] = {"U64", 64, 0},
    [STZ_DTYPE_C64] = {"C64", 64, 1},
    [STZ_DTYPE_F8_E4M3] = {"F8_E4M3", 8, 1},
    [STZ_DTYPE_F8_E5M2] = {"F8_E5M2", 8, 1},
    [STZ_DTYPE_F8_E8M0] = {"F8_E8M0", 8, 1},
    [STZ_DTYPE_F8_E4M3FNUZ] = {"F8_E4M3FNUZ", 8, 1},
    [STZ_DTYPE_F8_E5M2FNUZ] = {"F8_E5M2FNUZ", 8, 1},
    [STZ_DTYPE_F4] = {"F4", 4, 1},
    [STZ_DTYPE_F6_E2M3] = {"F6_E2M3", 6, 1},
    [STZ_DTYPE_F6_E3M2] = {"F6_E3M2", 6, 1},
};

const char *stz_dtype_name(stz_dtype d) { return (unsigned)d < STZ_DTYPE_COUNT ? dtype_table[d].name : NULL; }

unsigned stz_dtype_bits(stz_dtype d) { return (unsigned)d < STZ_DTYPE_COUNT ? dtype_table[d].bits : 0; }

int stz_dtype_is_float(stz_dtype d) { return (unsigned)d < STZ_DTYPE_COUNT && dtype_table[d].is_float; }

static int dtype_parse_with(const char *s, stz_dtype *out, int (*cmp)(const char *, const char *))
{
    for (int i = 0; i < STZ_DTYPE_COUNT; i++)
        if (cmp(s, dtype_table[i].name) == 0) {
            *out = (stz_dtype)i;
            return 0;
        }
    return -1;
}

int stz_dtype_parse(const char *s, stz_dtype *out) { return dtype_parse_with(s, out, strcmp); }
int stz_dtype_parse_nocase(const char *s, stz_dtype *out) { return dtype_parse_with(s, out, strcasecmp); }

stz_status stz_dtype_nbytes(stz_dtype d, uint64_t n, uint64_t *bytes, stz_err *err)
{
    unsigned bits = stz_dtype_bits(d);
    if (!bits)
        return stz_err_set(err, STZ_E_DTYPE, "dtype code %d out of range", (int)d);
    if (n > UINT64_MAX / bits)
        return stz_err_set(err, STZ_E_SHAPE, "%llu elements of %s overflow 64 bits", (unsigned long long)n,
                           dtype_table[d].name);
    uint64_t nbits = n * bits;
    if (nbits % 8)
        return stz_err_set(err, STZ_E_SHAPE, "%llu elements of %s (%u bits) are not a whole number of bytes",
                           (unsigned long long)n, dtype_table[d].name, bits);
    *bytes = nbits / 8;
    return STZ_OK;
}

const char *stz_version(void) { return STZ_VERSION_STRING; }
