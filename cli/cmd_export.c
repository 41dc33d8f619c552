/* stz export --gguf: a model to llama.cpp's GGUF. */
#include "cli.h"
#include "stz_export.h"

#include <cjson/cJSON.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char export_help[] =
    "usage: stz export --gguf MODEL -o OUT.gguf [options]\n\n"
    "Writes a Llama-family model (Llama 2/3, Mistral, TinyLlama, Qwen2, llama2.c\n"
    "checkpoints) as GGUF for llama.cpp. MODEL may be plain, quantized, an .stz\n"
    "container or a Hugging Face directory. Tensors stz quantized to llama.cpp's\n"
    "types (q4_k, iq4_nl, ... f16) are written byte for byte, and those in a layout\n"
    "GGUF holds (absmax/full/mse, block 32, F16 scales: 8 bits -> Q8_0, 5 -> Q5_0,\n"
    "4 -> Q4_0) repacked exactly; other quantized tensors are refused unless\n"
    "--requantize. Rows that are not whole blocks of 32 are written F16.\n\n"
    "  --gguf              the output format (the only one)\n"
    "  --type T            float matrices as auto (their own dtype, default), f32,\n"
    "                      f16, bf16, or a block type stz quantizes to (q8_0,\n"
    "                      q6_k, q5_k, q5_1, q5_0, q4_k, q4_1, q4_0, iq4_nl,\n"
    "                      iq4_xs, q3_k, q2_k; 256-blocks on other rows fall back\n"
    "                      as llama.cpp's do), or a mix of llama-quantize's\n"
    "                      (q3_k_s, q3_k_m, q3_k_l, q4_k_s, q4_k_m, q5_k_s,\n"
    "                      q5_k_m): each matrix in the type its rules give it\n"
    "  --requantize        write quantized tensors GGUF cannot hold exactly as the\n"
    "                      nearest block type (or --type's), printing the error\n"
    "  --tokenizer FILE    tokenizer.json, or a llama2.c tokenizer .bin (default:\n"
    "                      tokenizer.json in the model's directory)\n"
    "  --pad-vocab         pad a tokenizer whose ids cover less than 99% of the\n"
    "                      embedding's rows with [PADn] tokens (else refused)\n"
    "  --config FILE       config.json (default: as stz eval --forward finds it)\n"
    "  --name NAME         general.name (default: the file name)\n"
    "  -T, --threads N     threads decoding an .stz container (default: all cores)\n"
    "  -o, --output FILE   the GGUF file to write\n"
    "  -f, --force         replace OUT if it exists\n"
    "  -q, --quiet         no progress, no summary\n"
    "  --json              print the summary as JSON\n";

enum { O_GGUF = 1300, O_TYPE, O_REQUANT, O_TOKENIZER, O_CONFIG, O_NAME, O_PADVOCAB };

/* A mix of llama-quantize's that is not one type ("q4_k_m"). */
static int is_mix(const char *name) { return stz_gguf_like_parse(name) >= 0 && stz_ggml_type_parse(name) == -2; }

/* --type's usage error: every type it takes. */
static int bad_type(const char *given)
{
    char list[512] = "auto";
    size_t at = strlen(list);
    for (size_t i = 0; stz_ggml_type_written(i) && at < sizeof list; i++)
        at += (size_t)snprintf(list + at, sizeof list - at, ", %s", stz_ggml_type_written(i));
    const char *sep = ", or a mix of llama-quantize's: ";
    for (int i = 0; stz_gguf_like_name(i) && at < sizeof list; i++)
        if (is_mix(stz_gguf_like_name(i)))
            at += (size_t)snprintf(list + at, sizeof list - at, "%s%s", sep, stz_gguf_like_name(i)), sep = ", ";
    return cli_usage_error("export", "--type takes %s, not '%s'", list, given);
}

static cJSON *types_json(const stz_gguf_stats *s)
{
    cJSON *o = cJSON_CreateObject();
    for (int t = 0; t < 31; t++)
        if (s->tensors[t]) {
            cJSON *e = cJSON_AddObjectToObject(o, stz_ggml_type_name(t));
            cJSON_AddNumberToObject(e, "tensors", (double)s->tensors[t]);
            cJSON_AddNumberToObject(e, "bytes", (double)s->bytes[t]);
        }
    return o;
}

