/* stz inspect: what a model file holds. */
#include "cli.h"
#include "stz_safetensors.h"

#include <cjson/cJSON.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

static const char inspect_help[] =
    "usage: stz inspect [--json] FILE\n\n"
    "Lists every tensor of a SafeTensors file (name, dtype, shape, parameters,\n"
    "bytes) in file order, totals per dtype, and the __metadata__ entries.\n"
    "Only the header is read, so any file size takes the same memory.\n\n"
    "  --json      print the same as one JSON object\n"
    "  -h, --help  this text\n";

typedef struct {
    uint64_t tensors, params, bytes;
} totals;

static void shape_str(const stz_tensor *t, char *buf, size_t cap)
{
    size_t o = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < t->ndim && o < cap; d++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%llu", d ? ", " : "", (unsigned long long)t->shape[d]);
    if (o < cap)
        snprintf(buf + o, cap - o, "]");
}

static void sum_dtypes(const stz_reader *r, totals *by)
{
    memset(by, 0, sizeof(totals) * STZ_DTYPE_COUNT);
    for (size_t i = 0; i < stz_reader_count(r); i++) {
        const stz_tensor *t = stz_reader_tensor(r, i);
        by[t->dtype].tensors++;
        by[t->dtype].params += t->numel;
        by[t->dtype].bytes += t->end - t->begin;
    }
}

static int print_json(const stz_reader *r)
{
    totals by[STZ_DTYPE_COUNT];
    sum_dtypes(r, by);
    cJSON *o = cJSON_CreateObject(), *ts = cJSON_CreateArray(), *dts = cJSON_CreateObject(),
          *md = cJSON_CreateObject();
    uint64_t params = 0;
    cJSON_AddStringToObject(o, "file", stz_reader_path(r));
    cJSON_AddStringToObject(o, "format", "safetensors");
    cJSON_AddNumberToObject(o, "file_size", (double)stz_reader_file_size(r));
    cJSON_AddNumberToObject(o, "header_size", (double)stz_reader_data_offset(r) - 8);
    for (size_t i = 0; i < stz_reader_count(r); i++) {
        const stz_tensor *t = stz_reader_tensor(r, i);
        cJSON *e = cJSON_CreateObject(), *sh = cJSON_CreateArray();
        cJSON_AddStringToObject(e, "name", t->name);
        cJSON_AddStringToObject(e, "dtype", stz_dtype_name(t->dtype));
        for (int d = 0; d < t->ndim; d++)
            cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)t->shape[d]));
        cJSON_AddItemToObject(e, "shape", sh);
        cJSON_AddNumberToObject(e, "params", (double)t->numel);
        cJSON_AddNumberToObject(e, "bytes", (double)(t->end - t->begin));
        cJSON_AddNumberToObject(e, "offset", (double)(stz_reader_data_offset(r) + t->begin));
        cJSON_AddItemToArray(ts, e);
        params += t->numel;
    }
    for (int d = 0; d < STZ_DTYPE_COUNT; d++) {
        if (!by[d].tensors)
            continue;
        cJSON *e = cJSON_CreateObject();
        cJSON_AddNumberToObject(e, "tensors", (double)by[d].tensors);
        cJSON_AddNumberToObject(e, "params", (double)by[d].params);
        cJSON_AddNumberToObject(e, "bytes", (double)by[d].bytes);
        cJSON_AddItemToObject(dts, stz_dtype_name((stz_dtype)d), e);
    }
    for (size_t i = 0; i < stz_reader_meta_count(r); i++)
        cJSON_AddStringToObject(md, stz_reader_meta_key(r, i), stz_reader_meta_value(r, i));
    cJSON_AddNumberToObject(o, "tensor_count", (double)stz_reader_count(r));
    cJSON_AddNumberToObject(o, "params", (double)params);
    cJSON_AddItemToObject(o, "tensors", ts);
    cJSON_AddItemToObject(o, "dtypes", dts);
    cJSON_AddItemToObject(o, "metadata", md);
    char *s = cJSON_Print(o);
    cJSON_Delete(o);
    if (!s) {
        stz_err e;
        stz_err_set(&e, STZ_E_NOMEM, "out of memory printing JSON");
        return cli_fail(&e);
    }
    puts(s);
    free(s);
    return CLI_OK;
}

static void print_table(const stz_reader *r)
{
    char a[32], b[32], c[32], shape[256];
    size_t n = stz_reader_count(r), w = 4;
    uint64_t params = 0;
    for (size_t i = 0; i < n; i++) {
        size_t l = strlen(stz_reader_tensor(r, i)->name);
        w = l > w ? l : w;
        params += stz_reader_tensor(r, i)->numel;
    }
    w = w > 64 ? 64 : w;
    printf("%s: SafeTensors, %zu tensors, %s parameters, %s bytes (header %s)\n\n", stz_reader_path(r), n,
           cli_commas(a, params), cli_commas(b, stz_reader_file_size(r)),
           cli_commas(c, stz_reader_data_offset(r) - 8));
    printf("%-*s  %-11s  %-18s  %15s  %15s\n", (int)w, "name", "dtype", "shape", "params", "bytes");
    for (size_t i = 0; i < n; i++) {
        const stz_tensor *t = stz_reader_tensor(r, i);
        shape_str(t, shape, sizeof shape);
        printf("%-*s  %-11s  %-18s  %15s  %15s\n", (int)w, t->name, stz_dtype_name(t->dtype), shape,
               cli_commas(a, t->numel), cli_commas(b, t->end - t->begin));
    }
    totals by[STZ_DTYPE_COUNT];
    sum_dtypes(r, by);
    printf("\nby dtype:\n");
    for (int d = 0; d < STZ_DTYPE_COUNT; d++)
        if (by[d].tensors)
            printf("  %-11s %8llu tensors  %18s params  %18s bytes\n", stz_dtype_name((stz_dtype)d),
                   (unsigned long long)by[d].tensors, cli_commas(a, by[d].params), cli_commas(b, by[d].bytes));
    printf("\nmetadata:%s\n", stz_reader_meta_count(r) ? "" : " (none)");
    for (size_t i = 0; i < stz_reader_meta_count(r); i++)
        printf("  %s = %s\n", stz_reader_meta_key(r, i), stz_reader_meta_value(r, i));
}

int cmd_inspect(int argc, char **argv)
{
    static const struct option opts[] = {{"json", no_argument, 0, 'j'}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    int json = 0, c;
    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        if (c == 'j')
            json = 1;
        else if (c == 'h')
            return fputs(inspect_help, stdout), CLI_OK;
        else
            return cli_usage_error("inspect", "unknown option");
    }
    if (optind != argc - 1)
        return cli_usage_error("inspect", "expected one FILE");
    stz_err err;
    stz_reader *r;
    if (stz_reader_open(&r, argv[optind], &err))
        return cli_fail(&err);
    int rc = CLI_OK;
    if (json)
        rc = print_json(r);
    else
        print_table(r);
    stz_reader_free(r);
    return rc;
}
