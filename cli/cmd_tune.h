/* stz tune's options and measurements, shared by cmd_tune.c (the command)
 * and tune_report.c (what it prints and plots). */
#ifndef STZ_CMD_TUNE_H
#define STZ_CMD_TUNE_H

#include "cli.h"
#include "stz_tune.h"

typedef struct {
    cli_common c;
    stz_budget kind;
    double value;           /* bytes or KL, once resolved */
    const char *budget_opt; /* as given */
    double size, ratio, bpw, max_kl;
    const char *candidates, *config, *plot, *save_policy, *imatrix;
    const char *tokenizer, *name; /* --gguf: as stz export --gguf takes them */
    stz_seq_spec so;
    int verify, compress, gguf;
    int feedback;  /* --feedback: every block candidate with error feedback */
    int no_pad;    /* --no-pad: down projections only in types that take their rows whole */
    int pad_vocab; /* --pad-vocab: as stz export --gguf takes it */
} tune_opts;

/* A policy compressed (and with --gguf exported) and run: its container's
 * or GGUF file's bytes, the forward pass's comparison. */
typedef struct {
    uint64_t bytes;
    stz_fwd_report fwd;
} measured;

/* 1 if the measured result misses the budget. */
int cli_tune_missed(const tune_opts *o, const measured *m);
/* The SVG plot of the curve, the choice and what was measured; `what`
 * names the sizes ("container", "GGUF file"). */
stz_status cli_tune_write_plot(const char *path, const stz_tune_solution *s, const stz_tune_point *choice,
                               const measured *m, const char *what, int force, stz_err *err);
/* The per-tensor table, the curve, the budget and the result (or --json); a CLI exit status.
 * m1: the first verification; m2 (NULL: none): the last of `corrections`. */
int cli_tune_report(const tune_opts *o, const char *model, const char *out, const stz_tune *T,
                    const stz_tune_solution *s, const stz_tune_point *first, const measured *m1, const measured *m2,
                    int corrections, double budget_bytes, const char *source);

#endif /* STZ_CMD_TUNE_H */
