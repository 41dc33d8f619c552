/* Helpers shared by the stz commands: errors, numbers, progress. */
#include "cli.h"
#include "stz_pack.h"
#include "stz_model.h"
#include "stz_pipeline.h"
#include "stz_forward.h"

#include <libgen.h>

#include <cjson/cJSON.h>
#include <errno.h>
#include <getopt.h>
#include <stdarg.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

void cli_put_escaped(FILE *f, const char *s)
{
    const unsigned char *c = (const unsigned char *)s, *end = c + strlen(s);
    while (*c) {
        size_t n = stz_utf8_check(c, (size_t)(end - c)), k;
        for (k = 0; k < n; k++) {                                          /* valid UTF-8 up to c[n] */
            int c1 = c[k] == 0xc2 && c[k + 1] >= 0x80 && c[k + 1] <= 0x9f; /* U+0080..U+009F */
            if (c[k] < 0x20 || c[k] == 0x7f || c1) {
                static const char named[] = "abtnvfr"; /* \a .. \r */
                if (c[k] >= 7 && c[k] <= 13)
                    fprintf(f, "\\%c", named[c[k] - 7]);
                else
                    fprintf(f, "\\x%02x", c[k + c1]);
                k += (size_t)c1;
            } else {
                fputc(c[k], f);
            }
        }
        c += n;
        if (*c) /* a byte that is not UTF-8 */
            fprintf(f, "\\x%02x", *c++);
    }
}

void cli_print_meta(const char *key, const char *value)
{
    fputs("  ", stdout);
    cli_put_escaped(stdout, key);
    fputs(" = ", stdout);
    cli_put_escaped(stdout, value);
    fputc('\n', stdout);
}

/* stz_command's capture: the JSON document and the first error are kept
 * for the caller instead of printed (NULL: the program, which prints). */
static cli_capture *capture;

void cli_capture_set(cli_capture *c) { capture = c; }

int cli_fail(const stz_err *err)
{
    if (capture) {
        if (!capture->err.code)
            capture->err = *err;
        return CLI_ERROR;
    }
    fputs("stz: error: ", stderr);
    cli_put_escaped(stderr, err->msg[0] ? err->msg : stz_status_str(err->code));
    fprintf(stderr, " [%s]\n", stz_status_name(err->code));
    return CLI_ERROR;
}

int cli_usage_error(const char *cmd, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (capture) {
        if (!capture->err.code) {
            int n = snprintf(capture->err.msg, sizeof capture->err.msg, "stz %s: ", cmd);
            vsnprintf(capture->err.msg + n, sizeof capture->err.msg - (size_t)n, fmt, ap);
            capture->err.code = STZ_E_ARG;
        }
    } else {
        fprintf(stderr, "stz %s: ", cmd);
        vfprintf(stderr, fmt, ap);
        fprintf(stderr, "\nTry 'stz %s --help'.\n", cmd);
    }
    va_end(ap);
    return CLI_USAGE;
}

int cli_print_json(cJSON *doc)
{
    char *s = doc ? cJSON_Print(doc) : NULL;
    cJSON_Delete(doc);
    if (s && stz_json_failed()) /* a document with items missing is not printed */
        free(s), s = NULL;
    return cli_print_json_text(s);
}

int cli_print_json_text(char *s)
{
    if (!s) {
        stz_err e;
        stz_err_set(&e, STZ_E_NOMEM, "out of memory building the JSON document");
        return cli_fail(&e);
    }
    if (capture) {
        free(capture->json);
        capture->json = s;
        return CLI_OK;
    }
    puts(s);
    free(s);
    return CLI_OK;
}

int cli_not_gguf(const char *cmd, const char *out, const char *what)
{
    size_t n = out ? strlen(out) : 0;
    if (n < 5 || strcasecmp(out + n - 5, ".gguf"))
        return -1;
    return cli_usage_error(cmd,
                           "%s: %s writes %s, not a GGUF file llama.cpp runs: give --gguf to stz tune or compress "
                           "--tune, or use stz export --gguf MODEL -o %s",
                           out, cmd, what, out);
}

