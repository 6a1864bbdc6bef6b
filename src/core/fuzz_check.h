/* What the libFuzzer targets (src/<module>/fuzz/) share: a property check that aborts, so that
   libFuzzer reports the input and saves it. */
#ifndef FLEXC_CORE_FUZZ_CHECK_H
#define FLEXC_CORE_FUZZ_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#define FUZZ_CHECK(cond)                                                                       \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            fprintf(stderr, "%s:%d: property failed: %s\n", __FILE__, __LINE__, #cond);       \
            abort();                                                                           \
        }                                                                                      \
    } while (0)

#endif
