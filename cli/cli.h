/* Shared pieces of the stz command-line program. */
#ifndef STZ_CLI_H
#define STZ_CLI_H

#include "stz_files.h"
#include "stz_export.h"
#include "stz_forward.h"
#include "stz_model.h"
#include "stz_pipeline.h"

#include <stdint.h>
#include <stdio.h>

/* Exit statuses, documented in docs/CLI.md. */
enum { CLI_OK = 0, CLI_ERROR = 1, CLI_USAGE = 2 };

typedef int cli_main(int argc, char **argv); /* a command's main: argv[0] is its name */

typedef struct {
    const char *name;
    cli_main *run;
    const char *summary;
} cli_command;

/* Writes s with control characters (C0, DEL, C1) and bytes that are not
 * UTF-8 escaped as \n, \t, \xNN, as ls and git do: text from a file never
 * reaches the terminal as an escape sequence. */
void cli_put_escaped(FILE *f, const char *s);
/* "  key = value" on standard output, both escaped: a metadata line. */
void cli_print_meta(const char *key, const char *value);
/* Prints "stz: error: MSG [CODE]" to stderr and returns CLI_ERROR. */
int cli_fail(const stz_err *err);
/* Prints "stz CMD: MSG" + hint to stderr and returns CLI_USAGE. */
int cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* -1, or a usage error when `out` is named *.gguf but the command writes
 * `what` (an stz container, SafeTensors, a policy), which llama.cpp does
 * not read: the error names the commands that write GGUF. */
int cli_not_gguf(const char *cmd, const char *out, const char *what);
/* -1, or a usage error when `in` is a sharded directory, which `cmd`
 * (working on one file) does not take: it names compress, which does. */
int cli_not_sharded(const char *cmd, const char *in);

struct cJSON;
/* Prints a JSON document to stdout and frees it; CLI_ERROR if out of memory. */
int cli_print_json(struct cJSON *doc);
/* The same for a document's text (malloc'd, freed here; NULL: out of memory). */
int cli_print_json_text(char *s);

/* The commands, by name (NULL if none); cli_usage prints the list. */
const cli_command *cli_command_find(const char *name);
void cli_usage(FILE *f);
/* Runs a command (argv[0] its name), keeping argv for cli_bad_option. */
int cli_run(const cli_command *cmd, int argc, char **argv);
/* The usage error for getopt's '?': names the argument it stopped at. */
int cli_bad_option(const char *cmd);

/* While set (stz_command), cli_print_json keeps the document in json (the
 * last one printed, malloc'ed) and cli_fail / cli_usage_error keep the
 * first error in err, instead of printing them. */
typedef struct {
    char *json;
    stz_err err;
} cli_capture;
void cli_capture_set(cli_capture *c);

/* Flags shared by the commands, parsed by cli_common_opt. */
typedef struct {
    const char *out; /* -o */
    int threads;     /* -T (0 = all cores), default all cores */
    int force, quiet, json;
    stz_dtype dtype; /* --dtype bf16|f16|f32, STZ_DTYPE_COUNT if not given */
} cli_common;

/* getopt_long codes of the shared long-only options. */
enum { CLI_OPT_JSON = 1000, CLI_OPT_DTYPE, CLI_OPT_PROGRESS };
#define CLI_COMMON_SHORT "o:T:fqh"
// clang-format off
#define CLI_COMMON_LONG                                                                                  \
    {"output", required_argument, 0, 'o'}, {"threads", required_argument, 0, 'T'},                     \
        {"force", no_argument, 0, 'f'}, {"quiet", no_argument, 0, 'q'}, {"help", no_argument, 0, 'h'}, \
        {"json", no_argument, 0, CLI_OPT_JSON}, {"dtype", required_argument, 0, CLI_OPT_DTYPE},         \
        {"progress", no_argument, 0, CLI_OPT_PROGRESS}
// clang-format on

void cli_common_init(cli_common *o);
/* The output path, malloc'ed: -o's, else IN without `strip` and with `add`
 * ("" both ways allowed). NULL with *rc the exit status when none can be
 * derived (a usage error) or memory ran out. */
