/* stz pack / unpack / verify: the lossless container. */
#include "cli.h"
#include "stz_pack.h"

#include <cjson/cJSON.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char pack_help[] =
    "usage: stz pack IN.safetensors [-o OUT.stz] [options]\n"
    "       stz pack - (-o OUT.stz | -c) [options]\n\n"
    "Packs a SafeTensors file losslessly: 'stz unpack' gives back the same bytes.\n"
    "Output defaults to IN.stz. IN - reads the file from standard input, in\n"
    "order (the header first, checked as it arrives): the same container.\n\n"
    "  -o, --output FILE     where to write; - for standard output\n"
    "  -c, --stdout          write to standard output (as -o -): the records in\n"
    "                        order, the index last (not to a terminal; the summary\n"
    "                        goes to standard error)\n"
    "  --best                slower, smaller (also tries zstd -19 on every plane)\n"
    "  -T, --threads N       worker threads, 0 = all cores (default); same output for any N\n"
    "  --chunk-size BYTES    raw bytes per chunk (default 1048576; 65536..67108864)\n"
    "  -f, --force           replace OUT if it exists\n"
    "  -q, --quiet           no progress, no summary\n"
    "  --json                print the summary as JSON\n"
    "  -h, --help            this text\n";

static const char unpack_help[] =
    "usage: stz unpack IN.stz [-o OUT.safetensors] [--tensor NAME] [options]\n"
    "       stz unpack - (-o OUT.safetensors | -c) [options]\n\n"
    "Restores the original file byte for byte, checking every chunk checksum\n"
    "and the whole-file digest; nothing is written if any check fails. Output\n"
    "defaults to IN without its .stz suffix. With --tensor, writes only that\n"
    "tensor's raw little-endian bytes, decoding only its chunks. IN - reads the\n"
    "container from standard input, in order, on one thread: each record is\n"
    "checked as it comes, then the index and the digest.\n\n"
    "  -o, --output FILE     where to write; - for standard output\n"
    "  -c, --stdout          write to standard output (as -o -): in order, each\n"
    "                        chunk checked before it is written (not to a terminal)\n"
    "  --tensor NAME         extract one tensor's bytes\n"
    "  -T, --threads N       worker threads, 0 = all cores (default)\n"
    "  -f, --force           replace OUT if it exists\n"
    "  -q, --quiet           no progress\n"
    "  --json                print a summary as JSON (files only)\n"
    "  -h, --help            this text\n";

static const char verify_help[] =
    "usage: stz verify [options] FILE.stz...\n\n"
    "Decodes every chunk and checks every checksum and the whole-file digest\n"
    "without writing anything. Exit status 0 if all files are intact, 1 if not.\n"
    "- reads a container from standard input.\n\n"
    "  -T, --threads N       worker threads, 0 = all cores (default)\n"
    "  -q, --quiet           no progress, no per-file line\n"
    "  --json                print results as JSON\n"
    "  -h, --help            this text\n";

enum { O_BEST = 256, O_CHUNK, O_TENSOR };

static const struct option opts[] = {{"best", no_argument, 0, O_BEST},
                                     {"stdout", no_argument, 0, 'c'},
                                     {"chunk-size", required_argument, 0, O_CHUNK},
                                     {"tensor", required_argument, 0, O_TENSOR},
                                     CLI_COMMON_LONG,
                                     {0, 0, 0, 0}};

typedef struct {
    cli_common c;
    const char *tensor;
    int best;
    long chunk;
} pack_opts;

/* Parses the options of the three commands; `allowed` lists the
 * command-specific long options it takes. Returns -1 to go on, else an
 * exit status. */
static int parse(const char *cmd, const char *help, const char *allowed, int argc, char **argv, pack_opts *o)
{
    int c, r;
    memset(o, 0, sizeof *o);
    cli_common_init(&o->c);
    o->chunk = 1 << 20;
    while ((c = getopt_long(argc, argv, CLI_COMMON_SHORT "c", opts, NULL)) != -1) {
        const char *name = c == 'o'             ? "output"
                           : c == O_BEST        ? "best"
                           : c == O_CHUNK       ? "chunk-size"
                           : c == CLI_OPT_JSON  ? "json"
                           : c == O_TENSOR      ? "tensor"
                           : c == CLI_OPT_DTYPE ? "dtype"
                           : c == 'c'           ? "stdout"
                                                : "";
        if (*name && !strstr(allowed, name))
            return cli_usage_error(cmd, "--%s does not apply here", name);
        if (c == 'c') {
            o->c.out = "-";
        } else if (c == O_BEST) {
            o->best = 1;
        } else if (c == O_TENSOR) {
            o->tensor = optarg;
        } else if (c == O_CHUNK) {
            char *end;
            o->chunk = strtol(optarg, &end, 10);
            if (*end || o->chunk < (long)STZ_PACK_MIN_CHUNK || o->chunk > (long)STZ_PACK_MAX_CHUNK || o->chunk % 8)
                return cli_usage_error(cmd, "--chunk-size takes a multiple of 8 in [%u, %u]", STZ_PACK_MIN_CHUNK,
                                       STZ_PACK_MAX_CHUNK);
        } else if ((r = cli_common_opt(cmd, help, c, &o->c)) != -1) {
            return r == -2 ? cli_bad_option(cmd) : r;
        }
    }
    return -1;
}