int cli_not_sharded(const char *cmd, const char *in)
{
    if (!stz_model_is_sharded(in))
        return -1;
    return cli_usage_error(cmd,
                           "%s: a sharded model directory; %s works on one file: stz compress%s %s -o DIR converts "
                           "it shard by shard",
                           in, cmd, strcmp(cmd, "pack") ? " --int4 (or another policy)" : " --lossless", in);
}

void cli_common_init(cli_common *o)
{
    memset(o, 0, sizeof *o);
    o->threads = cli_ncores();
    o->dtype = STZ_DTYPE_COUNT;
}

int cli_common_opt(const char *cmd, const char *help, int c, cli_common *o)
{
    switch (c) {
    case 'o': o->out = optarg; return -1;
    case 'T':
        if ((o->threads = cli_threads(optarg)) < 0)
            return cli_usage_error(cmd, "-T takes 0..256, not '%s'", optarg);
        return -1;
    case 'f': o->force = 1; return -1;
    case 'q': o->quiet = 1; return -1;
    case CLI_OPT_JSON: o->json = 1; return -1;
    case CLI_OPT_PROGRESS: cli_progress_lines = 1; return -1;
    case CLI_OPT_DTYPE:
        if (stz_dtype_parse_nocase(optarg, &o->dtype) ||
            (o->dtype != STZ_DTYPE_BF16 && o->dtype != STZ_DTYPE_F16 && o->dtype != STZ_DTYPE_F32))
            return cli_usage_error(cmd, "--dtype must be bf16, f16 or f32, not '%s'", optarg);
        return -1;
    case 'h': return fputs(help, stdout), CLI_OK;
    case '?': return cli_bad_option(cmd);
    default: return -2;
    }
}

const char *cli_commas(char *buf, uint64_t v)
{
    char tmp[32];
    int n = snprintf(tmp, sizeof tmp, "%llu", (unsigned long long)v), o = 0;
    for (int i = 0; i < n; i++) {
        buf[o++] = tmp[i];
        if ((n - i - 1) % 3 == 0 && i != n - 1)
            buf[o++] = ',';
    }
    buf[o] = 0;
    return buf;
}

const char *cli_bytes(char *buf, uint64_t v)
{
    static const char *units[] = {"B", "kB", "MB", "GB", "TB", "PB"};
    double d = (double)v;
    int u = 0;
    while (d >= 1000 && u < 5)
        d /= 1000, u++;
    snprintf(buf, 32, u ? "%.1f %s" : "%.0f %s", d, units[u]);
    return buf;
}

double cli_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int cli_progress_lines;

void cli_progress_init(cli_progress *p, const char *label, int flags)
{
    p->label = label;
    p->enabled = !(flags & STZ_STAGE_QUIET) && (cli_progress_lines || isatty(STDERR_FILENO));
    p->items = !!(flags & STZ_STAGE_ITEMS);
    p->start = cli_now();
    p->last = 0;
}

int cli_progress_cb(void *user, uint64_t done, uint64_t total)
{
    cli_progress *p = (cli_progress *)user;
    if (stz_interrupt_pending())
        return 1; /* stop: the operation removes its outputs and returns */
    if (!p || !p->enabled)
        return 0;
    double now = cli_now(), el = now - p->start;
    if (now - p->last < (cli_progress_lines ? 5 : 0.1) && done < total)
        return 0;
    p->last = now;
    char a[32], b[32], r[32];
    double rate = el > 0 ? (double)done / el : 0;
    const char *(*fmt)(char *, uint64_t) = p->items ? cli_commas : cli_bytes;
    fprintf(stderr, "%s%s %s / %s  %3.0f%%  %s/s", cli_progress_lines ? "" : "\r\033[K", p->label, fmt(a, done),
            fmt(b, total), total ? 100.0 * (double)done / (double)total : 100.0, fmt(r, (uint64_t)rate));
    if (rate > 0 && done < total)
        fprintf(stderr, "  %.0fs left", (double)(total - done) / rate);
    fputs(cli_progress_lines ? "\n" : "", stderr);
    fflush(stderr);
    return 0;
}

void cli_progress_end(cli_progress *p)
{
    if (p->enabled && !cli_progress_lines) {
        fprintf(stderr, "\r\033[K");
        fflush(stderr);
    }
}

