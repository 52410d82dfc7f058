/* The online-softmax step of the bf16 path: avx512's driver and
 * primitives with a shorter exp (kernels/avx512/softmax.c,
 * MK_AVX512_EXP_BF16), as mk_avx512bf16_softmax_update. Its P is rounded
 * to bf16 before P·V, so an exp of 2.7e-6 relative error is far inside
 * that rounding; the row sums stay fp32. (The table's normalize stays
 * avx512's: this file's twin is not used.) */
#define MK_AVX512_EXP_BF16 1
#define MK_AVX512_SOFTMAX_ISA avx512bf16
#include "avx512/softmax.c"
