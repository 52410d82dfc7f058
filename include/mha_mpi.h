/*
 * libmha over MPI: tensor-parallel layers and sequence-parallel attention
 * across the ranks of a communicator (docs/design.md, "MPI").
 *
 * An optional component: the library libmha_mpi, built when meson finds
 * an MPI implementation, on top of libmha (which itself never calls MPI).
 * Only the MPI standard is used (Open MPI and MPICH alike).
 *
 * Every function taking or holding a communicator is COLLECTIVE over it:
 * every rank calls it, in the same order relative to its other collective
 * calls on that communicator, from one thread at a time (MPI must be
 * initialised; MPI_THREAD_FUNNELED suffices when one thread calls them,
 * MPI_THREAD_SERIALIZED when several take turns). Each rank's engine
 * computes its part on that rank's threads.
 *
 * Errors never hang and never abort: each rank first checks its own
 * arguments in full (as mha_attention_check does), then the ranks agree
 * on validity with one small collective (an MPI_Allreduce of each rank's
 * status and of the values that must match across ranks) before any data
 * moves. A bad argument on any rank, or values that differ between ranks,
 * give every rank the same status; mha_mpi_last_error() names the field
 * and, on the other ranks, the rank that refused ("rank 1: q.heads (3)
 * ..."). Outputs are written only after every rank has computed its part.
 * A communicator of MPI_COMM_NULL is refused locally (there is no one to
 * agree with); failures of MPI itself follow the communicator's error
 * handler (MPI_ERRORS_ARE_FATAL by default) and otherwise return
 * MHA_ERR_BAD_ARGUMENT with MPI's message.
 *
 * Results are deterministic: partial results are summed or merged in rank
 * order by this library (never by an MPI reduction whose order the MPI
 * implementation picks), so every run and every thread count give the same
 * bits at a given number of ranks.
 */
#ifndef MHA_MPI_H
#define MHA_MPI_H

#include <mpi.h>

#include "mha.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The message of the last failed mha_mpi call on this thread ("" if none
 * has failed): a local libmha failure's own message, or "rank R: ..." for
 * a failure another rank reported. */
MHA_API const char *mha_mpi_last_error(void);

/* ------------------------------------------------------------------ */
/* Tensor-parallel layer (Megatron's head sharding)                    */

typedef struct mha_mpi_layer mha_mpi_layer;

/* Rank r of P owns heads [r * H / P, (r + 1) * H / P) of desc->num_heads
 * (H % P != 0: MHA_ERR_BAD_SHAPE on every rank): the rows of Wq, Wk, Wv
 * and the columns of Wo for those heads. desc holds either the full
 * PyTorch-layout state dict on every rank (shard_sliced 0; the library
 * slices it) or, with shard_sliced nonzero, each rank's own slices
 * (mha_layer_desc's sliced form) with the full out_proj_bias [E].
 * desc->shard_first and shard_heads must be 0 (the library sets them) or
 * equal to the rank's. The layer copies what it needs and duplicates comm
 * (its traffic never mixes with the caller's). The engine must outlive
 * the layer. */
MHA_API mha_status mha_mpi_layer_create(const mha_engine *engine,
                                        MPI_Comm comm,
                                        const mha_layer_desc *desc,
                                        mha_mpi_layer **layer);
/* Collective (it frees the duplicated communicator); NULL is a no-op. */
MHA_API void mha_mpi_layer_destroy(mha_mpi_layer *layer);
/* The heads this rank computes. */
MHA_API void mha_mpi_layer_heads(const mha_mpi_layer *layer, int64_t *first,
                                 int64_t *count);

/* One forward, as mha_layer_forward_ex with the same inputs on every rank
 * (query, key, value, mask, terms: arrays with a head axis are the full
 * layer's). Each rank computes its heads and its share of the output
 * projection; the shares are summed in rank order (a reduce-scatter of
 * row slices and an all-gather, so each rank sends and receives about
 * 2 (P-1)/P of the output), out_proj_bias is added once, and every rank
 * gets the full out. weights and lse cover the rank's own heads:
 * [B, H/P, Lq, Lk] and [B, H/P, Lq] (average_weights is refused:
 * MHA_ERR_UNSUPPORTED). B * Lq must be below 2^31. */
MHA_API mha_status mha_mpi_layer_forward(const mha_mpi_layer *layer,
                                         const mha_layer_args *args);

/* ------------------------------------------------------------------ */
/* Sequence-parallel attention                                         */

/* Attention over keys split across the ranks of comm: rank r holds a
 * contiguous range of positions, ranks in order (rank 0 the first
 * positions); q, the mask's causal mode, the scale and the score terms are
 * the same on every rank (checked), k and v the rank's own shard of at
 * least one key (any K/V dtype; a rank's dtype may differ from another's).
 * Each rank attends to its shard at the global positions (terms.key_offset
 * and key_total are set by the library from the ranks' key counts, so
 * causal masks, windows and ALiBi are right across shard edges; the
 * caller's must be 0), the sink joins rank 0's part only, and the partial
 * (out, lse) pairs are gathered and merged in rank order
 * (mha_merge_states) into the same out (and lse, if asked) on every rank:
 * the attention over all the keys, as one mha_attention call would give it
 * within fp32 rounding. Mask arrays (keep, bias, key_lengths, key_keep)
 * index the rank's own keys. weights are refused (MHA_ERR_UNSUPPORTED):
 * ask for lse. */
MHA_API mha_status mha_mpi_attention(const mha_engine *engine, MPI_Comm comm,
                                     const mha_attention_args *args);

/* The continuous-batch form (mha_attention_varlen): queries the same on
 * every rank, each sequence's keys split across the ranks in rank order,
 * packed (cu_seqlens_k) or paged (a rank's own pool and block tables); a
 * rank may hold no keys of a sequence. Positions per sequence are set by
 * the library (terms.key_offsets / key_totals must be NULL). As
 * mha_mpi_attention otherwise. */
MHA_API mha_status mha_mpi_attention_varlen(const mha_engine *engine,
                                            MPI_Comm comm,
                                            const mha_varlen_args *args);

#ifdef __cplusplus
}
#endif

#endif /* MHA_MPI_H */
