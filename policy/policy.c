/* Policy engine: parse JSON rules, decide an action per tensor. */
#include "core/stz_core.h"
#include "stz_policy.h"
#include "quant/ggml_types.h"

#include <cjson/cJSON.h>
#include <fnmatch.h>
#include <math.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

typedef struct {
    char *pattern; /* as written, for messages */
    int is_regex;
    regex_t re;
    stz_decision d;      /* action and parameters */
    uint32_t dtype_mask; /* 0: any */
    int min_ndim, max_ndim;
    uint64_t min_numel;
    int include_1d;
    int optional; /* may match nothing (a head a tied model lacks): no warning */
    uint64_t hits;
} rule;

struct stz_policy {
    char *label;
    rule *rules;
    size_t n;
    stz_decision def;
    int def_method; /* the default gave a method: its rules inherit it */
};

/* A block width's method when neither the rule nor the default names one:
 * the one measured best at the same bytes (docs/POLICY.md: nl for int4,
 * mse for int8); absmax for the rest. */
static stz_qmethod width_method(stz_action a, stz_qmethod given)
{
    return a == STZ_ACTION_INT4 ? STZ_QMETHOD_NL : a == STZ_ACTION_INT8 ? STZ_QMETHOD_MSE : given;
}

static stz_decision default_decision(void)
{
    return (stz_decision){.action = STZ_ACTION_KEEP,
                          .block_size = 128,
                          .scale_dtype = STZ_DTYPE_F16,
                          .method = STZ_QMETHOD_ABSMAX,
                          .nonfinite = STZ_NONFINITE_ERROR,
                          .svd_power_iters = 1,
                          .svd_oversample = 10,
                          .fallback = STZ_ACTION_INT8,
                          .rule = -1};
}

/* Error for rule `i` (or the default when i < 0). */
static stz_status perr(stz_err *err, const stz_policy *p, int i, const char *pattern, const char *fmt, const char *a,
                       const char *b)
{
    char what[512], where[512];
    snprintf(what, sizeof what, fmt, a ? a : "", b ? b : "");
    if (i < 0)
        snprintf(where, sizeof where, "%s: %s", p->label, i == -1 ? "default" : "policy");
    else
        snprintf(where, sizeof where, "%s: rule %d ('%s')", p->label, i, pattern ? pattern : "?");
    return stz_err_set(err, STZ_E_POLICY, "%s: %s", where, what);
}

/* Every action's name, comma-separated, into buf (cut at cap). */
static const char *action_names(char *buf, size_t cap)
{
    size_t at = 0;
    stz_action a;
    int type;
    const char *n;
    for (size_t i = 0; (n = stz_action_nth(i, &a, &type)) && at < cap; i++)
        at += (size_t)snprintf(buf + at, cap - at, "%s%s", i ? ", " : "", n);
    return buf;
}

static int whole_in(const cJSON *v, double lo, double hi, double *out)
{
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < lo || v->valuedouble > hi)
        return 0;
    *out = v->valuedouble;
    return 1;
}

/* Reads the action and its parameters from `o` (an object) into d.
 * `where` is the rule index (-1: default). Unknown keys are refused.
 * Longer than most: one branch per key of docs/POLICY.md, in its order, so
 * that a key's rule reads in one place. */
