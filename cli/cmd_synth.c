/* stz synth: realistic stand-in models. */
#include "cli.h"
#include "stz_synth.h"

#include <cjson/cJSON.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

static const char synth_help[] =
    "usage: stz synth ARCH -o FILE [options]\n"
    "       stz synth --list\n\n"
    "Writes a deterministic SafeTensors model with the exact tensor names and\n"
    "shapes of a real architecture, filled with values shaped like trained\n"
    "weights (heavy-tailed, per-row/column magnitudes, outlier channels).\n"
    "The file's __metadata__ marks it as synthetic.\n\n"
    "  -o, --output FILE   where to write (required)\n"
    "  --dtype D           bf16 (default), f16 or f32\n"
    "  --seed N            random seed (default 1)\n"
    "  --layers N          N decoder layers instead of the architecture's (1..1024)\n"
    "  --shards N          a Hugging Face directory FILE of N shards (whole tensors,\n"
    "                      cut by bytes), model.safetensors.index.json, config.json\n"
    "                      and a small byte-level tokenizer.json\n"
    "  --sparsity S        a pruned model: S in [0, 1) zeroes that fraction of the\n"
    "                      smallest values of each linear weight (not embeddings or\n"
    "                      the head), or 2:4 keeps the 2 largest of every 4\n"
    "  -T, --threads N     worker threads, 0 = all cores (default)\n"
    "  --stats             print the BF16 exponent-byte entropy of the values\n"
    "  --list              list the architectures\n"
    "  -f, --force         replace FILE if it exists\n"
    "  -q, --quiet         no progress display\n"
    "  --json              print the summary as JSON\n"
    "  -h, --help          this text\n";

static int list_archs(void)
{
    stz_err err;
    for (size_t i = 0; stz_synth_arch_name(i); i++) {
        size_t nt;
        uint64_t np;
        char a[32];
        if (stz_synth_arch_size(stz_synth_arch_name(i), &nt, &np, &err))
            return cli_fail(&err);
        printf("%-16s %5zu tensors %15s params  %s\n", stz_synth_arch_name(i), nt, cli_commas(a, np),
               stz_synth_arch_desc(i));
    }
    return CLI_OK;
}

/* stz synth. Longer than most: the option table and its switch, then one
 * call per output form (file, sharded directory). */
int cmd_synth(int argc, char **argv)
{
    enum { O_DTYPE = 256, O_SEED, O_STATS, O_LIST, O_JSON, O_SPARSITY, O_LAYERS, O_SHARDS };
    static const struct option opts[] = {{"output", required_argument, 0, 'o'},
                                         {"dtype", required_argument, 0, O_DTYPE},
                                         {"seed", required_argument, 0, O_SEED},
                                         {"threads", required_argument, 0, 'T'},
                                         {"sparsity", required_argument, 0, O_SPARSITY},
                                         {"layers", required_argument, 0, O_LAYERS},
                                         {"shards", required_argument, 0, O_SHARDS},
                                         {"stats", no_argument, 0, O_STATS},
                                         {"list", no_argument, 0, O_LIST},
                                         {"force", no_argument, 0, 'f'},
                                         {"quiet", no_argument, 0, 'q'},
                                         {"json", no_argument, 0, O_JSON},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    stz_synth_params p = STZ_SYNTH_PARAMS_DEFAULT;
    const char *out = NULL;
    int stats = 0, quiet = 0, json = 0, c;
    uint32_t nshards = 0;
    p.threads = cli_ncores();
    while ((c = getopt_long(argc, argv, "o:T:fqh", opts, NULL)) != -1) {
        char *end;
        switch (c) {
        case 'o': out = optarg; break;
        case O_DTYPE:
            if (stz_dtype_parse_nocase(optarg, &p.dtype) ||
                (p.dtype != STZ_DTYPE_BF16 && p.dtype != STZ_DTYPE_F16 && p.dtype != STZ_DTYPE_F32))
                return cli_usage_error("synth", "--dtype must be bf16, f16 or f32, not '%s'", optarg);
            break;
        case O_SEED:
            p.seed = strtoull(optarg, &end, 10);
            if (!*optarg || *end)
                return cli_usage_error("synth", "--seed takes a whole number, not '%s'", optarg);
            break;
        case 'T':
            if ((p.threads = cli_threads(optarg)) < 0)
                return cli_usage_error("synth", "-T takes 0..256, not '%s'", optarg);
            break;
        case O_SPARSITY:
            if (!strcmp(optarg, "2:4"))
                p.two_four = 1;
            else if (p.sparsity = strtod(optarg, &end), *end || end == optarg || !(p.sparsity >= 0 && p.sparsity < 1))
                return cli_usage_error("synth", "--sparsity takes a fraction in [0, 1) or 2:4, not '%s'", optarg);
            break;
        case O_LAYERS:
            p.layers = strtoull(optarg, &end, 10);
            if (!*optarg || *end || p.layers < 1 || p.layers > 1024)
                return cli_usage_error("synth", "--layers takes 1..1024, not '%s'", optarg);
            break;
        case O_SHARDS:
            nshards = (uint32_t)strtoul(optarg, &end, 10);
            if (!*optarg || *end || nshards < 1 || nshards > 99999)
                return cli_usage_error("synth", "--shards takes 1..99999, not '%s'", optarg);
            break;
        case O_STATS: stats = 1; break;
        case O_LIST: return list_archs();
        case 'f': p.write_flags |= STZ_WRITE_FORCE; break;
        case 'q': quiet = 1; break;
        case O_JSON: json = 1; break;
        case 'h': return fputs(synth_help, stdout), CLI_OK;
        default: return cli_bad_option("synth");
        }
    }
    if (optind != argc - 1)
        return cli_usage_error("synth", "expected one ARCH (see 'stz synth --list')");
    if (!out)
        return cli_usage_error("synth", "missing -o FILE");
    p.arch = argv[optind];
    cli_progress prog;
    cli_progress_init(&prog, "synth", quiet);
    p.progress = cli_progress_cb;
    p.progress_user = &prog;
    stz_synth_stats st;
    stz_err err;
    stz_status s = nshards ? stz_synth_write_dir(&p, out, nshards, &st, &err) : stz_synth_write(&p, out, &st, &err);
    cli_progress_end(&prog);
    if (s)
        return cli_fail(&err);
    double secs = cli_now() - prog.start;
    if (json) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "file", out);
        cJSON_AddStringToObject(o, "arch", p.arch);
        cJSON_AddStringToObject(o, "dtype", stz_dtype_name(p.dtype));
        cJSON_AddNumberToObject(o, "seed", (double)p.seed);
        cJSON_AddNumberToObject(o, "tensors", (double)st.tensors);
        cJSON_AddNumberToObject(o, "params", (double)st.params);
        cJSON_AddNumberToObject(o, "bytes", (double)st.bytes);
        cJSON_AddNumberToObject(o, "seconds", secs);
        cJSON_AddNumberToObject(o, "bf16_exponent_entropy_bits", st.exp_entropy_bits);
        return cli_print_json(o);
    }
    char a[32], b[32];
    if (!quiet)
        printf("%s: %s %s, %zu tensors, %s parameters, %s bytes in %.1f s\n", out, p.arch, stz_dtype_name(p.dtype),
               st.tensors, cli_commas(a, st.params), cli_commas(b, st.bytes), secs);
    if (stats)
        printf("BF16 exponent-byte entropy: %.3f bits/value (published real LLM checkpoints: 2.6-2.8)\n",
               st.exp_entropy_bits);
    return CLI_OK;
}
