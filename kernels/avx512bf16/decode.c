/* The avx512bf16 table's decode kernels: avx512's (kernels/avx512/decode.c)
 * built with AVX512-VBMI, which that table also requires, so E4M3 codes
 * widen through byte lookups (MK_AVX512_VBMI) rather than through
 * binary16. Every value is the same as avx512's: the lookups give the
 * exact value where the binary16 path gives it times 2^-8 and undoes that
 * in the row's factor, both exact. */
#define MK_AVX512_VBMI 1
#define MK_AVX512_DECODE_ISA avx512bf16
#include "avx512/decode.c"
