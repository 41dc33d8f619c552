/* Fuzz target for a model's configuration (config.json of Hugging Face
 * models, llama2.c's config; stz eval --forward --config, stz imatrix,
 * error feedback): any byte string is the text. Whatever parses must
 * describe a model the forward pass can size: non-zero widths, whole and
 * even heads, and finite RoPE frequencies. */
#include "fuzz_util.h"
#include "stz_forward.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    if (!text)
        return 0;
    memcpy(text, data, size), text[size] = 0;
    stz_fwd_config c;
    stz_err err;
    stz_status st = stz_fwd_config_parse(&c, text, "config.json", &err);
    free(text);
    if (fuzz_failed(st, &err)) /* a failure must say why */
        return 0;
    if (!c.dim || !c.hidden || !c.n_layers || !c.vocab || !c.n_kv_heads || c.n_heads % c.n_kv_heads || !c.head_dim ||
        c.head_dim % 2 || c.bos < 0 || (uint32_t)c.bos >= c.vocab)
        abort();
    float *f = malloc(c.head_dim / 2 * sizeof *f);
    if (f) {
        stz_fwd_rope_frequencies(&c, f);
        for (uint32_t i = 0; i < c.head_dim / 2; i++)
            if (!isfinite(f[i]))
                abort();
    }
    free(f);
    return 0;
}
