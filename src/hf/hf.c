/* Hugging Face model directories: not read by this build yet. */
#include "hf.h"

#include "core/core.h"

int fx__hf_load(fx_model **out, const char *dir)
{
    (void)out, (void)dir;
    return fx__error(FX_EUNSUPPORTED, "Hugging Face model directories: not supported yet");
}
