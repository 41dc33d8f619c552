/* The command table, and stz_command: the program's commands run in-process
 * for bindings (include/stz.h). */
#include "cli.h"
#include "stz_eval.h"
#include "stz_tune.h"

#include <getopt.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static const cli_command commands[] = {
    {"gguf", cmd_gguf, "the best GGUF for llama.cpp for a budget, calibrated, in one command"},
    {"compress", cmd_compress, "policy -> quantize / SVD -> pack, in one command (or --lossless)"},
    {"decompress", cmd_decompress, "back from a container (--dequantize: a plain float model)"},
    {"inspect", cmd_inspect, "list the tensors, dtypes, sizes and metadata of a file"},
    {"policy", cmd_policy, "list the shipped policies, or print one"},
    {"plan", cmd_plan, "show what a policy would do to each tensor"},
    {"quantize", cmd_quantize, "quantize tensors to INT8 / INT4 as a policy says"},
    {"dequantize", cmd_dequantize, "turn a quantized file back into a plain float model"},
    {"eval", cmd_eval, "measure how close a quantized model is to the original"},
    {"imatrix", cmd_imatrix, "collect an importance matrix from the model's own forward pass"},
    {"tune", cmd_tune, "choose each tensor's action for a size or KL budget (writes a policy)"},
    {"pack", cmd_pack, "pack a SafeTensors file losslessly into an .stz container"},
    {"unpack", cmd_unpack, "restore the original file (or one tensor) from a container"},
    {"verify", cmd_verify, "check every checksum of containers without writing"},
    {"export", cmd_export, "write a model as GGUF for llama.cpp (--gguf)"},
    {"synth", cmd_synth, "generate a realistic stand-in model of a real architecture"},
};
#define NCMD (sizeof commands / sizeof commands[0])

const cli_command *cli_command_find(const char *name)
{
    for (size_t i = 0; i < NCMD; i++)
        if (!strcmp(name, commands[i].name))
            return &commands[i];
    return NULL;
}

void cli_usage(FILE *f)
{
    fprintf(f,
            "stz %s - make neural-network model files small\n\n"
            "usage: stz COMMAND [OPTIONS] ...\n\ncommands:\n",
            STZ_VERSION_STRING);
    for (size_t i = 0; i < NCMD; i++)
        fprintf(f, "  %-12s %s\n", commands[i].name, commands[i].summary);
    fprintf(f,
            "\n'stz COMMAND --help' describes a command. Exit status: 0 success, 1 error, 2 usage\n"
            "(stz eval: 3 when a tensor is below --threshold; stz tune: 3 when the budget cannot be met).\n");
}

static char **running_argv; /* the running command's arguments */

/* Options that hand a command to another main: stz compress --tune is
 * tune's, stz eval --forward the forward pass's (no command calls another). */
static const struct {
    const char *cmd, *flag;
    cli_main *run;
} modes[] = {{"compress", "--tune", cmd_tune}, {"eval", "--forward", cmd_eval_forward}};

/* The main that runs argv: a mode's when its flag is among the options
 * (before any "--"), else the command's own. */
static cli_main *runner(const cli_command *cmd, int argc, char **argv)
{
    for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++) {
        if (strcmp(cmd->name, modes[m].cmd))
            continue;
        for (int i = 1; i < argc && strcmp(argv[i], "--"); i++)
            if (!strcmp(argv[i], modes[m].flag))
                return modes[m].run;
    }
    return cmd->run;
}

int cli_run(const cli_command *cmd, int argc, char **argv)
{
    running_argv = argv;
    opterr = 0;                   /* cli_bad_option says it, once */
    stz_json_route_allocations(); /* cJSON through stz's allocator: cli_print_json sees a failure */
    stz_json_begin();
    int rc = runner(cmd, argc, argv)(argc, argv);
    running_argv = NULL;
    return rc;
}

int cli_bad_option(const char *cmd)
{
    const char *a = running_argv && optind > 0 ? running_argv[optind - 1] : "?";
    return cli_usage_error(cmd, "unknown option, or an option without its value: '%s'", a);
}

#define STZ_API __attribute__((visibility("default")))

STZ_API int stz_command(int argc, const char *const *argv, char **json, stz_err *err)
{
    static atomic_flag busy = ATOMIC_FLAG_INIT;
    *json = NULL;
    stz_err_clear(err);
    const cli_command *cmd = argc >= 1 && argv[0] ? cli_command_find(argv[0]) : NULL;
    if (!cmd)
        return stz_err_set(err, STZ_E_ARG, "unknown command '%s'", argc >= 1 && argv[0] ? argv[0] : ""), CLI_USAGE;
    if (atomic_flag_test_and_set(&busy))
        return stz_err_set(err, STZ_E_ARG, "stz_command: another command is running in this process"), CLI_USAGE;
    /* the commands' getopt permutes its argv: a copy of the pointers */
    char **args = calloc((size_t)argc + 1, sizeof *args);
    if (!args) {
        atomic_flag_clear(&busy);
        return stz_err_set(err, STZ_E_NOMEM, "out of memory for %d arguments", argc), CLI_ERROR;
    }
    memcpy(args, argv, (size_t)argc * sizeof *args);
    cli_capture cap = {0};
    cli_capture_set(&cap);
    stz_interrupt_clear();
    optind = 0; /* glibc: getopt starts again from scratch */
    int rc = cli_run(cmd, argc, args);
    cli_capture_set(NULL);
    free(args);
    if (rc == CLI_ERROR || rc == CLI_USAGE) {
        *err = cap.err;
        if (!err->code)
            stz_err_set(err, rc == CLI_USAGE ? STZ_E_ARG : STZ_E_IO, "stz %s failed (exit status %d)", argv[0], rc);
        free(cap.json);
    } else {
        *json = cap.json;
    }
    atomic_flag_clear(&busy);
    return rc;
}

STZ_API void stz_command_free(char *json) { free(json); }

size_t stz_struct_size(const char *name)
{
    static const struct {
        const char *name;
        size_t size;
    } known[] = {{"stz_err", sizeof(stz_err)},
                 {"stz_tensor", sizeof(stz_tensor)},
                 {"stz_qtensor", sizeof(stz_qtensor)},
                 {"stz_model_set", sizeof(stz_model_set)},
                 {"stz_metrics", sizeof(stz_metrics)},
                 {"stz_eval_row", sizeof(stz_eval_row)},
                 {"stz_eval_problem", sizeof(stz_eval_problem)},
                 {"stz_eval_result", sizeof(stz_eval_result)},
                 {"stz_policy_rule_text", sizeof(stz_policy_rule_text)},
                 {"stz_policy_spec", sizeof(stz_policy_spec)},
                 {"stz_seq_spec", sizeof(stz_seq_spec)},
                 {"stz_compress_params", sizeof(stz_compress_params)},
                 {"stz_quant_stats", sizeof(stz_quant_stats)},
                 {"stz_compress_result", sizeof(stz_compress_result)},
                 {"stz_tune_run_params", sizeof(stz_tune_run_params)},
                 {"stz_tune_result", sizeof(stz_tune_result)}};
    for (size_t i = 0; name && i < sizeof known / sizeof *known; i++)
        if (!strcmp(name, known[i].name))
            return known[i].size;
    return 0;
}