static stz_status parse_action(stz_policy *p, int where, const char *pat, const cJSON *o, stz_decision *d, rule *r,
                               stz_err *err)
{
    const char *svd_key = NULL;  /* an SVD-only key, checked against the action */
    const char *rand_key = NULL; /* a key of the randomized method only */
    const char *dup = stz_json_duplicate_key(o);
    if (dup) /* cJSON keeps both and lookups see the first: which one was meant? */
        return perr(err, p, where, pat, "key '%s' appears twice", dup, NULL);
    for (const cJSON *k = o->child; k; k = k->next) {
        const char *key = k->string;
        double v;
        if (!strcmp(key, "match") && r) {
            continue; /* handled by the caller */
        } else if (!strcmp(key, "optional") && r) {
            if (!cJSON_IsBool(k))
                return perr(err, p, where, pat, "optional must be true or false", NULL, NULL);
            r->optional = cJSON_IsTrue(k);
        } else if (!strcmp(key, "action")) {
            char names[384];
            if (stz_action_parse(cJSON_GetStringValue(k), &d->action, &d->ggml_type))
                return perr(err, p, where, pat, "unknown action '%s' (%s)",
                            cJSON_IsString(k) ? k->valuestring : "(not a string)", action_names(names, sizeof names));
        } else if (!strcmp(key, "block_size")) {
            if (!whole_in(k, 1, 1 << 20, &v))
                return perr(err, p, where, pat, "block_size must be a whole number in [1, 1048576]", NULL, NULL);
            d->block_size = (uint32_t)v;
        } else if (!strcmp(key, "scale_dtype")) {
            if (!cJSON_IsString(k) || stz_dtype_parse_nocase(k->valuestring, &d->scale_dtype) ||
                (d->scale_dtype != STZ_DTYPE_F16 && d->scale_dtype != STZ_DTYPE_F32 && d->scale_dtype != STZ_DTYPE_U8))
                return perr(err, p, where, pat, "scale_dtype must be \"F16\", \"F32\" or \"U8\"", NULL, NULL);
        } else if (!strcmp(key, "method")) {
            int m = -1;
            for (int j = 0; j < STZ_QMETHOD_COUNT && cJSON_IsString(k); j++)
                if (!strcmp(k->valuestring, stz_qmethod_name((stz_qmethod)j)))
                    m = j;
            if (m >= 0)
                d->method = (stz_qmethod)m;
            else if (cJSON_IsString(k) && (!strcmp(k->valuestring, "exact") || !strcmp(k->valuestring, "randomized")))
                svd_key = "method", d->svd_randomized = k->valuestring[0] == 'r';
            else
                return perr(err, p, where, pat,
                            "method must be \"absmax\", \"mse\", \"full\", \"asym\", \"nl\", "
                            "\"nl-fit\" or \"trellis\" (int2..int8), \"exact\" or \"randomized\" (svd)",
                            NULL, NULL);
        } else if (!strcmp(key, "nonfinite")) {
            if (cJSON_IsString(k) && !strcmp(k->valuestring, "error"))
                d->nonfinite = STZ_NONFINITE_ERROR;
            else if (cJSON_IsString(k) && !strcmp(k->valuestring, "keep"))
                d->nonfinite = STZ_NONFINITE_KEEP;
            else
                return perr(err, p, where, pat, "nonfinite must be \"error\" or \"keep\"", NULL, NULL);
        } else if (r && !strcmp(key, "dtypes")) {
            if (!cJSON_IsArray(k) || !cJSON_GetArraySize(k))
                return perr(err, p, where, pat, "dtypes must be a non-empty array of dtype names", NULL, NULL);
            for (const cJSON *e = k->child; e; e = e->next) {
                stz_dtype dt;
                if (!cJSON_IsString(e) || stz_dtype_parse_nocase(e->valuestring, &dt))
                    return perr(err, p, where, pat, "unknown dtype '%s' in dtypes",
                                cJSON_IsString(e) ? e->valuestring : "(not a string)", NULL);
                r->dtype_mask |= 1u << dt;
            }
        } else if (r && (!strcmp(key, "min_ndim") || !strcmp(key, "max_ndim"))) {
            if (!whole_in(k, 0, STZ_ST_MAX_NDIM, &v))
                return perr(err, p, where, pat, "%s must be a whole number in [0, 64]", key, NULL);
            *(key[1] == 'i' ? &r->min_ndim : &r->max_ndim) = (int)v;
        } else if (r && !strcmp(key, "min_numel")) {
            if (!whole_in(k, 0, 9007199254740992.0, &v))
                return perr(err, p, where, pat, "min_numel must be a whole number >= 0", NULL, NULL);
            r->min_numel = (uint64_t)v;
        } else if (r && !strcmp(key, "include_1d")) {
            if (!cJSON_IsBool(k))
                return perr(err, p, where, pat, "include_1d must be true or false", NULL, NULL);
            r->include_1d = cJSON_IsTrue(k);
        } else if (!strcmp(key, "rank")) {
            if (!whole_in(k, 1, 1 << 30, &v))
                return perr(err, p, where, pat, "rank must be a whole number >= 1", NULL, NULL);
            d->svd_rank = (uint32_t)v, svd_key = key;
        } else if (!strcmp(key, "energy")) {
            if (!cJSON_IsNumber(k) || !(k->valuedouble > 0 && k->valuedouble <= 1))
                return perr(err, p, where, pat, "energy must be a number in (0, 1]", NULL, NULL);
            d->svd_energy = k->valuedouble, svd_key = key;
        } else if (!strcmp(key, "max_error")) {
            if (!cJSON_IsNumber(k) || !(k->valuedouble > 0 && k->valuedouble < 1))
                return perr(err, p, where, pat, "max_error must be a number in (0, 1)", NULL, NULL);
            d->svd_max_error = k->valuedouble, svd_key = key;
        } else if (!strcmp(key, "power_iters") || !strcmp(key, "oversample")) {
            int q = key[0] == 'p';
            if (!whole_in(k, 0, q ? 16 : 1024, &v))
                return perr(err, p, where, pat,
                            q ? "power_iters must be a whole number in [0, 16]"
                              : "oversample must be a whole number in [0, 1024]",
                            NULL, NULL);
            *(q ? &d->svd_power_iters : &d->svd_oversample) = (uint32_t)v;
            svd_key = rand_key = key;
        } else if (!strcmp(key, "fallback")) {
            if (cJSON_IsString(k) && !strcmp(k->valuestring, "keep"))
                d->fallback = STZ_ACTION_KEEP;
            else if (cJSON_IsString(k) && !strcmp(k->valuestring, "int8"))
                d->fallback = STZ_ACTION_INT8;
            else if (cJSON_IsString(k) && !strcmp(k->valuestring, "int4"))
                d->fallback = STZ_ACTION_INT4;
            else
                return perr(err, p, where, pat, "fallback must be \"keep\", \"int8\" or \"int4\"", NULL, NULL);
            svd_key = key;
        } else if (!strcmp(key, "feedback")) {
            if (!cJSON_IsBool(k))
                return perr(err, p, where, pat, "feedback must be true or false", NULL, NULL);
            d->feedback = cJSON_IsTrue(k);
        } else if (!strcmp(key, "pad")) {
            if (!cJSON_IsBool(k))
                return perr(err, p, where, pat, "pad must be true or false", NULL, NULL);
            d->pad = cJSON_IsTrue(k);
        } else if (!strcmp(key, "comment")) {
            continue;
        } else {
            return perr(err, p, where, pat, "unknown key '%s'", key, NULL);
        }
    }
    if (!cJSON_GetObjectItemCaseSensitive(o, "method") && !p->def_method)
        d->method = width_method(d->action, d->method);
    const char *block_key = cJSON_GetObjectItemCaseSensitive(o, "method")        ? "method"
                            : cJSON_GetObjectItemCaseSensitive(o, "block_size")  ? "block_size"
                            : cJSON_GetObjectItemCaseSensitive(o, "scale_dtype") ? "scale_dtype"
                                                                                 : NULL;
    if (block_key && stz_decision_ggml_type(d) >= 0)
        return perr(err, p, where, pat, "'%s' does not apply to '%s': llama.cpp's types fix their blocks and scales",
                    block_key, stz_action_name(d->action, d->ggml_type));
    if (svd_key && d->action != STZ_ACTION_SVD)
        return perr(err, p, where, pat, "'%s' applies to the svd action, not '%s'", svd_key,
                    stz_action_name(d->action, d->ggml_type));
    if (d->action == STZ_ACTION_SVD && (d->svd_rank > 0) + (d->svd_energy > 0) + (d->svd_max_error > 0) != 1)
        return perr(err, p, where, pat, "action 'svd' needs exactly one of rank, energy, max_error", NULL, NULL);
    if (d->method == STZ_QMETHOD_ASYM && d->scale_dtype == STZ_DTYPE_U8)
        return perr(err, p, where, pat,
                    "method \"asym\" stores its minimums beside the scales: scale_dtype must be "
                    "\"F16\" or \"F32\", not \"U8\"",
                    NULL, NULL);
    if ((d->method == STZ_QMETHOD_NL || d->method == STZ_QMETHOD_NL_FIT) &&
        stz_action_bits(d->action, d->ggml_type) > 6)
        return perr(err, p, where, pat, "methods \"nl\" and \"nl-fit\" take 2 to 6 bits (int2..int6)", NULL, NULL);
    if (d->method == STZ_QMETHOD_TRELLIS && d->action != STZ_ACTION_KEEP &&
        (stz_action_bits(d->action, d->ggml_type) < 2 || stz_action_bits(d->action, d->ggml_type) > 4 ||
         stz_decision_ggml_type(d) >= 0))
        return perr(err, p, where, pat, "method \"trellis\" takes 2 to 4 bits (int2..int4)", NULL, NULL);
    if (d->pad && (stz_decision_ggml_type(d) < 0 || !stz_action_is_block(d->action, d->ggml_type)))
        return perr(err, p, where, pat, "pad applies to llama.cpp's block types (q4_0..iq4_xs), not '%s'",
                    stz_action_name(d->action, d->ggml_type), NULL);
    if (d->feedback && !stz_action_is_block(d->action, d->ggml_type))
        return perr(err, p, where, pat, "feedback applies to block quantizations (int2..int8, q4_0..iq4_xs), not '%s'",
                    stz_action_name(d->action, d->ggml_type), NULL);
    if (rand_key && !d->svd_randomized)
        return perr(err, p, where, pat, "'%s' applies to method \"randomized\" only", rand_key, NULL);
    return STZ_OK;
}