int cmd_pack(int argc, char **argv)
{
    pack_opts o;
    int rc = parse("pack", pack_help, "output best chunk-size json stdout", argc, argv, &o);
    if (rc >= 0)
        return rc;
    if (optind != argc - 1)
        return cli_usage_error("pack", "expected one input file");
    const char *in = argv[optind];
    int from_stdin = !strcmp(in, "-");
    if (from_stdin && isatty(STDIN_FILENO))
        return cli_usage_error("pack", "standard input is a terminal: pipe a SafeTensors file into it");
    if (from_stdin && !o.c.out)
        return cli_usage_error("pack", "give -o FILE or -c for what is read from standard input");
    int to_stdout = o.c.out && !strcmp(o.c.out, "-");
    if (to_stdout && isatty(STDOUT_FILENO))
        return cli_usage_error("pack", "standard output is a terminal: redirect it, or give -o FILE");
    if (to_stdout && o.c.json)
        return cli_usage_error("pack", "--json prints to standard output, which -c takes: not both");
    if ((rc = cli_not_gguf("pack", o.c.out, "an stz container")) >= 0 || (rc = cli_not_sharded("pack", in)) >= 0)
        return rc;
    stz_err err;
    char *out = cli_output_name("pack", o.c.out, in, "", ".stz", &rc);
    if (!out)
        return rc;
    stz_pack_params p = STZ_PACK_PARAMS_DEFAULT;
    p.level = o.best ? STZ_PACK_BEST : STZ_PACK_FAST;
    p.threads = o.c.threads;
    p.chunk_size = (uint32_t)o.chunk;
    p.write_flags = o.c.force ? STZ_WRITE_FORCE : 0;
    cli_progress prog;
    cli_progress_init(&prog, "pack", o.c.quiet);
    p.progress = cli_progress_cb;
    p.progress_user = &prog;
    stz_pack_stats st;
    char *file = NULL; /* a directory holding model.safetensors: that file */
    stz_status s = from_stdin ? stz_pack_stream(&p, STDIN_FILENO, "standard input", out, &st, &err)
                   : stz_model_file(in, &file, &err) ? err.code
                                                     : stz_pack_file(&p, file, out, &st, &err);
    free(file);
    cli_progress_end(&prog);
    if (s) {
        free(out);
        return cli_fail(&err);
    }
    double secs = cli_now() - prog.start, ratio = st.out_bytes ? (double)st.in_bytes / (double)st.out_bytes : 0;
    if (o.c.json) { /* the keys of cli_print_summary, and the chunk count */
        cJSON *d = cJSON_CreateObject();
        cJSON_AddStringToObject(d, "input", from_stdin ? "standard input" : in);
        cJSON_AddStringToObject(d, "output", out);
        cJSON_AddNumberToObject(d, "in_bytes", (double)st.in_bytes);
        cJSON_AddNumberToObject(d, "out_bytes", (double)st.out_bytes);
        cJSON_AddNumberToObject(d, "ratio", ratio);
        cJSON_AddNumberToObject(d, "chunks", (double)st.chunks);
        cJSON_AddNumberToObject(d, "seconds", secs);
        free(out);
        return cli_print_json(d);
    } else if (!o.c.quiet) {
        char a[32], b[32], r[32];
        fprintf(to_stdout ? stderr : stdout, "%s -> %s: %s -> %s bytes (%.3fx) in %.2f s, %s/s\n",
                from_stdin ? "standard input" : in, to_stdout ? "standard output" : out, cli_commas(a, st.in_bytes),
                cli_commas(b, st.out_bytes), ratio, secs, cli_bytes(r, (uint64_t)((double)st.in_bytes / secs)));
    }
    free(out);
    return CLI_OK;
}

