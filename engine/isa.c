/* The ISA registry: the one list of the ISAs libmha knows. Each row names
 * an ISA, its CPU detection and its table initialiser (NULL when the build
 * lacks the table); the public names, the MHA_ISA variable, the enum range
 * check, MHA_ISA_AUTO's order and every list tests, fuzz and bench walk
 * (through mha_isas) come from it. Adding an ISA adds a row here
 * (docs/design.md, "Recipe: add an ISA"). */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"

typedef struct {
    mha_isa isa;
    const char *name;
    int (*cpu_runs)(void);          /* uncached detection (cpu.c) */
    void (*init)(mk_table *table);  /* NULL: not compiled into this build */
} isa_row;

static int always(void) { return 1; }

#ifdef MHA_HAVE_AVX512
#define INIT_AVX512 mk_init_avx512
#else
#define INIT_AVX512 NULL
#endif
#ifdef MHA_HAVE_AVX512BF16
#define INIT_AVX512BF16 mk_init_avx512bf16
#else
#define INIT_AVX512BF16 NULL
#endif
#ifdef MHA_HAVE_AMXBF16
#define INIT_AMXBF16 mk_init_amxbf16
#else
#define INIT_AMXBF16 NULL
#endif
#ifdef MHA_HAVE_AVX2
#define INIT_AVX2 mk_init_avx2
#else
#define INIT_AVX2 NULL
#endif
#ifdef MHA_HAVE_NEONBF16
#define INIT_NEONBF16 mk_init_neonbf16
#else
#define INIT_NEONBF16 NULL
#endif
#ifdef MHA_HAVE_NEONFHM
#define INIT_NEONFHM mk_init_neonfhm
#else
#define INIT_NEONFHM NULL
#endif
#ifdef MHA_HAVE_NEON
#define INIT_NEON mk_init_neon
#else
#define INIT_NEON NULL
#endif

/* Best first: MHA_ISA_AUTO takes the first row the build and CPU have.
 * Each initialiser calls its base's first (amxbf16 on avx512bf16,
 * avx512bf16 on avx512, avx512 on avx2, neonbf16 on neonfhm, neonfhm on
 * neon, the others on generic), so a slot an ISA leaves comes from the
 * nearest table.
 * X(enum value, name, detection, initialiser) */
#define ISA_ROWS(X)                                                  \
    X(MHA_ISA_AMX_BF16, "amxbf16", mha_cpu_detect_amx_bf16,            \
      INIT_AMXBF16)                                                  \
    X(MHA_ISA_AVX512_BF16, "avx512bf16", mha_cpu_detect_avx512_bf16,   \
      INIT_AVX512BF16)                                               \
    X(MHA_ISA_AVX512, "avx512", mha_cpu_detect_avx512, INIT_AVX512) \
    X(MHA_ISA_AVX2, "avx2", mha_cpu_detect_avx2_fma, INIT_AVX2)     \
    X(MHA_ISA_NEON_BF16, "neonbf16", mha_cpu_detect_neon_bf16,         \
      INIT_NEONBF16)                                                 \
    X(MHA_ISA_NEON_FHM, "neonfhm", mha_cpu_detect_neon_fhm,           \
      INIT_NEONFHM)                                                  \
    X(MHA_ISA_NEON, "neon", mha_cpu_detect_neon, INIT_NEON)         \
    X(MHA_ISA_GENERIC, "generic", always, mk_init_generic)

#define AS_ROW(isa, name, detect, init) {isa, name, detect, init},
#define AS_ENUM(isa, name, detect, init) isa,
static const isa_row registry[] = {ISA_ROWS(AS_ROW)};
static const mha_isa registry_isas[] = {ISA_ROWS(AS_ENUM)};
enum { NROWS = sizeof registry / sizeof registry[0] };

static const isa_row *row_of(mha_isa isa)
{
    for (int i = 0; i < NROWS; i++)
        if (registry[i].isa == isa)
            return &registry[i];
    return NULL;
}

/* Detection results, cached per row (0: not yet known; 1: no; 2: yes).
 * A benign race: every thread computes the same answer. */
static atomic_int detected[NROWS];

static int cpu_runs(const isa_row *r)
{
    atomic_int *state = &detected[r - registry];
    int s = atomic_load_explicit(state, memory_order_acquire);
    if (s == 0) {
        s = r->cpu_runs() ? 2 : 1;
        atomic_store_explicit(state, s, memory_order_release);
    }
    return s == 2;
}

const char *mha_isa_name(mha_isa isa)
{
    if (isa == MHA_ISA_AUTO)
        return "auto";
    const isa_row *r = row_of(isa);
    return r ? r->name : "unknown";
}

const mha_isa *mha_isas(size_t *count)
{
    if (count)
        *count = NROWS;
    return registry_isas;
}

int mha_isa_available(mha_isa isa)
{
    const isa_row *r = row_of(isa);
    return r && r->init && cpu_runs(r);
}

/* "auto, avx512, avx2, ..." for messages. */
static const char *known_names(char *buf, size_t size)
{
    snprintf(buf, size, "auto");
    for (int i = 0; i < NROWS; i++) {
        size_t used = strlen(buf);
        snprintf(buf + used, size - used, ", %s", registry[i].name);
    }
    return buf;
}

mha_status mha_isa_from_name(const char *name, mha_isa *isa)
{
    char names[128];
    if (!name || !isa)
        return mha_fail(MHA_ERR_NULL_POINTER, "%s is NULL",
                        !name ? "name" : "isa (output)");
    if (strcmp(name, "auto") == 0) {
        *isa = MHA_ISA_AUTO;
        return MHA_OK;
    }
    for (int i = 0; i < NROWS; i++)
        if (strcmp(name, registry[i].name) == 0) {
            *isa = registry[i].isa;
            return MHA_OK;
        }
    return mha_fail(MHA_ERR_BAD_ARGUMENT,
                    "name \"%.32s\" is not an ISA (one of %s)", name,
                    known_names(names, sizeof names));
}

mha_status mha_dispatch(mha_isa isa, mha_isa *picked, mk_table *table)
{
    char names[128];
    if (isa == MHA_ISA_AUTO) {
        const char *env = getenv("MHA_ISA");
        if (env && *env && mha_isa_from_name(env, &isa) != MHA_OK)
            return mha_fail(MHA_ERR_UNSUPPORTED,
                            "MHA_ISA=%.32s is not one of %s", env,
                            known_names(names, sizeof names));
    }
    const isa_row *r = NULL;
    if (isa == MHA_ISA_AUTO) {
        for (int i = 0; i < NROWS && !r; i++)
            if (registry[i].init && cpu_runs(&registry[i]))
                r = &registry[i];
    } else if (!(r = row_of(isa))) {
        return mha_fail(MHA_ERR_BAD_ARGUMENT,
                        "config.isa (%d) is not an mha_isa (one of %s)",
                        (int)isa, known_names(names, sizeof names));
    }
    if (!r->init)
        return mha_fail(MHA_ERR_UNSUPPORTED,
                        "ISA %s is not compiled into this build", r->name);
    if (!cpu_runs(r))
        return mha_fail(MHA_ERR_UNSUPPORTED, "this CPU cannot run ISA %s",
                        r->name);
    memset(table, 0, sizeof *table);
    r->init(table);
    *picked = r->isa;
    return MHA_OK;
}