/* glibc's regcomp copies a repeated piece once per repetition ("x+" is
 * "xx*", "x{2,4}" is "xx(x(x)?)?"), and its cost grows with the cube of the
 * number of pieces that can match the empty string ("x*", "x?") chained in
 * the copies: "(.*){1,640}z" took 29 s and 1.4 GB. So a pattern is measured
 * as compiled, counted repetition multiplying: its expanded atoms (at most
 * REGEX_MAX_ATOMS) and its expanded empty-matching pieces (at most
 * REGEX_MAX_EMPTY, under 0.05 s of regcomp). A quantifier right after
 * another is refused outright, and so is an unbounded repetition of
 * something that can match the empty string ("(.*)*", "((.*){0,}){1,40}":
 * regcomp's closure over its empty paths ran for minutes; fuzz_policy). */
enum { REGEX_MAX_ATOMS = 4096, REGEX_MAX_EMPTY = 100, REGEX_MAX_DEPTH = 64 };

typedef struct {
    const char *c; /* where the scan is */
    int bad;       /* a quantifier after a quantifier, or nesting too deep */
} regex_scan;

typedef struct {
    double atoms, empty; /* expanded atoms; expanded pieces that match "" */
    int nullable;        /* the whole can match "" */
} regex_cost;

static regex_cost regex_alternation(regex_scan *s, int depth);