static int report(const cli_common *c, const char *in, const stz_gguf_stats *s, double secs)
{
    if (c->json) {
        cJSON *d = cJSON_CreateObject();
        cJSON_AddStringToObject(d, "input", in);
        cJSON_AddStringToObject(d, "output", c->out);
        cJSON_AddStringToObject(d, "architecture", s->arch);
        cJSON_AddNumberToObject(d, "bytes", (double)s->file_bytes);
        cJSON_AddItemToObject(d, "types", types_json(s));
        cJSON_AddNumberToObject(d, "repacked_exactly", (double)s->repacked);
        cJSON_AddNumberToObject(d, "requantized", (double)s->requantized);
        cJSON_AddNumberToObject(d, "requantize_max_rel_error", s->requant_max_err);
        cJSON_AddNumberToObject(d, "f16_fallback", (double)s->fallback);
        cJSON_AddNumberToObject(d, "block_fallback", (double)s->block_fallback);
        cJSON_AddNumberToObject(d, "vocab_padded", (double)s->vocab_padded);
        stz_gguf_like_json(d, s);
        if (s->ffn_to) {
            cJSON *w = cJSON_AddObjectToObject(d, "ffn_widened");
            cJSON_AddNumberToObject(w, "from", (double)s->ffn_from);
            cJSON_AddNumberToObject(w, "to", (double)s->ffn_to);
        }
        cJSON_AddNumberToObject(d, "seconds", secs);
        return cli_print_json(d);
    }
    if (c->quiet)
        return CLI_OK;
    char a[32];
    printf("%s -> %s: GGUF (%s), %s bytes in %.2f s\n", in, c->out, s->arch, cli_commas(a, s->file_bytes), secs);
    for (int t = 0; t < 31; t++)
        if (s->tensors[t])
            printf("  %-5s %5llu tensors %15s bytes\n", stz_ggml_type_name(t), (unsigned long long)s->tensors[t],
                   cli_commas(a, s->bytes[t]));
    if (s->repacked)
        printf("  %zu quantized tensors repacked exactly (no requantization)\n", s->repacked);
    if (s->requantized)
        printf("  %zu quantized tensors requantized: largest relative error %.4g (%s)\n", s->requantized,
               s->requant_max_err, s->requant_worst);
    if (s->ffn_to)
        printf("  FFN widened from %llu to %llu units (zero rows and columns) for ffn_down's padded blocks\n",
               (unsigned long long)s->ffn_from, (unsigned long long)s->ffn_to);
    if (s->block_fallback)
        printf("  %zu tensors in llama.cpp's 32-block fallback: rows not whole 256-blocks (first: %s, %s -> %s)\n",
               s->block_fallback, s->block_fallback_first, stz_ggml_type_name(s->block_fallback_from),
               stz_ggml_type_name(s->block_fallback_to));
    if (s->vocab_padded)
        printf("  %u embedding rows past the tokenizer's ids written as [PADn] tokens\n", s->vocab_padded);
    if (s->fallback)
        printf(
            "  %zu tensors written as floats (F16; F32 for quantized values): rows not a multiple of 32 "
            "(first: %s)\n",
            s->fallback, s->fallback_first);
    return CLI_OK;
}

/* stz export --gguf. Longer than most: the option table and its switch,
 * then one library call and its report. */
int cmd_export(int argc, char **argv)
{
    static const struct option opts[] = {CLI_COMMON_LONG,
                                         {"gguf", no_argument, 0, O_GGUF},
                                         {"type", required_argument, 0, O_TYPE},
                                         {"requantize", no_argument, 0, O_REQUANT},
                                         {"tokenizer", required_argument, 0, O_TOKENIZER},
                                         {"config", required_argument, 0, O_CONFIG},
                                         {"name", required_argument, 0, O_NAME},
                                         {"pad-vocab", no_argument, 0, O_PADVOCAB},
                                         {0, 0, 0, 0}};
    cli_common c;
    cli_common_init(&c);
    stz_gguf_params p = STZ_GGUF_PARAMS_DEFAULT;
    const char *config = NULL;
    int gguf = 0, k;
    while ((k = getopt_long(argc, argv, CLI_COMMON_SHORT, opts, NULL)) != -1) {
        int r = cli_common_opt("export", export_help, k, &c);
        if (r >= 0)
            return r;
        if (r == -1)
            continue;
        switch (k) {
        case O_GGUF: gguf = 1; break;
        case O_TYPE:
            p.mix = is_mix(optarg) ? optarg : NULL;
            if ((p.type = p.mix ? STZ_GGML_AUTO : stz_ggml_type_parse(optarg)) == -2)
                return bad_type(optarg);
            break;
        case O_REQUANT: p.requantize = 1; break;
        case O_TOKENIZER: p.tokenizer = optarg; break;
        case O_CONFIG: config = optarg; break;
        case O_NAME: p.name = optarg; break;
        case O_PADVOCAB: p.pad_vocab = 1; break;
        default: return cli_bad_option("export");
        }
    }
    if (!gguf)
        return cli_usage_error("export", "give the output format: --gguf");
    if (optind + 1 != argc)
        return cli_usage_error("export", "give one MODEL");
    if (!c.out)
        return cli_usage_error("export", "missing -o OUT.gguf");
    const char *in = argv[optind];
    p.threads = c.threads;
    p.write_flags = c.force ? STZ_WRITE_FORCE : 0;
    stz_err err;
    stz_err_clear(&err);
    stz_model_set set = {0};
    stz_fwd_config cfg;
    stz_fwd *check = NULL;
    char from[STZ_FWD_FROM_MAX], *json = NULL;
    int rc = CLI_ERROR, found;
    if (stz_refuse_input_as_output(in, c.out, &err) || stz_model_set_open(&set, in, &err))
        goto fail;
    for (size_t f = 0; f < set.n; f++)
        stz_qmodel_set_threads(set.m[f], c.threads);
    if ((found = stz_fwd_config_find(in, &set, config, &cfg, from, &json, &err)) < 0)
        goto fail;
    if (!found) {
        stz_fwd_no_config(in, &set, &err);
        goto fail;
    }
    /* every tensor the architecture needs, with its shape */
    if (stz_fwd_open(&check, set.m, set.n, &cfg, in, 1, &err))
        goto fail;
    cli_progress prog;
    cli_progress_init(&prog, "export", c.quiet || c.json);
    p.progress = cli_progress_cb;
    p.progress_user = &prog;
    stz_gguf_stats s;
    stz_status st = stz_gguf_export(&p, set.m, set.n, &cfg, json, in, NULL, c.out, &s, &err);
    cli_progress_end(&prog);
    if (!st)
        rc = report(&c, in, &s, cli_now() - prog.start);
fail:
    if (rc == CLI_ERROR && err.code)
        cli_fail(&err);
    stz_fwd_free(check);
    stz_model_set_free(&set);
    free(json);
    return rc;
}

