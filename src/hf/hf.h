/* Hugging Face model directories (config.json + *.safetensors): what fx_model_load calls for
   a directory that holds config.json. Internal to the library. */
#ifndef FX_HF_H
#define FX_HF_H

#include "flexc/model.h"

/* Loads the model in dir into a new fx_model (*out untouched on failure). A loader builds
   the model with fx__gpt_new (src/gpt/gpt.h: no random init) or fx_model_create, then fills
   every tensor through fx_model_tensor_find / fx_model_tensor_at. */
int fx__hf_load(fx_model **out, const char *dir);

#endif
