/* Hugging Face model directories (config.json + *.safetensors): what fx_model_load calls for
   a directory that holds config.json. Internal to the library. */
#ifndef FX_HF_H
#define FX_HF_H

#include "flexc/model.h"

/* Loads the model in dir into a new fx_model (*out untouched on failure). */
int fx__hf_load(fx_model **out, const char *dir);

#endif
