/* libFuzzer target: the chat-template engine (src/tokenizer/chat_template.c) and the chat JSONL
   parser (src/tokenizer/chat.c) on arbitrary bytes. The first byte chooses: bit 1 set, the rest
   is a JSONL file; else it is a template, rendered over a fixed conversation (with a generation
   prompt when bit 0 is set). Beyond "no crash, no leak, no undefined behaviour": a template that
   renders renders the same text twice, within the output bound, and one that fails has a message
   naming a line; the parser's conversations have roles and contents. */
#include "core/fuzz_check.h"
#include "tokenizer/chat.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > 16384)
        return 0;
    const char *src = (const char *)data + 1;
    size_t len = size - 1;
    if (data[0] & 2) {
        fx__chat_data d;
        if (fx__chat_data_parse(&d, "f.jsonl", src, len) == FX_OK) {
            FUZZ_CHECK(d.n > 0);
            for (size_t i = 0; i < d.n; i++)
                for (size_t m = 0; m < d.conv[i].n; m++)
                    FUZZ_CHECK(d.conv[i].msg[m].role && d.conv[i].msg[m].role[0] && d.conv[i].msg[m].content);
            fx__chat_data_free(&d);
        } else
            FUZZ_CHECK(strstr(fx_last_error(), "f.jsonl") != NULL);
        return 0;
    }
    fx__chat_template *t = NULL;
    if (fx__chat_template_compile(&t, src, len) != FX_OK) {
        FUZZ_CHECK(strstr(fx_last_error(), "chat template") != NULL);
        return 0;
    }
    const fx__chat_msg msgs[4] = {{"system", "Be brief."}, {"user", "Hi \xc3\xa9 {{ x }}"}, {"assistant", ""},
                                  {"user", "  again\n"}};
    fx__chat_vars v = {.bos_token = "<s>", .eos_token = "</s>", .add_generation_prompt = data[0] & 1,
                       .date = "2024-09-05"};
    char *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    int ra = fx__chat_template_render(t, msgs, 4, &v, &a, &na);
    if (ra == FX_OK) {
        FUZZ_CHECK(a && strlen(a) <= na && na <= FX__CHAT_MAX_OUTPUT);
        FUZZ_CHECK(fx__chat_template_render(t, msgs, 4, &v, &b, &nb) == FX_OK);
        FUZZ_CHECK(b && na == nb && memcmp(a, b, na) == 0);
    } else
        FUZZ_CHECK(!a && strstr(fx_last_error(), "chat template line") != NULL);
    free(a);
    free(b);
    fx__chat_template_free(t);
    return 0;
}
