/* Chat data for fine-tuning: a model's chat template (tokenizer_config.json's chat_template, or
   chat_template.jinja), conversations read from JSONL, and a conversation rendered to token ids
   with a label per token (the id where the token carries the loss, FX__CHAT_IGNORE elsewhere).
   See docs/chat.md for the label rule and what a packer must do.

       fx__chat *chat;
       rc = fx__chat_load(&chat, "model_dir", tok);          // tok: the model's tokenizer
       fx__chat_data data;
       rc = fx__chat_data_load(&data, "chat.jsonl");        // every line checked first
       fx_ids ids = {0}; int32_t *labels = NULL;
       for (i ...) rc = fx__chat_encode(chat, &data.conv[i], &ids, &labels);  // replaces ids
       free(labels); fx_ids_free(&ids); fx__chat_data_free(&data); fx__chat_free(chat);
   or all of them packed for training: fx__chat_pack(chat, &data, "chat.jsonl", eos, &ids, &loss).
*/
#ifndef FLEXC_TOKENIZER_CHAT_H
#define FLEXC_TOKENIZER_CHAT_H

#include "tokenizer/chat_template.h"

#include <flexc.h>

#include <stdint.h>

enum { FX__CHAT_IGNORE = -100 };

typedef struct fx__chat fx__chat;

typedef struct fx__chat_conv {
    fx__chat_msg *msg;
    size_t n;
    int64_t line; /* in its file */
} fx__chat_conv;

typedef struct fx__chat_data {
    fx__chat_conv *conv;
    size_t n;
} fx__chat_data;

/* The template of a model directory: chat_template.jinja if present, else tokenizer_config.json's
   chat_template (a string, or a list of {name, template} where "default" is used), with its
   bos_token / eos_token (strings or {"content": ...}). tok is borrowed and must outlive chat.
   FX_EFORMAT naming the file when there is no template or it is refused. strftime_now formats
   the date in FLEXC_CHAT_DATE (YYYY-MM-DD) when it is set, else today's (fx__chat_set_date). */
int fx__chat_load(fx__chat **out, const char *model_dir, const fx_tokenizer *tok);
/* The same from a template string and the special tokens (NULL: undefined). */
int fx__chat_create(fx__chat **out, const char *tmpl, size_t len, const char *bos, const char *eos,
                    const fx_tokenizer *tok);
void fx__chat_free(fx__chat *chat);
/* Set what strftime_now formats ("YYYY-MM-DD"; NULL: today, UTC). */
void fx__chat_set_date(fx__chat *chat, const char *date);

/* Text of a conversation as the template renders it (malloc'd). */
int fx__chat_render(const fx__chat *chat, const fx__chat_msg *msgs, size_t n, bool add_generation_prompt,
                    char **text, size_t *len);
/* ids (replaced) of the rendered conversation without a generation prompt, and labels[i] =
   ids[i] where token i belongs to an assistant turn (its content and what the template writes
   with it after the generation prompt: the end-of-turn token), FX__CHAT_IGNORE elsewhere; a
   token that spans either edge of the turn is the turn's (docs/chat.md). *labels is realloc'd to
   ids->n. FX_EFORMAT when the template's renderings of the conversation's prefixes are not
   prefixes of each other's text, naming the message. */
int fx__chat_encode(const fx__chat *chat, const fx__chat_conv *conv, fx_ids *ids, int32_t **labels);

/* Training data: every conversation of data encoded (fx__chat_encode) and concatenated into ids
   (replaced), each followed by sep unless its last id is sep already (sep < 0: nothing between
   them); (*loss)[i] (realloc'd to ids->n) is 1 where token i is labelled (an assistant's), 0
   elsewhere, the separators included. Errors are prefixed "name:LINE: " with the conversation's
   line. */
int fx__chat_pack(const fx__chat *chat, const fx__chat_data *data, const char *name, int32_t sep, fx_ids *ids,
                  uint8_t **loss);

/* Parses JSONL: each non-empty line {"messages": [{"role": s, "content": s}, ...]} or
   {"prompt": s, "completion": s}. FX_EFORMAT "FILE:LINE: what is wrong" at the first bad line. */
int fx__chat_data_load(fx__chat_data *out, const char *path);
int fx__chat_data_parse(fx__chat_data *out, const char *name, const char *text, size_t len);
void fx__chat_data_free(fx__chat_data *d);

#endif
