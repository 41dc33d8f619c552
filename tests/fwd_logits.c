/* Test helper: the logits of stz's forward pass on one sequence.
 * usage: fwd_logits MODEL CONFIG|- TOKENS... > OUT (n x vocab float32).
 * CONFIG "-": the file's __metadata__["config"]. */
#include "core/stz_core.h"
#include "stz_forward.h"
#include "stz_safetensors.h"

#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    if (argc < 4)
        return fprintf(stderr, "usage: fwd_logits MODEL CONFIG|- TOKENS...\n"), 2;
    stz_err err;
    stz_qmodel *q = NULL;
    stz_fwd *m = NULL;
    stz_fwd_config c;
    char *text = NULL;
    size_t n = (size_t)argc - 3;
    int32_t *tok = malloc(n * sizeof *tok);
    for (size_t i = 0; i < n; i++)
        tok[i] = atoi(argv[3 + i]);
    if (stz_qmodel_open(&q, argv[1], &err) ||
        (argv[2][0] == '-'
             ? stz_fwd_config_parse(&c, stz_reader_meta_get(stz_qmodel_reader(q), "config"), argv[1], &err)
             : stz_read_text(argv[2], 1 << 20, &text, NULL, &err) || stz_fwd_config_parse(&c, text, argv[2], &err)) ||
        stz_fwd_open(&m, &q, 1, &c, argv[1], 1, &err))
        return fprintf(stderr, "fwd_logits: %s\n", err.msg), 1;
    float *l = malloc(n * c.vocab * sizeof *l);
    if (stz_fwd_logits(m, tok, 1, n, l, &err))
        return fprintf(stderr, "fwd_logits: %s\n", err.msg), 1;
    fwrite(l, sizeof *l, n * c.vocab, stdout);
    stz_fwd_free(m);
    stz_qmodel_free(q);
    free(l), free(tok), free(text);
    return 0;
}
