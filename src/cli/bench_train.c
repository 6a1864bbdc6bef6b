/* flexc bench train: arrives with the trainer. */
#include "cli.h"

int bench_train(int argc, char **argv)
{
    (void)argc, (void)argv;
    return cli_not_yet("bench train");
}
