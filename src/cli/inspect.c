/* flexc inspect: arrives with the safetensors module. */
#include "cli.h"

int cmd_inspect(int argc, char **argv)
{
    (void)argc, (void)argv;
    return cli_not_yet("inspect");
}
