/* CPU feature detection for the ISA registry (isa.c caches the answers).
 * Compiled without ISA flags. */
#define _DEFAULT_SOURCE /* syscall */
#include "engine.h"

#include <stdatomic.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#if defined(__linux__)
#include <sys/syscall.h>
#endif

static int detect_avx2_fma(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d))
        return 0;
    /* The avx2 table also widens binary16 with F16C (every AVX2 CPU has
     * it, but ask anyway). */
    const unsigned fma = 1u << 12, osxsave = 1u << 27, avx = 1u << 28,
                   f16c = 1u << 29;
    const unsigned need = fma | osxsave | avx | f16c;
    if ((c & need) != need)
        return 0;
    /* The OS must save the XMM and YMM state (XCR0 bits 1 and 2). */
    unsigned xlo, xhi;
    __asm__ volatile("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
    (void)xhi;
    if ((xlo & 6u) != 6u)
        return 0;
    if (__get_cpuid_max(0, NULL) < 7)
        return 0;
    __cpuid_count(7, 0, a, b, c, d);
    return (b & (1u << 5)) != 0; /* AVX2 */
}

/* The avx512 table needs AVX-512F, DQ, BW and VL (CPUID leaf 7 EBX bits
 * 16, 17, 30, 31) and an OS that saves the opmask and the whole ZMM state
 * (XCR0 bits 5, 6, 7 besides 1 and 2). It also runs the avx2 table's
 * kernels for the slots it leaves, so AVX2+FMA is required too. */