/* One atom: a character, an escape, a bracket expression or a group. */
static regex_cost regex_atom(regex_scan *s, int depth)
{
    regex_cost a = {1, 0, 0};
    if (*s->c == '(') {
        s->c++;
        a = regex_alternation(s, depth + 1);
        if (*s->c == ')')
            s->c++;
        return a;
    }
    if (*s->c == '\\' && s->c[1])
        s->c++;
    else if (*s->c == '[') { /* one atom; ']' first is literal, [:class:] inside */
        s->c += s->c[1] == '^' ? 2 : 1;
        s->c += *s->c == ']';
        while (*s->c && *s->c != ']')
            s->c += s->c[0] == '[' && s->c[1] == ':' && strstr(s->c + 2, ":]") ? strstr(s->c + 2, ":]") - s->c + 2 : 1;
    }
    if (*s->c)
        s->c++;
    return a;
}

/* A quantifier at s->c applied to x; 0 when there is none. */
static int regex_quantifier(regex_scan *s, regex_cost *x)
{
    double lo, hi; /* hi < 0: unbounded */
    if (*s->c == '*' || *s->c == '+' || *s->c == '?') {
        lo = *s->c == '+', hi = *s->c == '?' ? 1 : -1;
        s->c++;
    } else if (*s->c == '{') {
        char *end;
        lo = strtod(s->c + 1, &end), hi = lo;
        if (*end == ',')
            hi = end[1] == '}' ? -1 : strtod(end + 1, &end);
        s->c = strchr(s->c, '}') ? strchr(s->c, '}') + 1 : s->c + strlen(s->c);
    } else {
        return 0;
    }
    if (x->nullable && hi < 0)
        s->bad = 1; /* repeating without bound what can match nothing */
    x->nullable |= lo == 0;
    /* x{lo,hi} is lo copies then hi - lo optional ones; x{lo,} is lo copies then x* */
    double copies = hi < 0 ? lo + 1 : hi;
    x->atoms *= copies > 1 ? copies : 1;
    x->empty = x->empty * (copies > 1 ? copies : 1) + (lo == 0 || hi < 0);
    return 1;
}

