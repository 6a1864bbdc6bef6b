/* Text in and out of flexc generate (gen_text.c). */
#ifndef FX_CLI_GEN_TEXT_H
#define FX_CLI_GEN_TEXT_H

#include "cli.h"

#include <flexc/tokenizer.h>

typedef struct gen_text {
    fx_tokenizer *tok; /* NULL: flexc's byte vocabulary */
    fx_ids out;        /* the generated ids */
    fx_text text;      /* their decoding */
    size_t printed;    /* bytes of text already written to stdout */
} gen_text;

/* The tokenizer of the model read from src (a directory's tokenizer.json or hf/tokenizer.json),
   else the byte vocabulary when the model has it. Returns CLI_EXIT_OK or an exit status with
   the error printed. */
int gen_text_open(gen_text *g, const char *src, const fx_model_config *cfg);
void gen_text_close(gen_text *g);
/* Appends the ids of text (no special tokens) to ids. */
int gen_text_encode(gen_text *g, fx_ids *ids, const char *text, size_t len);
/* Records a generated id; with stream, writes the text that became complete. */
int gen_text_emit(gen_text *g, int32_t id, bool stream);
/* Decodes everything (g->text); with stream, writes what was held back. */
int gen_text_finish(gen_text *g, bool stream);
/* s[0..n) as a JSON string (UTF-8 passed through, control characters escaped). */
void gen_json_string(FILE *f, const char *s, size_t n);

#endif