char *cli_output_name(const char *cmd, const char *given, const char *in, const char *strip, const char *add, int *rc);
/* -o - (or -c): standard output carries the data, so it is refused on a
 * terminal and with --json, and the summary is off (c->quiet). -1 to go
 * on, else an exit status. */
int cli_stdout_ok(const char *cmd, cli_common *c);
/* Handles option c if it is a shared one: returns -1 when handled, an exit
 * status to return (help printed, or a usage error), or -2 if c is not a
 * shared option. */
int cli_common_opt(const char *cmd, const char *help, int c, cli_common *o);

/* getopt_long codes and entries of the sequence options (--tokens,
 * --sequences, --seq-len, --seed), and their help lines. */
enum { CLI_OPT_TOKENS = 1150, CLI_OPT_SEQS, CLI_OPT_LEN, CLI_OPT_SEED };
// clang-format off
#define CLI_SEQ_LONG                                                                                            \
    {"tokens", required_argument, 0, CLI_OPT_TOKENS}, {"sequences", required_argument, 0, CLI_OPT_SEQS},      \
        {"seq-len", required_argument, 0, CLI_OPT_LEN}, {"seed", required_argument, 0, CLI_OPT_SEED}
// clang-format on
/* Policy options of plan, quantize and compress (docs/POLICY.md,
 * "Command-line rules"). */
#define CLI_MAX_OVERRIDES 64
typedef struct {
    const char *policy;                           /* --policy / --int8 / --int4: file or shipped name */
    stz_policy_rule_text over[CLI_MAX_OVERRIDES]; /* --keep PATTERN, --set PATTERN=ACTION[:k=v...] */
    int nover;
    const char *method;  /* --method for int8/int4 rules */
    int block_size;      /* --block-size, 0 if not given */
    const char *imatrix; /* --imatrix FILE: the importance the quantizers weigh errors by */
    int feedback;        /* stz_policy_spec's: --feedback (every block rule), calibration by default (those that
                          * do not say) */
    int fast;            /* --fast: no calibration (plain rounding) */
    stz_seq_spec so;     /* error feedback's calibration sequences (default_len 0: not given) */
    const char *config;  /* --config: the model's configuration, for the forward pass */
} cli_policy_opts;

enum {
    CLI_OPT_POLICY = 1100,
    CLI_OPT_INT8,
    CLI_OPT_INT4,
    CLI_OPT_KEEP,
    CLI_OPT_SET,
    CLI_OPT_METHOD,
    CLI_OPT_BLOCK,
    CLI_OPT_IMATRIX,
    CLI_OPT_FEEDBACK,
    CLI_OPT_CONFIG,
    CLI_OPT_FAST
};
// clang-format off
/* the usage error of --fast with --feedback (quantize, compress and tune) */
#define CLI_FAST_NOT_FEEDBACK "--fast skips the error feedback --feedback asks for: give one of them"

#define CLI_POLICY_LONG                                                                                       \
    {"policy", required_argument, 0, CLI_OPT_POLICY}, {"int8", no_argument, 0, CLI_OPT_INT8},                \
        {"int4", no_argument, 0, CLI_OPT_INT4}, {"keep", required_argument, 0, CLI_OPT_KEEP},                \
        {"set", required_argument, 0, CLI_OPT_SET}, {"method", required_argument, 0, CLI_OPT_METHOD},        \
        {"block-size", required_argument, 0, CLI_OPT_BLOCK}, {"imatrix", required_argument, 0, CLI_OPT_IMATRIX}, \
        {"feedback", no_argument, 0, CLI_OPT_FEEDBACK}, {"config", required_argument, 0, CLI_OPT_CONFIG},       \
        {"fast", no_argument, 0, CLI_OPT_FAST}, CLI_SEQ_LONG
