/* Before a training run: can its checkpoint be saved at all? */
#ifndef FX_CLI_SAVE_CHECK_H
#define FX_CLI_SAVE_CHECK_H

#include <stdint.h>

/* Checks that dir can take the files a save writes, before any step runs: neither
   dir/checkpoint.safetensors nor dir/model.safetensors is a directory, and the temporary file
   the save starts with can be created (it is removed again). CLI_EXIT_FAIL with the error
   printed otherwise. Where statvfs reports the free space and it is below need_bytes (what
   the save writes), a warning names both sizes; the run goes on (space may be freed). */
int save_check(const char *dir, uint64_t need_bytes);

#endif
