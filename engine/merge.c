/* The split-KV merge: the partial (accumulator, max, sum) triples of a row
 * block's key chunks combined in chunk order, so the result never depends
 * on which thread computed which chunk. docs/design.md, "Plan and
 * scratch". */
#include <math.h>

#include "attention.h"

/* Each partial holds rows x dv accumulator, then rows maxima, then rows
 * sums; the first partial is reused as the total. */
void mha_merge_chunks(const mk_table *t, const mha_problem *p,
                      const mha_plan *pl, const mha_row_block *rb,
                      float *parts)
{
    int64_t dv = p->dv, stride = pl->partial_floats, rows = pl->rows;
    float *acc = parts, *macc = acc + rows * dv, *lacc = macc + rows;
    for (int64_t r = 0; r < rb->rows; r++) {
        float mx = -INFINITY;
        for (int64_t c = 0; c < pl->chunks; c++) {
            float mc = parts[c * stride + rows * dv + r];
            mx = mc > mx || mc != mc ? mc : mx; /* NaN sticks */
        }
        float *orow = acc + r * dv;
        float sum = 0.0f;
        for (int64_t c = 0; c < pl->chunks; c++) {
            const float *part = parts + c * stride;
            float mc = part[rows * dv + r];
            float f = mc == -INFINITY ? 0.0f : expf(mc - mx);
            sum += f * part[rows * dv + rows + r];
            if (c == 0)
                for (int64_t x = 0; x < dv; x++)
                    orow[x] *= f;
            else
                for (int64_t x = 0; x < dv; x++)
                    orow[x] += f * part[r * dv + x];
        }
        lacc[r] = mx == -INFINITY ? 0.0f : sum;
        macc[r] = mx;
    }
    t->normalize(acc, dv, rb->rows, dv, lacc, rb->out, rb->ldo);
}