static regex_cost regex_alternation(regex_scan *s, int depth)
{
    regex_cost sum = {0, 0, 0};
    int branch = 1; /* the branch so far matches "" */
    if (depth > REGEX_MAX_DEPTH)
        s->bad = 1;
    while (*s->c && *s->c != ')' && !s->bad) {
        if (*s->c == '|') {
            s->c++;
            sum.nullable |= branch, branch = 1;
            continue;
        }
        regex_cost x = regex_atom(s, depth);
        if (regex_quantifier(s, &x) && regex_quantifier(s, &x))
            s->bad = 1;
        sum.atoms += x.atoms, sum.empty += x.empty, branch &= x.nullable;
        if (sum.atoms > REGEX_MAX_ATOMS || sum.empty > REGEX_MAX_EMPTY)
            s->bad = 1;
    }
    sum.nullable |= branch;
    return sum;
}

/* What is wrong with a rule's regular expression, or NULL. */
static const char *regex_problem(const char *re)
{
    regex_scan s = {re, 0};
    regex_cost sum = regex_alternation(&s, 0);
    if (*s.c == ')') /* regcomp reads it as a character; inside "^(...)$" it would close the anchoring group */
        return "unmatched ')' in the regular expression (write \\) for the character)";
    if (s.bad || sum.atoms > REGEX_MAX_ATOMS || sum.empty > REGEX_MAX_EMPTY)
        return "regular expression too costly to compile (a repetition of a repetition, an unbounded one of what "
               "can match nothing, or counted repetitions expanding past 4096 atoms or 100 pieces that match the "
               "empty string): simplify it";
    return NULL;
}

/* Only the known top-level keys, each once. */
static stz_status check_top_level(stz_policy *p, const cJSON *root, stz_err *err)
{
    if (stz_json_duplicate_key(root))
        return perr(err, p, -2, NULL, "top-level key '%s' appears twice", stz_json_duplicate_key(root), NULL);
    for (const cJSON *k = root->child; k; k = k->next)
        if (strcmp(k->string, "default") && strcmp(k->string, "rules") && strcmp(k->string, "description") &&
            strcmp(k->string, "comment"))
            return perr(err, p, -2, NULL, "unknown top-level key '%s' (default, rules, description)", k->string, NULL);
    return STZ_OK;
}

/* "default": an action name, or an object of action keys. */
static stz_status parse_default(stz_policy *p, const cJSON *root, stz_err *err)
{
    const cJSON *def = cJSON_GetObjectItemCaseSensitive(root, "default");
    stz_status st = STZ_OK;
    if (cJSON_IsString(def)) {
        cJSON *tmp = cJSON_CreateObject();
        if (!cJSON_AddStringToObject(tmp, "action", def->valuestring))
            st = stz_err_set(err, STZ_E_NOMEM, "%s: out of memory reading its default", p->label);
        else
            st = parse_action(p, -1, NULL, tmp, &p->def, NULL, err);
        cJSON_Delete(tmp);
    } else if (cJSON_IsObject(def)) {
        st = parse_action(p, -1, NULL, def, &p->def, NULL, err);
        p->def_method = cJSON_GetObjectItemCaseSensitive(def, "method") != NULL;
    } else if (def) {
        st = perr(err, p, -1, NULL, "must be an action name or an object", NULL, NULL);
    }
    return st;
}

/* A "re:" rule's pattern, anchored to the whole name and compiled. */
static stz_status compile_regex(stz_policy *p, int i, rule *r, stz_err *err)
{
    size_t l = strlen(r->pattern);
    const char *problem = regex_problem(r->pattern + 3);
    if (problem)
        return perr(err, p, i, r->pattern, "%s", problem, NULL);
    char *anch = malloc(l + 4);
    if (!anch)
        return stz_err_set(err, STZ_E_NOMEM, "%s: out of memory for rule %d", p->label, i);
    snprintf(anch, l + 4, "^(%s)$", r->pattern + 3); /* the whole name must match */
    int rc = regcomp(&r->re, anch, REG_EXTENDED | REG_NOSUB);
    free(anch);
    if (rc) {
        char msg[128];
        regerror(rc, &r->re, msg, sizeof msg);
        return perr(err, p, i, r->pattern, "bad regular expression: %s", msg, NULL);
    }
    r->is_regex = 1;
    return STZ_OK;
}

