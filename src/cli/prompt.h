/* The prompt of flexc generate: given inline, in a file, or on standard input. */
#ifndef FX_CLI_PROMPT_H
#define FX_CLI_PROMPT_H

#include <stddef.h>

/* The prompt's bytes: `text` itself, all of standard input when text is "-", or the regular
   file `file` (NULL: none; "-" is standard input too). At most one of text and file may be
   given. *out is malloc'd (NUL-terminated, *len bytes before it; may hold NUL bytes) and is the
   caller's to free. CLI_EXIT_OK, CLI_EXIT_USAGE (both given) or CLI_EXIT_FAIL (unreadable), the
   error printed. */
int cli_read_prompt(const char *text, const char *file, char **out, size_t *len);

#endif
