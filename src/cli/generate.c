/* flexc generate: arrives with the trainer. */
#include "cli.h"

int cmd_generate(int argc, char **argv)
{
    (void)argc, (void)argv;
    return cli_not_yet("generate");
}