/* Rule i (rj) into p->rules[i]: its pattern, its action over the default's. */
static stz_status parse_rule(stz_policy *p, int i, const cJSON *rj, stz_err *err)
{
    rule *r = &p->rules[i];
    const cJSON *m = cJSON_IsObject(rj) ? cJSON_GetObjectItemCaseSensitive(rj, "match") : NULL;
    if (!cJSON_IsString(m))
        return perr(err, p, i, NULL, cJSON_IsObject(rj) ? "missing \"match\" (a string)" : "not an object", NULL, NULL);
    if (!(r->pattern = strdup(m->valuestring)))
        return stz_err_set(err, STZ_E_NOMEM, "%s: out of memory for rule %d", p->label, i);
    p->n++;
    r->d = p->def;
    r->d.rule = i;
    r->max_ndim = STZ_ST_MAX_NDIM;
    if (!cJSON_GetObjectItemCaseSensitive(rj, "action"))
        return perr(err, p, i, r->pattern, "missing \"action\"", NULL, NULL);
    stz_status st = parse_action(p, i, r->pattern, rj, &r->d, r, err);
    if (!st && !strncmp(r->pattern, "re:", 3))
        st = compile_regex(p, i, r, err);
    return st;
}

stz_status stz_policy_parse(stz_policy **out, const char *json, size_t len, const char *label, stz_err *err)
{
    *out = NULL;
    stz_policy *p = calloc(1, sizeof *p);
    if (!p || !(p->label = strdup(label ? label : "policy"))) {
        free(p);
        return stz_err_set(err, STZ_E_NOMEM, "%s: out of memory reading the policy", label ? label : "policy");
    }
    p->def = default_decision();
    stz_status st = STZ_OK;
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root || !cJSON_IsObject(root)) {
        st = stz_err_set(err, STZ_E_POLICY, "%s: not a JSON object%s", p->label, root ? "" : " (invalid JSON)");
        goto cleanup;
    }
    STZ_TRY(st, check_top_level(p, root, err));
    STZ_TRY(st, parse_default(p, root, err));
    const cJSON *rules = cJSON_GetObjectItemCaseSensitive(root, "rules");
    if (rules && !cJSON_IsArray(rules)) {
        st = perr(err, p, -2, NULL, "'rules' must be an array", NULL, NULL);
        goto cleanup;
    }
    size_t n = rules ? (size_t)cJSON_GetArraySize(rules) : 0;
    if (!(p->rules = calloc(n + 1, sizeof *p->rules))) {
        st = stz_err_set(err, STZ_E_NOMEM, "%s: out of memory for %zu rules", p->label, n);
        goto cleanup;
    }
    int i = 0;
    for (const cJSON *rj = rules ? rules->child : NULL; rj; rj = rj->next, i++)
        STZ_TRY(st, parse_rule(p, i, rj, err));
cleanup:
    cJSON_Delete(root);
    if (st) {
        stz_policy_free(p);
        return st;
    }
    *out = p;
    return STZ_OK;
}

void stz_policy_free(stz_policy *p)
{
    if (!p)
        return;
    for (size_t i = 0; i < p->n; i++) {
        if (p->rules[i].is_regex)
            regfree(&p->rules[i].re);
        free(p->rules[i].pattern);
    }
    free(p->rules);
    free(p->label);
    free(p);
}

stz_status stz_policy_load(stz_policy **out, const char *path_or_name, stz_err *err)
{
    *out = NULL;
    struct stat sb;
    if (stat(path_or_name, &sb) != 0) {
        const char *text = stz_policy_builtin_text(path_or_name);
        if (text) {
            char label[128];
            snprintf(label, sizeof label, "policy '%s' (built in)", path_or_name);
            return stz_policy_parse(out, text, strlen(text), label, err);
        }
        return stz_err_set(err, STZ_E_IO,
                           "%s: no such policy file, and not a shipped policy name "
                           "(int8, int5, int4, int4-small, gguf-q4_0, gguf-q8_0, lossless, gpt-neo-surgical)",
                           path_or_name);
    }
    char *buf;
    size_t len;
    stz_status st = stz_read_text(path_or_name, 64u << 20, &buf, &len, err);
    if (st)
        return st;
    st = stz_policy_parse(out, buf, len, path_or_name, err);
    free(buf);
    return st;
}