static void *stages_begin(void *user, const char *label, int flags)
{
    cli_progress *p = malloc(sizeof *p);
    (void)user;
    if (p)
        cli_progress_init(p, label, flags);
    return p; /* NULL: cli_progress_cb shows nothing, still stops on an interrupt */
}

static void stages_end(void *state)
{
    if (state)
        cli_progress_end((cli_progress *)state);
    free(state);
}

const stz_stages cli_stages = {stages_begin, cli_progress_cb, stages_end, NULL};

int cli_ncores(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

char *cli_model_output_name(const char *model, const char *suffix)
{
    size_t n = stz_output_name_for(NULL, 0, model, suffix) + 1;
    char *p = malloc(n);
    if (p)
        stz_output_name_for(p, n, model, suffix);
    return p;
}

int cli_threads(const char *s)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (*s == 0 || *end || v < 0 || v > 256)
        return -1;
    return v == 0 ? cli_ncores() : (int)v;
}

void cli_err_path(stz_err *err, const char *tmp, const char *shown)
{
    char buf[sizeof err->msg];
    const char *at = strstr(err->msg, tmp);
    if (!at)
        return;
    snprintf(buf, sizeof buf, "%.*s%s%s", (int)(at - err->msg), err->msg, shown, at + strlen(tmp));
    memcpy(err->msg, buf, sizeof buf);
}

char *cli_output_name(const char *cmd, const char *given, const char *in, const char *strip, const char *add, int *rc)
{
    size_t n = strlen(in), s = strlen(strip);
    if (!given && (!strcmp(in, "-") || n <= s || strcmp(in + n - s, strip))) {
        *rc = cli_usage_error(cmd, "give -o OUT (cannot derive a name from '%s')", in);
        return NULL;
    }
    char *out = given ? strdup(given) : malloc(n - s + strlen(add) + 1);
    if (out && !given)
        sprintf(out, "%.*s%s", (int)(n - s), in, add);
    if (!out) {
        stz_err e;
        stz_err_set(&e, STZ_E_NOMEM, "%s: out of memory for the output's name", in);
        *rc = cli_fail(&e);
    }
    return out;
}

int cli_print_summary(const cli_common *c, const char *in, const char *out, const char *mode, int sharded, double secs)
{
    uint64_t a = stz_path_bytes(in, 1), b = stz_path_bytes(out, 1);
    if (c->json) {
        cJSON *d = cJSON_CreateObject();
        cJSON_AddStringToObject(d, "input", in);
        cJSON_AddStringToObject(d, "output", out);
        cJSON_AddStringToObject(d, "mode", mode);
        cJSON_AddBoolToObject(d, "sharded", sharded);
        cJSON_AddNumberToObject(d, "in_bytes", (double)a);
        cJSON_AddNumberToObject(d, "out_bytes", (double)b);
        cJSON_AddNumberToObject(d, "ratio", a ? (double)b / (double)a : 0);
        cJSON_AddNumberToObject(d, "seconds", secs);
        return cli_print_json(d);
    }
    if (!c->quiet) {
        char x[32], y[32];
        printf("%s -> %s: %s -> %s bytes in %.2f s (%s%s)\n", in, out, cli_commas(x, a), cli_commas(y, b), secs, mode,
               sharded ? ", sharded" : "");
    }
    return CLI_OK;
}

int cli_stdout_ok(const char *cmd, cli_common *c)
{
    if (!c->out || strcmp(c->out, "-"))
        return -1;
    if (isatty(STDOUT_FILENO))
        return cli_usage_error(cmd, "standard output is a terminal: redirect it, or give -o FILE");
    if (c->json)
        return cli_usage_error(cmd, "--json prints to standard output, which -o - takes: not both");
    c->quiet = 1; /* the data, not a summary */
    return -1;
}

const char *cli_tmp_base(const char *out, char *buf, size_t cap)
{
    if (strcmp(out, "-"))
        return snprintf(buf, cap, "%s", out), buf;
    const char *t = getenv("TMPDIR");
    snprintf(buf, cap, "%s/stz", t && *t ? t : "/tmp");
    return buf;
}
