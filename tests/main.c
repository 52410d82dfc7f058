/* Runs one named Check suite (argv[1]) or all of them, after a line naming
 * the ISAs the suites run and those this CPU or build lacks. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

typedef Suite *(*suite_fn)(void);

static const struct {
    const char *name;
    suite_fn make;
} suites[] = {
    {"oracle", suite_oracle},       {"attention", suite_attention},
    {"masks", suite_masks},         {"layer", suite_layer},
    {"errors", suite_errors},       {"threads", suite_threads},
    {"kernels", suite_kernels},     {"softmax", suite_softmax},
    {"kernel_decode", suite_kernel_decode}, {"decode", suite_decode},
    {"stress", suite_stress},       {"api", suite_api},
    {"terms", suite_terms},
    {"quant", suite_quant},
    {"varlen", suite_varlen},
    {"compute", suite_compute},
};

int main(int argc, char **argv)
{
    SRunner *runner = NULL;
    size_t n = sizeof suites / sizeof suites[0];
    for (size_t i = 0; i < n; i++) {
        if (argc > 1 && strcmp(argv[1], suites[i].name) != 0)
            continue;
        if (!runner)
            runner = srunner_create(suites[i].make());
        else
            srunner_add_suite(runner, suites[i].make());
    }
    if (!runner) {
        fprintf(stderr, "no suite named %s\n", argc > 1 ? argv[1] : "?");
        return 2;
    }
    /* A table the CPU lacks is reported, not silently left out. */
    char isas[256];
    describe_isas(isas, sizeof isas);
    printf("%s\n", isas);
    fflush(stdout);
    srunner_run_all(runner, CK_NORMAL);
    int failed = srunner_ntests_failed(runner);
    srunner_free(runner);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
