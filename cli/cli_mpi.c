/* Several processes (MPI ranks) sharing the shards of a model directory:
 * `mpirun -n N stz compress DIR -o OUT`. Built with MPI when CMake finds it
 * (STZ_HAVE_MPI); MPI starts only when a launcher started the process, so
 * a plain `stz` run never touches it. Without MPI: one process. */
#include "cli.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#ifdef STZ_HAVE_MPI
#include <mpi.h>

static int g_on, g_rank, g_size = 1;

int cli_mpi_start(int *argc, char ***argv)
{
    if (!getenv("OMPI_COMM_WORLD_SIZE") && !getenv("PMIX_RANK") && !getenv("PMI_SIZE"))
        return 1;
    if (MPI_Init(argc, argv) != MPI_SUCCESS)
        return 1;
    g_on = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    return g_size;
}

void cli_mpi_end(void)
{
    if (g_on)
        MPI_Finalize();
    g_on = 0;
}

int cli_mpi_rank(void) { return g_rank; }
int cli_mpi_size(void) { return g_size; }

void cli_mpi_bcast(void *buf, size_t n, int root)
{
    if (g_size > 1)
        MPI_Bcast(buf, (int)n, MPI_BYTE, root, MPI_COMM_WORLD);
}

void cli_mpi_sum(double *v, int n)
{
    if (g_size > 1)
        MPI_Allreduce(MPI_IN_PLACE, v, n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
}

int cli_mpi_min_rank(double v)
{
    struct {
        double v;
        int rank;
    } in = {v, g_rank}, out = in;
    if (g_size > 1)
        MPI_Allreduce(&in, &out, 1, MPI_DOUBLE_INT, MPI_MINLOC, MPI_COMM_WORLD);
    return out.rank;
}

int cli_mpi_failed(int failed, stz_err *err)
{
    if (g_size < 2)
        return failed;
    int first = failed ? g_rank : g_size, who;
    MPI_Allreduce(&first, &who, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (who == g_size)
        return 0;
    MPI_Bcast(err, (int)sizeof *err, MPI_BYTE, who, MPI_COMM_WORLD);
    return 1;
}
#else
int cli_mpi_start(int *argc, char ***argv) { return (void)argc, (void)argv, 1; }
void cli_mpi_end(void) {}
int cli_mpi_rank(void) { return 0; }
int cli_mpi_size(void) { return 1; }
void cli_mpi_bcast(void *buf, size_t n, int root) { (void)buf, (void)n, (void)root; }
void cli_mpi_sum(double *v, int n) { (void)v, (void)n; }
int cli_mpi_min_rank(double v) { return (void)v, 0; }
int cli_mpi_failed(int failed, stz_err *err) { return (void)err, failed; }
#endif

int *cli_mpi_share(char *const *files, size_t n)
{
    int ranks = cli_mpi_size(), *owner = calloc(n + 1, sizeof *owner);
    double *sizes = calloc(n + 1, sizeof *sizes), *load = calloc((size_t)ranks, sizeof *load);
    size_t *order = calloc(n + 1, sizeof *order);
    struct stat sb;
    if (owner && sizes && load && order) {
        for (size_t f = 0; f < n; f++)
            sizes[f] = stat(files[f], &sb) == 0 ? (double)sb.st_size : 0;
        stz_largest_first(sizes, n, order);
        for (size_t k = 0; k < n; k++) { /* to the least loaded rank (ties: the lowest) */
            int best = 0;
            for (int r = 1; r < ranks; r++)
                best = load[r] < load[best] ? r : best;
            load[best] += sizes[order[k]];
            owner[order[k]] = best;
        }
    } else {
        free(owner), owner = NULL;
    }
    free(sizes), free(load), free(order);
    return owner;
}

static void ranks_bcast(void *user, void *buf, size_t n, int root) { (void)user, cli_mpi_bcast(buf, n, root); }
static int ranks_failed(void *user, int failed, stz_err *err) { return (void)user, cli_mpi_failed(failed, err); }
static void ranks_sum(void *user, double *v, int n) { (void)user, cli_mpi_sum(v, n); }
static int ranks_min(void *user, double v) { return (void)user, cli_mpi_min_rank(v); }

const stz_ranks *cli_ranks(void)
{
    static stz_ranks ranks = {0, 1, ranks_bcast, ranks_failed, ranks_sum, ranks_min, NULL};
    ranks.rank = cli_mpi_rank();
    ranks.size = cli_mpi_size();
    return &ranks;
}

int cli_shards_run(const char *in, const char *out, const char *in_suffix, const char *out_suffix, int rewrite_index,
                   int threads, int quiet, stz_shard_fn convert, void *user)
{
    stz_shards_params p = {.in_suffix = in_suffix,
                           .out_suffix = out_suffix,
                           .rewrite_index = rewrite_index,
                           .threads = threads,
                           .quiet = quiet,
                           .convert = convert,
                           .user = user,
                           .ranks = cli_ranks()};
    stz_err err;
    if (!stz_convert_shards(&p, in, out, &err))
        return CLI_OK;
    return cli_mpi_rank() == 0 ? cli_fail(&err) : CLI_ERROR;
}
