/* stz: entry point and command dispatch. */
#include "cli.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>

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
        cli_usage(stderr);
        return CLI_USAGE;
    }
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        cli_usage(stdout);
        return CLI_OK;
    }
    if (!strcmp(argv[1], "-V") || !strcmp(argv[1], "--version")) {
        printf("stz %s\n", STZ_VERSION_STRING);
        return CLI_OK;
    }
    const cli_command *cmd = cli_command_find(argv[1]);
    if (!cmd) {
        fprintf(stderr, "stz: unknown command '%s'\n\n", argv[1]);
        cli_usage(stderr);
        return CLI_USAGE;
    }
    /* under mpirun: the commands that share a directory's shards */
    if (cli_mpi_start(&argc, &argv) > 1 && strcmp(argv[1], "compress") && strcmp(argv[1], "decompress") &&
        strcmp(argv[1], "verify")) {
        if (cli_mpi_rank() == 0)
            cli_usage_error(argv[1],
                            "under mpirun only compress, decompress and verify run (of sharded "
                            "model directories)");
        cli_mpi_end();
        return CLI_USAGE;
    }
    int rc = cli_run(cmd, argc - 1, argv + 1);
    cli_mpi_end();
    return rc;
}
