/* flexc bench lce: arrives with the fused loss. */
#include "cli.h"

int bench_lce(int argc, char **argv)
{
    (void)argc, (void)argv;
    return cli_not_yet("bench lce");
}
