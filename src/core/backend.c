/* The backends built in (backend.h): the one place that lists them. */
#include "core/backend.h"

void fx__backend_block_mask_release(fx_block_mask *m)
{
    fx__cuda_backend.block_mask_release(m);
}
