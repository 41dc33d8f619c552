/* Fuzz target for the --tokens parser (stz eval --forward, stz imatrix,
 * stz tune --tokens FILE): any byte string is such a file's text. Whatever
 * parses must give sequences of at least 2 ids, each a whole number in
 * [0, 2^31), laid out within their stride. */
#include "fuzz_util.h"
#include "stz_forward.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    if (!text)
        return 0;
    memcpy(text, data, size);
    text[size] = 0; /* as stz_read_text gives it */
    stz_seqs q;
    stz_err err;
    stz_status st = stz_seqs_parse(text, size, "tokens.txt", &q, &err);
    fuzz_failed(st, &err); /* a failure must say why */
    if (st == STZ_OK) {
        if (!q.nseq)
            abort();
        size_t all = 0; /* back to back, within the ids the text can hold */
        for (size_t s = 0; s < q.nseq; all += q.lens[s++]) {
            if (q.lens[s] < 2 || q.lens[s] > q.longest || all + q.lens[s] > size / 2 + 1)
                abort();
            for (size_t i = 0; i < q.lens[s]; i++)
                if (q.tok[all + i] < 0)
                    abort();
        }
    }
    stz_seqs_free(&q);
    free(text);
    return 0;
}