static int rule_matches(const rule *r, const stz_tensor *t)
{
    if (r->dtype_mask && !(r->dtype_mask & (1u << t->dtype)))
        return 0;
    if (t->ndim < r->min_ndim || t->ndim > r->max_ndim || t->numel < r->min_numel)
        return 0;
    if (r->is_regex)
        return regexec(&r->re, t->name, 0, NULL, 0) == 0;
    return fnmatch(r->pattern, t->name, 0) == 0;
}

stz_decision stz_policy_decide(stz_policy *p, const stz_tensor *t)
{
    stz_decision d = p->def;
    int include_1d = 0;
    for (size_t i = 0; i < p->n; i++)
        if (rule_matches(&p->rules[i], t)) {
            __atomic_fetch_add(&p->rules[i].hits, 1, __ATOMIC_RELAXED); /* shards may be decided at once */
            d = p->rules[i].d;
            include_1d = p->rules[i].include_1d;
            break;
        }
    if (d.action == STZ_ACTION_KEEP)
        return d;
    int floaty = t->dtype == STZ_DTYPE_BF16 || t->dtype == STZ_DTYPE_F16 || t->dtype == STZ_DTYPE_F32 ||
                 t->dtype == STZ_DTYPE_F64;
    if (!floaty)
        d.reason = "not a float tensor (BF16, F16, F32, F64)";
    else if (t->numel == 0)
        d.reason = "empty tensor";
    else if (t->ndim < 2 && !include_1d)
        d.reason = "fewer than 2 dimensions (rule needs \"include_1d\": true)";
    if (d.reason)
        d.action = STZ_ACTION_KEEP;
    int type = stz_decision_ggml_type(&d), fb;
    uint64_t row = t->ndim >= 2 ? t->shape[t->ndim - 1] : t->numel;
    if (type >= 0 && (fb = stz_ggml_fit(type, row, d.pad)) != type) { /* as llama.cpp's quantize, or padded */
        fb = fb == STZ_GGML_F16 && t->dtype == STZ_DTYPE_BF16 ? STZ_GGML_BF16 : fb;
        d.ggml_type = fb;
        d.reason = d.pad && row % STZ_GGML_QK
                       ? "rows are not whole 32-blocks: padded, in the 32-block type llama.cpp falls back to"
                   : stz_ggml_block(type) == 256 && fb != STZ_GGML_F16 && fb != STZ_GGML_BF16
                       ? "rows are not whole 256-blocks: the 32-block type llama.cpp falls back to"
                       : "rows are not whole 32-blocks: a float type, as llama.cpp keeps them";
    }
    if (d.method == STZ_QMETHOD_TRELLIS && stz_action_is_block(d.action, d.ggml_type) &&
        !stz_trellis_fits(stz_action_bits(d.action, d.ggml_type), row ? t->numel / row : 0))
        d.method = STZ_QMETHOD_NL, d.reason = "too few rows for a trellis (12 / bits): nl";
    d.feedback &= stz_action_is_block(d.action, d.ggml_type); /* kept, or a float type by the fallback */
    return d;
}

int stz_policy_feedback(const stz_policy *p)
{
    int any = p->def.feedback;
    for (size_t i = 0; i < p->n; i++)
        any |= p->rules[i].d.feedback;
    return any;
}

size_t stz_policy_rule_count(const stz_policy *p) { return p->n; }
const char *stz_policy_rule_pattern(const stz_policy *p, size_t i) { return i < p->n ? p->rules[i].pattern : NULL; }
int stz_policy_rule_optional(const stz_policy *p, size_t i) { return i < p->n && p->rules[i].optional; }

uint64_t stz_policy_rule_hits(const stz_policy *p, size_t i)
{
    return i < p->n ? __atomic_load_n(&p->rules[i].hits, __ATOMIC_RELAXED) : 0;
}
