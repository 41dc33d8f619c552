/* Shared pieces of the stz command-line program. */
#ifndef STZ_CLI_H
#define STZ_CLI_H

#include "stz.h"

#include <stdint.h>
#include <stdio.h>

/* Exit statuses, documented in docs/CLI.md. */
enum { CLI_OK = 0, CLI_ERROR = 1, CLI_USAGE = 2 };

typedef struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} cli_command;

/* Prints "stz: error: MSG [CODE]" to stderr and returns CLI_ERROR. */
int cli_fail(const stz_err *err);
/* Prints "stz CMD: MSG" + hint to stderr and returns CLI_USAGE. */
int cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

struct cJSON;
/* Prints a JSON document to stdout and frees it; CLI_ERROR if out of memory. */
int cli_print_json(struct cJSON *doc);

/* "1,234,567" into buf (>= 32 bytes); returns buf. */
const char *cli_commas(char *buf, uint64_t v);
/* "988.1 MB" (decimal units) into buf (>= 32 bytes); returns buf. */
const char *cli_bytes(char *buf, uint64_t v);

/* Progress line on stderr, drawn only when stderr is a terminal and not
 * quiet; at most ~10 redraws a second. Pass cli_progress_cb + &progress to
 * library calls. */
typedef struct {
    const char *label;
    int enabled;
    double start, last;
} cli_progress;

void cli_progress_init(cli_progress *p, const char *label, int quiet);
int cli_progress_cb(void *user, uint64_t done, uint64_t total);
void cli_progress_end(cli_progress *p);
double cli_now(void);

/* Parses a thread count; "0" means all cores. Returns -1 on bad input. */
int cli_threads(const char *s);
int cli_ncores(void);

/* Refuses an output that is one of the inputs, even with --force. */
int cli_check_not_input(const char *out, const char *in);

int cmd_inspect(int argc, char **argv);
int cmd_synth(int argc, char **argv);
int cmd_pack(int argc, char **argv);
int cmd_unpack(int argc, char **argv);
int cmd_verify(int argc, char **argv);
int cmd_plan(int argc, char **argv);
int cmd_quantize(int argc, char **argv);
int cmd_dequantize(int argc, char **argv);
int cmd_eval(int argc, char **argv);

#endif
