/* A tensor-parallel nn.MultiheadAttention(512, 8) over MPI: every rank
 * holds the same state dict, computes its H / P heads, and gets the full
 * output. Each rank prints its output's checksum beside the one a single
 * process computes with mha_layer_forward; they agree to fp32 rounding
 * (the ranks among themselves bit for bit).
 *
 *   mpirun -np 2 build/examples/mpi_layer            (one machine)
 *   mpirun -np 4 --hostfile hosts build/examples/mpi_layer
 */
#include <stdio.h>
#include <stdlib.h>

#include "mha_mpi.h"

enum { B = 2, L = 64, E = 512, H = 8 };

/* Deterministic values in [-0.05, 0.05) standing in for trained weights. */
static void fill(float *x, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        x[i] = ((float)(seed >> 8) / 16777216.0f - 0.5f) * 0.1f;
    }
}

static double checksum(const float *y, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += y[i] * (double)((i % 7) + 1);
    return s;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    float *in_proj = malloc(sizeof(float) * 3 * E * E);
    float *in_bias = malloc(sizeof(float) * 3 * E);
    float *out_proj = malloc(sizeof(float) * E * E);
    float *out_bias = malloc(sizeof(float) * E);
    float *x = malloc(sizeof(float) * B * L * E);
    float *y = malloc(sizeof(float) * B * L * E);
    float *y1 = malloc(sizeof(float) * B * L * E);
    if (!in_proj || !in_bias || !out_proj || !out_bias || !x || !y || !y1)
        MPI_Abort(MPI_COMM_WORLD, 1);
    fill(in_proj, 3 * E * E, 1);
    fill(in_bias, 3 * E, 2);
    fill(out_proj, E * E, 3);
    fill(out_bias, E, 4);
    fill(x, B * L * E, 5);
    const mha_layer_desc desc = {.embed_dim = E, .num_heads = H,
                                 .in_proj_weight = in_proj,
                                 .in_proj_bias = in_bias,
                                 .out_proj_weight = out_proj,
                                 .out_proj_bias = out_bias};
    mha_engine *engine = NULL;
    mha_mpi_layer *tp = NULL;
    mha_status st = mha_engine_create(NULL, &engine);
    /* Collective: every rank creates and runs the layer. */
    if (st == MHA_OK)
        st = mha_mpi_layer_create(engine, MPI_COMM_WORLD, &desc, &tp);
    const mha_layer_args args = {.query = x, .key = x, .value = x, .out = y,
                                 .batch = B, .lq = L, .lk = L};
    if (st == MHA_OK)
        st = mha_mpi_layer_forward(tp, &args);
    if (st != MHA_OK) {
        fprintf(stderr, "rank %d: %s: %s\n", rank, mha_status_string(st),
                mha_mpi_last_error());
        MPI_Finalize();
        return 1;
    }
    /* The same layer in one process, for comparison. */
    mha_layer *one = NULL;
    st = mha_layer_create(engine, &desc, &one);
    if (st == MHA_OK)
        st = mha_layer_forward(one, x, x, x, B, L, L, NULL, y1, NULL);
    if (st != MHA_OK) {
        fprintf(stderr, "rank %d: %s\n", rank, mha_last_error());
        MPI_Finalize();
        return 1;
    }
    int64_t first, count;
    mha_mpi_layer_heads(tp, &first, &count);
    double got = checksum(y, B * L * E), want = checksum(y1, B * L * E);
    double worst = 0;
    for (int i = 0; i < B * L * E; i++) {
        double dlt = y[i] > y1[i] ? y[i] - y1[i] : y1[i] - y[i];
        worst = dlt > worst ? dlt : worst;
    }
    for (int r = 0; r < size; r++) {
        if (r == rank)
            printf("rank %d of %d (heads %lld-%lld): checksum %.6f, one "
                   "process %.6f, max |difference| %.2e\n",
                   rank, size, (long long)first,
                   (long long)(first + count - 1), got, want, worst);
        fflush(stdout);
        MPI_Barrier(MPI_COMM_WORLD);
    }
    mha_mpi_layer_destroy(tp);
    mha_layer_destroy(one);
    mha_engine_destroy(engine);
    free(in_proj), free(in_bias), free(out_proj), free(out_bias);
    free(x), free(y), free(y1);
    MPI_Finalize();
    return worst <= 1e-4 ? 0 : 1;
}
