/* --model NAME|DIR: a preset, or a model read from a directory or file (fx_model_load, or
   fx_model_load_inference for generation). */
#include "cli.h"

#include <sys/stat.h>

int cli_model_open_for(const char *opt, const char *name, fx_model_config *cfg, fx_model **loaded, bool inference)
{
    *loaded = NULL;
    if (fx_model_preset(cfg, name) == FX_OK)
        return CLI_EXIT_OK;
    struct stat st;
    if (stat(name, &st) != 0) {
        cli_error("%s %s is neither a preset (tiny, small, gpt2) nor a directory", opt, name);
        return CLI_EXIT_USAGE;
    }
    int rc = inference ? fx_model_load_inference(loaded, name) : fx_model_load(loaded, name);
    if (rc != FX_OK) {
        char what[256];
        snprintf(what, sizeof what, "%s %s", opt, name);
        return cli_fail(rc, what);
    }
    *cfg = *fx_model_get_config(*loaded);
    return CLI_EXIT_OK;
}

int cli_model_open(const char *opt, const char *name, fx_model_config *cfg, fx_model **loaded)
{
    return cli_model_open_for(opt, name, cfg, loaded, false);
}
