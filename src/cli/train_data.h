/* The data of flexc train (train_data.c). */
#ifndef FX_CLI_TRAIN_DATA_H
#define FX_CLI_TRAIN_DATA_H

#include "cli.h"

#include "model/model.h"

#define TRAIN_DEFAULT_CORPUS "/usr/share/games/fortunes"

/* The file starts with an llm.c token-file magic (20240520: uint16 tokens, 20240801: uint32). */
bool train_is_token_file(const char *path);
/* dir's tokenizer.json, else dir/hf/tokenizer.json (a fine-tuning run keeps it there). */
bool train_tokenizer_path(char *buf, size_t n, const char *dir);
/* path is chat data: a .jsonl file, with a tokenizer. */
bool train_is_chat(const char *path, const char *tokenizer);
/* The run's data: a token file as is; chat data (train_is_chat) rendered with the chat template
   of the tokenizer's directory, each conversation followed by the model's first eos id, the loss
   on the assistants' tokens only (d->loss, d->chat), every line checked before anything trains;
   else text through `tokenizer` (a tokenizer.json; NULL: flexc's bytes, for byte-vocabulary
   models only), documents ending at "%" lines with the model's first eos id. Text that is not
   UTF-8 is refused with the offset of its first invalid byte, unless lossy_text (with a
   tokenizer: each invalid sequence becomes U+FFFD). Returns CLI_EXIT_OK or an exit status with
   the error printed. */
int train_data_load(fx__model_data *d, const char *path, const char *tokenizer, const fx_model_config *cfg,
                    double val_frac, int64_t min_tokens, bool lossy_text);
/* Copies the Hugging Face files of src (config, generation config, tokenizer, chat template) to
   out/hf, so that flexc export writes the fine-tuned model back as the model it came from and a
   resumed run on chat data finds its template. */
int train_keep_hf(const char *out, const char *src);

#endif
