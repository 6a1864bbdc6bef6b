/* flexc bench attention: arrives with FlexAttention. */
#include "cli.h"

int bench_attention(int argc, char **argv)
{
    (void)argc, (void)argv;
    return cli_not_yet("bench attention");
}
