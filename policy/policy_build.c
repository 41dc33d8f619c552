/* A policy with rules and settings given on top of it, as the command
 * line gives them (--set, --keep, --method, --block-size, --feedback;
 * docs/POLICY.md, "Command-line rules"): the policy's JSON edited, then
 * parsed. */
#include "core/stz_core.h"
#include "stz_policy.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* "PATTERN=ACTION[:key=value...]" as a rule object; PATTERN ends at the
 * first '='. Values that read as numbers or true/false are JSON numbers or
 * booleans, others strings. */
static cJSON *parse_set(const char *text, stz_err *err)
{
    const char *eq = strchr(text, '=');
    if (!eq || eq == text)
        return stz_err_set(err, STZ_E_ARG, "--set '%s': expected PATTERN=ACTION[:key=value...]", text), NULL;
    cJSON *r = cJSON_CreateObject();
    char *pat = strndup(text, (size_t)(eq - text)), *rest = strdup(eq + 1), *save = NULL;
    cJSON_AddStringToObject(r, "match", pat ? pat : "");
    int first = 1;
    for (char *tok = strtok_r(rest, ":", &save); tok; tok = strtok_r(NULL, ":", &save), first = 0) {
        if (first) {
            cJSON_AddStringToObject(r, "action", tok);
            continue;
        }
        char *kv = strchr(tok, '='), *end;
        if (!kv || kv == tok) {
            stz_err_set(err, STZ_E_ARG, "--set '%s': '%s' is not key=value", text, tok);
            cJSON_Delete(r), r = NULL;
            break;
        }
        *kv++ = 0;
        double d = strtod(kv, &end);
        if (*kv && !*end)
            cJSON_AddNumberToObject(r, tok, d);
        else if (!strcmp(kv, "true") || !strcmp(kv, "false"))
            cJSON_AddBoolToObject(r, tok, kv[0] == 't');
        else
            cJSON_AddStringToObject(r, tok, kv);
    }
    if (r && first)
        stz_err_set(err, STZ_E_ARG, "--set '%s': no action after '='", text), cJSON_Delete(r), r = NULL;
    free(pat);
    free(rest);
    return r;
}

/* --method / --block-size on every int2..int8 rule and default. asym
 * keeps its minimums in the scales' dtype, which cannot be U8: F16 then.
 * Returns 1 if o is such a rule. */
static int apply_quant_opts(cJSON *o, const stz_policy_spec *spec)
{
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, "action");
    int said = cJSON_GetObjectItemCaseSensitive(o, "feedback") != NULL;
    stz_action kind;
    int type;
    if (spec->feedback && !stz_action_parse(cJSON_GetStringValue(a), &kind, &type) && stz_action_is_block(kind, type) &&
        (spec->feedback == STZ_POLICY_FEEDBACK_ALL || !said)) {
        cJSON_DeleteItemFromObjectCaseSensitive(o, "feedback"); /* every block quantization */
        cJSON_AddBoolToObject(o, "feedback", 1);
    }
    if (!cJSON_IsString(a) || strncmp(a->valuestring, "int", 3))
        return 0;
    if (spec->method) {
        cJSON_DeleteItemFromObjectCaseSensitive(o, "method");
        cJSON_AddStringToObject(o, "method", spec->method);
        const cJSON *sd = cJSON_GetObjectItemCaseSensitive(o, "scale_dtype");
        if (!strcmp(spec->method, "asym") && cJSON_IsString(sd) && !strcmp(sd->valuestring, "U8")) {
            cJSON_DeleteItemFromObjectCaseSensitive(o, "scale_dtype");
            cJSON_AddStringToObject(o, "scale_dtype", "F16");
        }
    }
    if (spec->block_size) {
        cJSON_DeleteItemFromObjectCaseSensitive(o, "block_size");
        cJSON_AddNumberToObject(o, "block_size", spec->block_size);
    }
    return 1;
}

stz_status stz_policy_build(const stz_policy_spec *spec, stz_policy **out, stz_err *err)
{
    char *text = NULL;
    const char *src = spec->policy ? spec->policy : "{\"default\": \"keep\"}";
    struct stat sb;
    *out = NULL;
    if (!spec->nrules && !spec->method && !spec->block_size && !spec->feedback)
        return stz_policy_load(out, spec->policy, err);
    if (spec->policy && stat(spec->policy, &sb) == 0) {
        stz_status st = stz_read_text(spec->policy, 64u << 20, &text, NULL, err);
        if (st)
            return st;
        src = text;
    } else if (spec->policy && !(src = stz_policy_builtin_text(spec->policy))) {
        return stz_policy_load(out, spec->policy, err); /* its error names the problem */
    }
    /* parse as given first: errors in the file are reported against it */
    stz_policy *check;
    stz_status st = stz_policy_parse(&check, src, strlen(src), spec->policy ? spec->policy : "policy", err);
    stz_policy_free(check);
    stz_json_begin(); /* an item cJSON could not allocate is dropped silently: a policy with a rule missing */
    cJSON *root = st ? NULL : cJSON_Parse(src);
    free(text);
    if (st)
        return st;
    if (!root)
        return stz_err_set(err, STZ_E_NOMEM, "out of memory for the policy");
    cJSON *rules = cJSON_GetObjectItemCaseSensitive(root, "rules"),
          *def = cJSON_GetObjectItemCaseSensitive(root, "default");
    if (!rules)
        cJSON_AddItemToObject(root, "rules", rules = cJSON_CreateArray());
    if (cJSON_IsString(def)) { /* as an object, so that --method can reach it */
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "action", def->valuestring);
        cJSON_ReplaceItemInObjectCaseSensitive(root, "default", def = o);
    }
    int applied = def ? apply_quant_opts(def, spec) : 0;
    for (cJSON *r = rules->child; r; r = r->next)
        applied += apply_quant_opts(r, spec);
    /* command-line rules come first, in the order given: first match wins */
    for (size_t k = spec->nrules; k > 0 && !st; k--) {
        size_t i = k - 1;
        cJSON *r;
        if (spec->rules[i].keep) {
            r = cJSON_CreateObject();
            cJSON_AddStringToObject(r, "match", spec->rules[i].text);
            cJSON_AddStringToObject(r, "action", "keep");
        } else if (!(r = parse_set(spec->rules[i].text, err))) {
            st = err->code;
            break;
        }
        applied += apply_quant_opts(r, spec);
        cJSON_InsertItemInArray(rules, 0, r);
    }
    if (!st && (spec->method || spec->block_size) && !applied)
        st = stz_err_set(err, STZ_E_ARG,
                         "--method/--block-size: %s has no int2..int8 rule to change (llama.cpp's types have their "
                         "own blocks; --policy int4-nl is the nl policy of stz's own format)",
                         spec->policy ? spec->policy : "the policy");
    char *merged = st ? NULL : cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!st && (!merged || stz_json_failed()))
        st = stz_err_set(err, STZ_E_NOMEM, "out of memory for the policy");
    if (st) {
        free(merged);
        return st;
    }
    char label[512];
    if (spec->nrules)
        snprintf(label, sizeof label, "%s with command-line rules (0..%zu)", spec->policy ? spec->policy : "policy",
                 spec->nrules - 1);
    else
        snprintf(label, sizeof label, "%s with --method/--block-size/--feedback",
                 spec->policy ? spec->policy : "policy");
    st = stz_policy_parse(out, merged, strlen(merged), label, err);
    free(merged);
    return st;
}
