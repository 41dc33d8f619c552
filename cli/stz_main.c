/* stz: entry point and command dispatch. */
#include "cli.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>

static const cli_command commands[] = {
    {"compress", cmd_compress, "policy -> quantize / SVD -> pack, in one command (or --lossless)"},
    {"decompress", cmd_decompress, "back from a container (--dequantize: a plain float model)"},
    {"inspect", cmd_inspect, "list the tensors, dtypes, sizes and metadata of a file"},
    {"policy", cmd_policy, "list the shipped policies, or print one"},
    {"plan", cmd_plan, "show what a policy would do to each tensor"},
    {"quantize", cmd_quantize, "quantize tensors to INT8 / INT4 as a policy says"},
    {"dequantize", cmd_dequantize, "turn a quantized file back into a plain float model"},
    {"eval", cmd_eval, "measure how close a quantized model is to the original"},
    {"tune", cmd_tune, "choose each tensor's action for a size or KL budget (writes a policy)"},
    {"pack", cmd_pack, "pack a SafeTensors file losslessly into an .stz container"},
    {"unpack", cmd_unpack, "restore the original file (or one tensor) from a container"},
    {"verify", cmd_verify, "check every checksum of containers without writing"},
    {"export", cmd_export, "write a model as GGUF for llama.cpp (--gguf)"},
    {"synth", cmd_synth, "generate a realistic stand-in model of a real architecture"},
};
#define NCMD (sizeof commands / sizeof commands[0])

static void usage(FILE *f)
{
    fprintf(f, "stz %s - make neural-network model files small\n\n"
               "usage: stz COMMAND [OPTIONS] ...\n\ncommands:\n", STZ_VERSION_STRING);
    for (size_t i = 0; i < NCMD; i++)
        fprintf(f, "  %-12s %s\n", commands[i].name, commands[i].summary);
    fprintf(f, "\n'stz COMMAND --help' describes a command. Exit status: 0 success, 1 error, 2 usage\n"
               "(stz eval: 3 when a tensor is below --threshold; stz tune: 3 when the budget cannot be met).\n");
}

/* First signal: ask the running operation to stop (it cleans up on its
 * error path, temporary directories included). Second: remove temporary
 * files now and die of the same signal. */
static void on_signal(int sig)
{
    if (!stz_interrupt_pending()) {
        stz_interrupt_request();
        return;
    }
    stz_tmp_cleanup_all();
    signal(sig, SIG_DFL);
    raise(sig);
}

/* OpenBLAS (pthread build) starts its worker threads when it is loaded,
 * before main, and each spins on sched_yield for about 2^28 cycles before
 * sleeping: a tenth of a second of a core per thread that every command
 * pays, SVD or not (measured: 13% of `stz unpack -T 1`'s CPU samples).
 * Stopping them at once is safe: OpenBLAS starts them again on its next
 * threaded call (and on openblas_set_num_threads). Weak: other BLAS
 * libraries lack it. */
extern int blas_thread_shutdown_(void) __attribute__((weak));

int main(int argc, char **argv)
{
    if (blas_thread_shutdown_)
        blas_thread_shutdown_();
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    signal(SIGHUP, on_signal);
    if (argc < 2) {
        usage(stderr);
        return CLI_USAGE;
    }
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return CLI_OK;
    }
    if (!strcmp(argv[1], "-V") || !strcmp(argv[1], "--version")) {
        printf("stz %s\n", STZ_VERSION_STRING);
        return CLI_OK;
    }
    for (size_t i = 0; i < NCMD; i++)
        if (!strcmp(argv[1], commands[i].name)) {
            /* under mpirun: the commands that share a directory's shards */
            if (cli_mpi_start(&argc, &argv) > 1 && strcmp(argv[1], "compress") && strcmp(argv[1], "decompress") &&
                strcmp(argv[1], "verify")) {
                if (cli_mpi_rank() == 0)
                    cli_usage_error(argv[1], "under mpirun only compress, decompress and verify run (of sharded "
                                             "model directories)");
                cli_mpi_end();
                return CLI_USAGE;
            }
            int rc = commands[i].run(argc - 1, argv + 1);
            cli_mpi_end();
            return rc;
        }
    fprintf(stderr, "stz: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return CLI_USAGE;
}