/* ---- stz inspect FILE.gguf --------------------------------------------------- */

int cli_inspect_gguf(const char *path, cJSON **json)
{
    stz_err err;
    stz_gguf *g;
    if (stz_gguf_open(&g, path, &err))
        return cli_fail(&err);
    size_t nt = stz_gguf_tensor_count(g), nkv = stz_gguf_kv_count(g);
    uint64_t total = 0;
    cJSON *doc = json ? cJSON_CreateObject() : NULL, *arr = NULL, *kv = NULL;
    char a[32], shape[96];
    if (doc) {
        cJSON_AddStringToObject(doc, "file", path);
        cJSON_AddStringToObject(doc, "format", "gguf");
        cJSON_AddNumberToObject(doc, "version", stz_gguf_version(g));
        kv = cJSON_AddObjectToObject(doc, "metadata");
        arr = cJSON_AddArrayToObject(doc, "tensors");
    } else
        printf("%s: GGUF version %u, %zu tensors, %zu keys\n\n%-32s %-6s %-20s %15s\n", path, stz_gguf_version(g), nt,
               nkv, "name", "type", "shape (ne0 first)", "bytes");
    for (size_t i = 0; i < nt; i++) {
        const stz_gguf_tensor *t = stz_gguf_tensor_at(g, i);
        const char *tn = stz_ggml_type_name(t->type);
        int len = 0;
        for (uint32_t d = 0; d < t->ndim; d++)
            len += snprintf(shape + len, sizeof shape - (size_t)len, "%s%llu", d ? ", " : "[",
                            (unsigned long long)t->ne[d]);
        snprintf(shape + len, sizeof shape - (size_t)len, "]");
        total += t->bytes;
        if (arr) {
            cJSON *e = cJSON_CreateObject();
            cJSON_AddStringToObject(e, "name", t->name);
            if (tn)
                cJSON_AddStringToObject(e, "type", tn);
            else
                cJSON_AddNumberToObject(e, "type", t->type);
            cJSON *ne = cJSON_AddArrayToObject(e, "ne");
            for (uint32_t d = 0; d < t->ndim; d++)
                cJSON_AddItemToArray(ne, cJSON_CreateNumber((double)t->ne[d]));
            cJSON_AddNumberToObject(e, "offset", (double)t->offset);
            cJSON_AddNumberToObject(e, "bytes", (double)t->bytes);
            cJSON_AddItemToArray(arr, e);
        } else {
            char other[16];
            snprintf(other, sizeof other, "type %d", t->type);
            printf("%-32s %-6s %-20s %15s\n", t->name, tn ? tn : other, shape, cli_commas(a, t->bytes));
        }
    }
    if (!doc)
        printf("\n%s bytes of tensor data\n\nmetadata:\n", cli_commas(a, total));
    for (size_t i = 0; i < nkv; i++)
        if (kv)
            cJSON_AddStringToObject(kv, stz_gguf_kv_key(g, i), stz_gguf_kv_text(g, i));
        else
            cli_print_meta(stz_gguf_kv_key(g, i), stz_gguf_kv_text(g, i));
    if (doc)
        cJSON_AddNumberToObject(doc, "tensor_bytes", (double)total), *json = doc;
    stz_gguf_free(g);
    return CLI_OK;
}