int cmd_unpack(int argc, char **argv)
{
    pack_opts o;
    int rc = parse("unpack", unpack_help, "output tensor stdout json", argc, argv, &o);
    if (rc >= 0)
        return rc;
    if (optind != argc - 1)
        return cli_usage_error("unpack", "expected one input file");
    const char *in = argv[optind];
    int from_stdin = !strcmp(in, "-");
    if (from_stdin && (o.tensor || isatty(STDIN_FILENO)))
        return cli_usage_error("unpack", o.tensor ? "--tensor reads a container at offsets: give a file, not standard "
                                                    "input"
                                                  : "standard input is a terminal: pipe a container into it");
    if (!o.c.out && o.tensor)
        return cli_usage_error("unpack", "--tensor needs -o OUT");
    char *out = cli_output_name("unpack", o.c.out, in, ".stz", "", &rc);
    stz_err err;
    if (!out)
        return rc;
    if (!strcmp(out, "-") && isatty(STDOUT_FILENO)) {
        free(out);
        return cli_usage_error("unpack", "standard output is a terminal: redirect it, or give -o FILE");
    }
    if (o.c.json && (from_stdin || !strcmp(out, "-"))) {
        free(out);
        return cli_usage_error("unpack", "--json reports on files: not with standard input or output");
    }
    stz_unpack_params p = STZ_UNPACK_PARAMS_DEFAULT;
    p.threads = o.c.threads;
    p.write_flags = o.c.force ? STZ_WRITE_FORCE : 0;
    cli_progress prog;
    cli_progress_init(&prog, "unpack", o.c.quiet);
    p.progress = cli_progress_cb;
    p.progress_user = &prog;
    stz_status s = from_stdin ? stz_unpack_stream(&p, STDIN_FILENO, "standard input", out, &err)
                   : o.tensor ? stz_unpack_tensor(&p, in, o.tensor, out, &err)
                              : stz_unpack_file(&p, in, out, &err);
    cli_progress_end(&prog);
    if (s) {
        free(out);
        return cli_fail(&err);
    }
    /* without --json unpack prints nothing on success, as before */
    rc = o.c.json ? cli_print_summary(&o.c, in, out, o.tensor ? "tensor" : "lossless", 0, cli_now() - prog.start)
                  : CLI_OK;
    free(out);
    return rc;
}

/* Verifies one container; 1 if it is bad. */
static int verify_one(const pack_opts *o, stz_unpack_params *p, const char *path, cJSON *arr)
{
    cli_progress prog;
    cli_progress_init(&prog, "verify", o->c.quiet);
    p->progress = cli_progress_cb;
    p->progress_user = &prog;
    stz_err err;
    stz_status s = strcmp(path, "-") ? stz_verify_file(p, path, &err)
                                     : stz_unpack_stream(p, STDIN_FILENO, "standard input", NULL, &err);
    cli_progress_end(&prog);
    if (arr) {
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "file", path);
        cJSON_AddBoolToObject(e, "ok", s == STZ_OK);
        if (s) {
            cJSON_AddStringToObject(e, "code", stz_status_name(s));
            cJSON_AddStringToObject(e, "error", err.msg);
        }
        cJSON_AddItemToArray(arr, e);
    } else if (s) {
        cli_fail(&err);
    } else if (!o->c.quiet) {
        printf("%s: OK\n", path);
    }
    return s != STZ_OK;
}

int cmd_verify(int argc, char **argv)
{
    pack_opts o;
    int rc = parse("verify", verify_help, "json", argc, argv, &o);
    if (rc >= 0)
        return rc;
    if (optind >= argc)
        return cli_usage_error("verify", "expected at least one file");
    stz_unpack_params p = STZ_UNPACK_PARAMS_DEFAULT;
    p.threads = o.c.threads;
    int bad = 0, ranks = cli_mpi_size();
    for (int a = optind; ranks > 1 && a < argc; a++)
        if (o.c.json || !strcmp(argv[a], "-"))
            return cli_mpi_rank() ? CLI_USAGE
                                  : cli_usage_error("verify", "under mpirun: files or directories, no --json");
    cJSON *arr = o.c.json ? cJSON_CreateArray() : NULL;
    for (int a = optind; a < argc; a++) {
        char **files;
        size_t n;
        stz_err err;
        if (!strcmp(argv[a], "-")) { /* a container piped in */
            bad |= verify_one(&o, &p, "-", arr);
            continue;
        }
        if (stz_model_files(argv[a], &files, &n, &err)) {
            bad = 1;
            if (!cli_mpi_rank())
                cli_fail(&err);
            continue;
        }
        int *owner = ranks > 1 ? cli_mpi_share(files, n) : NULL; /* under MPI each rank checks its share */
        for (size_t f = 0; f < n; f++)
            if (ranks < 2 || (owner ? owner[f] : (int)(f % (size_t)ranks)) == cli_mpi_rank())
                bad |= verify_one(&o, &p, files[f], arr);
        free(owner);
        stz_model_files_free(files, n);
    }
    double failed = bad; /* any rank's failure fails the job */
    cli_mpi_sum(&failed, 1);
    bad = failed > 0;
    int rc2 = arr ? cli_print_json(arr) : CLI_OK;
    return bad ? CLI_ERROR : rc2;
}