// clang-format on
#define CLI_POLICY_HELP                                                                                                \
    "  --policy P          policy file or shipped name (stz policy list)\n"                                            \
    "  --int8, --int4      the shipped int8 / int4 policies: llama.cpp's Q8_0 / a Q5_K-Q6_K-IQ4_NL mix\n"              \
    "  --keep PATTERN      keep the tensors PATTERN matches (before the policy's rules)\n"                             \
    "  --set PAT=ACTION[:key=value...]  a rule before the policy's, e.g. 'lm_head.weight=int8:block_size=32'\n"        \
    "  --method M          absmax, mse, full, asym, nl or nl-fit for every int2..int8 rule\n"                          \
    "  --block-size N      block size of every int8/int4 rule\n"                                                       \
    "  --imatrix FILE      importance matrix (stz imatrix, or llama.cpp's): blocks\n"                                  \
    "                      rounded without feedback (--fast, a model stz does not\n"                                   \
    "                      run) get the scales of least error weighted by it\n"                                        \
    "  --fast              no calibration: by default a model stz runs forward is\n"                                   \
    "                      calibrated on sequences sampled from it: error feedback\n"                                  \
    "                      (GPTQ) on every block quantization rule, each block's\n"                                    \
    "                      scales weighed by its columns' importance over them;\n"                                     \
    "                      --fast: plain rounding (much faster, higher KL at the\n"                                    \
    "                      same size). Calibration's options:\n"                                                       \
    "                      --tokens FILE (instead of sampling), --sequences N (16),\n"                                 \
    "                      --seq-len L (256), --seed S, --config FILE (config.json)\n"                                 \
    "  --feedback          calibrate, or fail saying why the model cannot be run\n"

/* Handles option c if it is a policy option: -1 handled, an exit status
 * (usage error), or -2 if not a policy option. */
int cli_policy_opt(const char *cmd, int c, cli_policy_opts *po);
struct stz_policy;
/* The policy of po for `model`, calibrated by default (stz_policy_for_model;
 * its note on stderr unless quiet). */
stz_status cli_policy_for(const cli_policy_opts *po, const char *model, int quiet, struct stz_policy **pol,
                          stz_err *err);
/* Error feedback for `model` when the policy asks for it (*fb NULL when
 * not; the policy from cli_policy_for): `out` checked first (stz_output_check;
 * not when NULL or "-"), so that the long work is not done for an output
 * that would be refused; then stz_feedback_calibrate with progress. */
stz_status cli_feedback_open(const cli_policy_opts *po, struct stz_policy *pol, const char *model, const char *out,
                             int force, int threads, int quiet, struct stz_feedback **fb, stz_err *err);
/* 1 if any policy option was given. */
static inline int cli_policy_given(const cli_policy_opts *po) { return po->policy || po->nover; }
struct stz_policy;
/* The policy with the command-line rules and settings applied. */
stz_status cli_policy_load(const cli_policy_opts *po, struct stz_policy **out, stz_err *err);
struct stz_reader;
/* Warns on stderr about rules that matched no tensor, suggesting the name
 * of `names` (may be NULL) a plain pattern was probably meant to be, or
 * saying which earlier rule took the tensor it names (deciding it again). */
void cli_policy_warn_unused(struct stz_policy *pol, const struct stz_reader *names);

/* "1,234,567" into buf (>= 32 bytes); returns buf. */
const char *cli_commas(char *buf, uint64_t v);
/* "988.1 MB" (decimal units) into buf (>= 32 bytes); returns buf. */
const char *cli_bytes(char *buf, uint64_t v);

/* Progress on stderr unless quiet: a line redrawn at most ~10 times a
 * second when stderr is a terminal, or with --progress (cli_progress_lines)
 * plain lines, one every few seconds; done / total as bytes, or as items
 * for the stages that count them (tokens, layers, tensors, forward units).
 * Pass cli_progress_cb + &progress to library calls. */
typedef struct {
    const char *label;
    int enabled, items;
    double start, last;
} cli_progress;
/* --progress: plain progress lines, also when stderr is not a terminal. */
extern int cli_progress_lines;

/* flags: STZ_STAGE_QUIET (a quiet flag of 0 or 1 is one), STZ_STAGE_ITEMS. */
void cli_progress_init(cli_progress *p, const char *label, int flags);
int cli_progress_cb(void *user, uint64_t done, uint64_t total);
void cli_progress_end(cli_progress *p);
/* The same progress lines for the library's work in stages. */
extern const stz_stages cli_stages;
double cli_now(void);

