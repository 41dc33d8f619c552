/* stz tune's options and measurements, shared by cmd_tune.c (the command)
 * and tune_report.c (what it prints and plots). */
#ifndef STZ_CMD_TUNE_H
#define STZ_CMD_TUNE_H

#include "cli.h"
#include "stz_tune.h"

typedef struct {
    cli_common c;
    stz_tune_run_params p;
    const char *plot, *save_policy;
    int compress; /* stz compress --tune: the container (or GGUF file) is the output */
} tune_opts;

/* The per-tensor table, the curve, the budget and the result (or --json); a CLI exit status. */
int cli_tune_report(const tune_opts *o, const char *model, const char *out, const stz_tune_result *r);

#endif /* STZ_CMD_TUNE_H */
