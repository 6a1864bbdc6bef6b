/* Clocks: monotonic seconds for intervals, Unix seconds for timestamps. */
#include "core.h"

#include <time.h>

static double fx__clock_seconds(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double fx__seconds(void) { return fx__clock_seconds(CLOCK_MONOTONIC); }

double fx__wall_seconds(void) { return fx__clock_seconds(CLOCK_REALTIME); }
