/* The tensor-parallel layer's benchmark (issue 16): nn.MultiheadAttention
 * self-attention E = 1024, H = 16, L = 2048, B = 1 through
 * mha_mpi_layer_forward, on however many ranks mpirun starts, each with
 * --threads threads. scripts/bench runs it as 2 ranks x 1 thread and as
 * 1 rank x 2 threads on one machine: their ratio is the price of the
 * communication (the ranks compute the same FLOPs as the threads).
 *
 * Each repetition starts at a barrier and lasts until the slowest rank is
 * done (MPI_Allreduce MAX); rank 0 prints the median and appends one JSON
 * object per run to --json FILE.
 *
 *   mpirun -np 2 bench/mpi_layer --threads 1 [--reps 7] [--json FILE]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mha_mpi.h"

enum { B = 1, L = 2048, E = 1024, H = 16 };

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void fill(float *x, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        x[i] = ((float)(seed >> 8) / 16777216.0f - 0.5f) * 0.06f;
    }
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, size, threads = 1, reps = 7;
    const char *json = NULL;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--json") && i + 1 < argc)
            json = argv[++i];
    }
    if (reps < 1 || reps > 1000)
        reps = 7;
    float *w = malloc(sizeof(float) * 4 * E * E);
    float *x = malloc(sizeof(float) * B * L * E);
    float *y = malloc(sizeof(float) * B * L * E);
    double *t = malloc(sizeof(double) * (size_t)reps);
    if (!w || !x || !y || !t)
        MPI_Abort(MPI_COMM_WORLD, 1);
    fill(w, 4 * E * E, 1);
    fill(x, B * L * E, 2);
    const mha_layer_desc desc = {.embed_dim = E, .num_heads = H,
                                 .in_proj_weight = w,
                                 .out_proj_weight = w + 3 * E * E};
    mha_config cfg = {.num_threads = threads};
    mha_engine *engine = NULL;
    mha_mpi_layer *tp = NULL;
    mha_status st = mha_engine_create(&cfg, &engine);
    if (st == MHA_OK)
        st = mha_mpi_layer_create(engine, MPI_COMM_WORLD, &desc, &tp);
    const mha_layer_args args = {.query = x, .key = x, .value = x, .out = y,
                                 .batch = B, .lq = L, .lk = L};
    for (int r = -1; st == MHA_OK && r < reps; r++) { /* -1: warm-up */
        MPI_Barrier(MPI_COMM_WORLD);
        double t0 = MPI_Wtime();
        st = mha_mpi_layer_forward(tp, &args);
        double dt = MPI_Wtime() - t0, slowest;
        MPI_Allreduce(&dt, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        if (r >= 0)
            t[r] = slowest;
    }
    if (st != MHA_OK) {
        fprintf(stderr, "rank %d: %s: %s\n", rank, mha_status_string(st),
                mha_mpi_last_error());
        MPI_Finalize();
        return 1;
    }
    qsort(t, (size_t)reps, sizeof *t, cmp);
    double median = t[reps / 2];
    /* Projections 8 B L E^2, attention 4 B H L^2 (E / H). */
    double flops = 8.0 * B * L * (double)E * E + 4.0 * B * L * (double)L * E;
    if (rank == 0) {
        char name[128];
        snprintf(name, sizeof name, "layer_mpi/B%d_H%d_L%d_D%d/%s/ranks:%dx%d",
                 B, H, L, E / H, mha_isa_name(mha_engine_isa(engine)), size,
                 threads);
        printf("%-48s %9.2f ms  %7.1f GFLOP/s  (median of %d)\n", name,
               median * 1e3, flops / median * 1e-9, reps);
        if (json) {
            FILE *f = fopen(json, "a");
            if (f) {
                fprintf(f, "{\"name\": \"%s\", \"ranks\": %d, \"threads\": %d, "
                        "\"median_s\": %.9g, \"gflops\": %.6g, \"reps\": %d}\n",
                        name, size, threads, median, flops / median * 1e-9,
                        reps);
                fclose(f);
            }
        }
    }
    mha_mpi_layer_destroy(tp);
    mha_engine_destroy(engine);
    free(w), free(x), free(y), free(t);
    MPI_Finalize();
    return 0;
}
