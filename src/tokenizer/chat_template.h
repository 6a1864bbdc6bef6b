/* The chat-template engine: the subset of Jinja2 that Hugging Face chat templates use (Llama 3,
   Qwen2, Mistral, SmolLM2, ChatML), rendered as transformers does (trim_blocks, lstrip_blocks).
   Anything outside it is refused by name with its line ("chat template line 3: unsupported Jinja
   construct 'macro'"), never rendered differently. See docs/chat.md.

       fx__chat_template *t;
       rc = fx__chat_template_compile(&t, src, strlen(src));      // FX_EFORMAT: syntax, refusals
       fx__chat_msg m[2] = {{"user", "Hi"}, {"assistant", "Hello"}};
       fx__chat_vars v = {.bos_token = "<s>", .eos_token = "</s>"};
       char *text; size_t len;
       rc = fx__chat_template_render(t, m, 2, &v, &text, &len);  // text: malloc'd, NUL-terminated
       free(text); fx__chat_template_free(t);

   Rendering is bounded (FX__CHAT_MAX_*): a hostile template gets FX_EFORMAT, not a crash. */
#ifndef FLEXC_TOKENIZER_CHAT_TEMPLATE_H
#define FLEXC_TOKENIZER_CHAT_TEMPLATE_H

#include <stdbool.h>
#include <stddef.h>

enum {
    FX__CHAT_MAX_DEPTH = 64,              /* nesting of expressions and blocks */
    FX__CHAT_MAX_OUTPUT = 16 << 20,       /* bytes rendered */
    FX__CHAT_MAX_ITERATIONS = 1 << 16,    /* loop iterations in one render */
    FX__CHAT_MAX_MEMORY = 64 << 20,       /* bytes of values made during one render */
    FX__CHAT_MAX_SOURCE = 1 << 20,        /* template size */
};

typedef struct fx__chat_msg {
    const char *role;
    const char *content;
} fx__chat_msg;

/* The variables a template sees besides `messages`. NULL tokens are undefined; date_string NULL
   is undefined (templates choose their own default); date "YYYY-MM-DD" is the day strftime_now
   formats (NULL: today, UTC). `tools` is always none. */
typedef struct fx__chat_vars {
    const char *bos_token, *eos_token;
    bool add_generation_prompt;
    const char *date_string;
    const char *date;
} fx__chat_vars;

typedef struct fx__chat_template fx__chat_template;

int fx__chat_template_compile(fx__chat_template **out, const char *src, size_t len);
void fx__chat_template_free(fx__chat_template *t);
int fx__chat_template_render(const fx__chat_template *t, const fx__chat_msg *msgs, size_t n,
                             const fx__chat_vars *vars, char **out, size_t *out_len);

#endif