/* MODEL's path without trailing slashes and .safetensors, plus suffix
 * (malloc'ed; NULL out of memory): a derived output's default name. */
char *cli_model_output_name(const char *model, const char *suffix);
/* Parses a thread count; "0" means all cores. Returns -1 on bad input. */
int cli_threads(const char *s);
int cli_ncores(void);

/* Where intermediate files of `out` go: next to it, or in $TMPDIR (/tmp)
 * when out is "-" (standard output). Returns buf. */
const char *cli_tmp_base(const char *out, char *buf, size_t cap);
/* Replaces the temporary path `tmp` in err's message by `shown` (the file
 * the user named), so that errors name the input. */
void cli_err_path(stz_err *err, const char *tmp, const char *shown);

/* The one-line summary of a command that turned `in` into `out` (or its
 * --json document): sizes, time, mode. Returns an exit status. */
int cli_print_summary(const cli_common *c, const char *in, const char *out, const char *mode, int sharded, double secs);

/* stz_convert_shards on this process's MPI ranks: a CLI exit status, the
 * error printed by rank 0 only. */
int cli_shards_run(const char *in, const char *out, const char *in_suffix, const char *out_suffix, int rewrite_index,
                   int threads, int quiet, stz_shard_fn convert, void *user);

/* ---- MPI: ranks sharing a directory's shards (cli_mpi.c) ---------------- */

/* MPI_Init when a launcher (mpirun) started the process and stz was built
 * with MPI; returns the number of ranks (1 otherwise). */
int cli_mpi_start(int *argc, char ***argv);
void cli_mpi_end(void);
int cli_mpi_rank(void);
int cli_mpi_size(void);
void cli_mpi_bcast(void *buf, size_t n, int root);
void cli_mpi_sum(double *v, int n); /* in place, over every rank */
int cli_mpi_min_rank(double v);     /* the rank holding the smallest v */
/* 1 if any rank failed; err becomes the lowest failing rank's error. */
int cli_mpi_failed(int failed, stz_err *err);
/* The rank that takes each of the n files when the shares are fixed in
 * advance: largest first, each to the least loaded rank. malloc'd, one per
 * file; NULL out of memory. */
int *cli_mpi_share(char *const *files, size_t n);

/* MPI's ranks for the library (stz_ranks), this process alone without. */
const stz_ranks *cli_ranks(void);

struct stz_qmodel;
/* Handles option c if it is a sequence option: -1 handled, an exit status
 * (usage error), or -2 if not one. */
int cli_seq_opt(const char *cmd, int c, stz_seq_spec *o);
/* After parsing (defaults: the values o started from): --tokens excludes
 * the sampling options. -1 or an exit status. */
int cli_seq_check(const char *cmd, const stz_seq_spec *o, const stz_seq_spec *defaults);
/* A number option's value in [lo, hi]: -1, or the usage error's status. */
int cli_number(const char *cmd, const char *opt, const char *arg, double lo, double hi, double *v);

int cmd_export(int argc, char **argv);
/* stz inspect's listing of a GGUF file (JSON into *json when json is not
 * NULL); stz_is_gguf (stz_gguf.h) tells GGUF files apart. */
struct cJSON;
int cli_inspect_gguf(const char *path, struct cJSON **json);

int cmd_inspect(int argc, char **argv);
int cmd_synth(int argc, char **argv);
int cmd_pack(int argc, char **argv);
int cmd_unpack(int argc, char **argv);
int cmd_verify(int argc, char **argv);
int cmd_plan(int argc, char **argv);
int cmd_quantize(int argc, char **argv);
int cmd_dequantize(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_eval_forward(int argc, char **argv);
int cmd_compress(int argc, char **argv);
int cmd_tune(int argc, char **argv);
int cmd_gguf(int argc, char **argv);
int cmd_imatrix(int argc, char **argv);
int cmd_decompress(int argc, char **argv);
int cmd_policy(int argc, char **argv);

#endif