static int detect_avx512(void)
{
    if (!detect_avx2_fma()) /* also: OSXSAVE, so XGETBV exists */
        return 0;
    unsigned a, b, c, d;
    __cpuid_count(7, 0, a, b, c, d);
    const unsigned f = 1u << 16, dq = 1u << 17, bw = 1u << 30,
                   vl = 1u << 31;
    if ((b & (f | dq | bw | vl)) != (f | dq | bw | vl))
        return 0;
    unsigned xlo, xhi;
    __asm__ volatile("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
    (void)xhi;
    const unsigned state = (1u << 1) | (1u << 2) | (1u << 5) | (1u << 6) |
                           (1u << 7);
    return (xlo & state) == state;
}

/* The avx512bf16 table: the avx512 table's needs plus AVX512-VBMI (CPUID
 * leaf 7 ECX bit 1; its decode kernels' byte lookups) and AVX512-BF16
 * (leaf 7 subleaf 1 EAX bit 5). Every CPU with AVX512-BF16 but Cooper
 * Lake has VBMI; Cooper Lake runs the avx512 table. */
static int detect_avx512_bf16(void)
{
    if (!detect_avx512())
        return 0;
    unsigned a, b, c, d;
    __cpuid_count(7, 0, a, b, c, d);
    if (a < 1 || !(c & (1u << 1))) /* no subleaf 1, or no VBMI */
        return 0;
    __cpuid_count(7, 1, a, b, c, d);
    return (a & (1u << 5)) != 0;
}

/* The amxbf16 table: the avx512bf16 table's needs plus AMX-TILE and
 * AMX-BF16 (CPUID leaf 7 EDX bits 24 and 22), an OS that enables the tile
 * state (XCR0 bits 17 and 18) and, on Linux, this process's permission to
 * use the tile data (arch_prctl ARCH_REQ_XCOMP_PERM for XTILEDATA, Linux
 * 5.16 and later): without it the first tile instruction faults. The
 * request is process-wide and idempotent; the registry makes it once. */
static int detect_amx_bf16(void)
{
    if (!detect_avx512_bf16())
        return 0;
    unsigned a, b, c, d;
    __cpuid_count(7, 0, a, b, c, d);
    const unsigned amx_bf16 = 1u << 22, amx_tile = 1u << 24;
    if ((d & (amx_bf16 | amx_tile)) != (amx_bf16 | amx_tile))
        return 0;
    unsigned xlo, xhi;
    __asm__ volatile("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
    (void)xhi;
    const unsigned tiles = (1u << 17) | (1u << 18);
    if ((xlo & tiles) != tiles)
        return 0;
#if defined(__linux__)
    const long arch_req_xcomp_perm = 0x1023, xfeature_xtiledata = 18;
    if (syscall(SYS_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata) != 0)
        return 0;
#endif
    return 1;
}
#else
static int detect_avx2_fma(void) { return 0; }
static int detect_avx512(void) { return 0; }
static int detect_avx512_bf16(void) { return 0; }
static int detect_amx_bf16(void) { return 0; }
#endif

#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMD
#define HWCAP_ASIMD (1 << 1)
#endif
static int detect_neon(void)
{
    return (getauxval(AT_HWCAP) & HWCAP_ASIMD) != 0;
}
#elif defined(__aarch64__)
static int detect_neon(void) { return 1; } /* baseline of AArch64 */
#else
static int detect_neon(void) { return 0; }
#endif

/* The neonfhm table: NEON plus half-precision arithmetic and FEAT_FHM
 * (HWCAP_ASIMDHP, HWCAP_ASIMDFHM); the neonbf16 table, built on it, also
 * FEAT_BF16 (HWCAP2_BF16). */
#if defined(__aarch64__) && defined(__linux__)
#ifndef HWCAP_ASIMDHP
#define HWCAP_ASIMDHP (1 << 10)
#endif
#ifndef HWCAP_ASIMDFHM
#define HWCAP_ASIMDFHM (1 << 23)
#endif
#ifndef HWCAP2_BF16
#define HWCAP2_BF16 (1 << 14)
#endif
static int detect_neon_fhm(void)
{
    unsigned long want = HWCAP_ASIMDHP | HWCAP_ASIMDFHM;
    return detect_neon() && (getauxval(AT_HWCAP) & want) == want;
}
static int detect_neon_bf16(void)
{
    return detect_neon_fhm() && (getauxval(AT_HWCAP2) & HWCAP2_BF16) != 0;
}
#else
static int detect_neon_fhm(void) { return 0; }
static int detect_neon_bf16(void) { return 0; }
#endif

int mha_cpu_detect_avx2_fma(void) { return detect_avx2_fma(); }
int mha_cpu_detect_avx512(void) { return detect_avx512(); }
int mha_cpu_detect_avx512_bf16(void) { return detect_avx512_bf16(); }
int mha_cpu_detect_amx_bf16(void) { return detect_amx_bf16(); }
int mha_cpu_detect_neon(void) { return detect_neon(); }
int mha_cpu_detect_neon_bf16(void) { return detect_neon_bf16(); }
int mha_cpu_detect_neon_fhm(void) { return detect_neon_fhm(); }

/* A value computed once per process and kept in *slot (0 until then): a
 * benign race, every thread computes the same answer. */
static long long cached(atomic_llong *slot, long long (*compute)(void))
{
    long long v = atomic_load_explicit(slot, memory_order_relaxed);
    if (v == 0) {
        v = compute();
        atomic_store_explicit(slot, v, memory_order_relaxed);
    }
    return v;
}

/* 2 when CPUID leaf 0 names Intel ("GenuineIntel"), else 1 (off x86
 * too): never 0, which cached() reads as not yet known. */
static long long vendor_intel(void)
{
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, c, d;
    if (__get_cpuid(0, &a, &b, &c, &d) && b == 0x756e6547u &&
        d == 0x49656e69u && c == 0x6c65746eu) /* "Genu" "ineI" "ntel" */
        return 2;
#endif
    return 1;
}

int mha_cpu_is_intel(void)
{
    static atomic_llong known;
    return cached(&known, vendor_intel) == 2;
}

/* The L1 data cache's bytes as the C library reports them (from CPUID on
 * x86), 32 KiB when it does not (the smallest of the CPUs these tables
 * run on). */
static long long l1d_bytes(void)
{
    long v = -1;
#ifdef _SC_LEVEL1_DCACHE_SIZE
    v = sysconf(_SC_LEVEL1_DCACHE_SIZE);
#endif
    return v >= 16384 && v <= (1L << 22) ? v : 32768;
}

int64_t mha_cpu_l1d_bytes(void)
{
    static atomic_llong bytes;
    return (int64_t)cached(&bytes, l1d_bytes);
}

/* The L1 data cache's ways and the bytes of one way (the stride at which
 * addresses share a set), as the C library reports them, packed as ways
 * << 32 | bytes; 8 and 4096 when it does not, or when they do not divide
 * mha_cpu_l1d_bytes into a power of two of at least 1 KiB (x86's L1s are
 * 64 sets of 64-byte lines: 8 ways in 32 KiB, 12 in 48 KiB). */
static long long l1d_ways(void)
{
    long ways = -1;
#ifdef _SC_LEVEL1_DCACHE_ASSOC
    ways = sysconf(_SC_LEVEL1_DCACHE_ASSOC);
#endif
    int64_t bytes = mha_cpu_l1d_bytes();
    int64_t way = ways >= 2 && ways <= 64 && bytes % ways == 0 ? bytes / ways
                                                              : 0;
    if (way < 1024 || (way & (way - 1)) != 0)
        ways = 8, way = 4096;
    return (long long)ways << 32 | (long long)way;
}

int mha_cpu_l1d_ways(int64_t *way_bytes)
{
    static atomic_llong packed;
    long long p = cached(&packed, l1d_ways);
    *way_bytes = (int64_t)(p & 0xffffffffLL);
    return (int)(p >> 32);
}

/* Whether rows `stride` bytes apart crowd the L1 sets a register tile
 * reads them through, strip rows at every step of its depth (q rows in qk,
 * a projection's input rows in linear): rows a multiple of a way's bytes
 * apart (4 KiB: 64 sets of 64-byte lines, in a 32 KiB 8-way or 48 KiB
 * 12-way L1) share one set, a stride whose lowest set bit below that is b
 * repeats a set every way / b rows, and more than half the ways of a strip
 * in one set leave the tile's panel (keys, weights) too few. On Zen 4's 8
 * ways, 12 rows 4 or 2 KiB apart or 6 and 8 rows 4 KiB apart (32 heads of
 * 128, 16 or 8 of 64) computed 1.05-1.20x copied on AVX-512; rows that do
 * not crowd (avx2 at 2 KiB, avx512 at 3 KiB) computed level, the copy
 * 1.5-2% of perf's samples for nothing. On Intel's 12 ways, 6 avx512 rows
 * a set (2 KiB apart) computed 1.01-1.03x in place and 6 avx2 rows level
 * (docs/benchmarks.md). */
int mha_rows_crowd(int64_t stride, int64_t strip)
{
    int64_t way;
    uint64_t ways = (uint64_t)mha_cpu_l1d_ways(&way);
    uint64_t g = (uint64_t)stride % (uint64_t)way;
    uint64_t period = g == 0 ? 1 : (uint64_t)way / (g & (~g + 1));
    return (uint64_t)strip > ways / 2 * period;
}
