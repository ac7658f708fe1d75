/* json_schema.c - JSON Schema -> GBNF, and the built-in JSON grammar.
 *
 * Objects with properties are written in the schema's property order:
 * required properties must appear, optional ones may be left out, no other
 * keys (generation needs a closed form; additionalProperties only applies
 * to an object without properties). Whitespace between tokens is bounded
 * so a constrained model cannot pad forever. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar/grammar.h"
#include "template/jinja.h"

#define JSON_COMMON                                                                               \
    "ws ::= | \" \" | \"\\n\" [ \\t]{0,16}\n"                                                      \
    "json-string ::= \"\\\"\" json-char* \"\\\"\"\n"                                              \
    "json-char ::= [^\"\\\\\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4})\n"      \
    "json-number ::= json-integer (\".\" [0-9]{1,16})? ([eE] [-+]? [0-9]{1,3})?\n"                 \
    "json-integer ::= \"-\"? ([0-9] | [1-9] [0-9]{1,15})\n"                                       \
    "json-boolean ::= \"true\" | \"false\"\n"                                                     \
    "json-null ::= \"null\"\n"                                                                    \
    "json-value ::= json-object | json-array | json-string | json-number | json-boolean | "       \
    "json-null\n"                                                                                 \
    "json-object ::= \"{\" ws (json-string ws \":\" ws json-value ws (\",\" ws json-string ws "   \
    "\":\" ws json-value ws)*)? \"}\"\n"                                                          \
    "json-array ::= \"[\" ws (json-value ws (\",\" ws json-value ws)*)? \"]\"\n"

const char *mf_grammar_json_object_gbnf(void) { return "root ::= json-object\n" JSON_COMMON; }

typedef struct conv {
    mf_jbuf out;
    int n_rules;
    mf_jv root;            /* the whole schema, for $ref */
    mf_jv defs_done;       /* names of $defs already written (dict name -> rule) */
    mf_arena *a;
    mf_error *err;
    int depth;
} conv;

static int convert(conv *C, mf_jv s, const char *path, char *rule_out, size_t rule_cap);

static void new_name(conv *C, char *buf, size_t cap) { snprintf(buf, cap, "s%d", C->n_rules++); }

/* A GBNF string literal for the bytes. */
static void add_literal(mf_jbuf *b, const char *s, size_t n) {
    mf_jbuf_add(b, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        char tmp[8];
        if (c == '"' || c == '\\') {
            tmp[0] = '\\';
            tmp[1] = (char)c;
            mf_jbuf_add(b, tmp, 2);
        } else if (c < 0x20) {
            snprintf(tmp, sizeof tmp, "\\x%02X", c);
            mf_jbuf_adds(b, tmp);
        } else {
            mf_jbuf_add(b, (const char *)&s[i], 1);
        }
    }
    mf_jbuf_add(b, "\"", 1);
}

/* A rule whose alternatives are the JSON texts of the values. */
static int literal_rule(conv *C, const mf_jv *vals, size_t n, char *rule, size_t cap) {
    mf_jbuf alt = {0};
    mf_jbuf_add(&alt, "", 0);
    for (size_t i = 0; i < n; i++) {
        mf_jbuf j = {0};
        if (mf_jv_to_json(&j, vals[i], -1, false, C->err)) {
            free(j.p);
            free(alt.p);
            return -1;
        }
        if (i)
            mf_jbuf_adds(&alt, " | ");
        add_literal(&alt, j.p, j.n);
        free(j.p);
    }
    new_name(C, rule, cap);
    mf_jbuf_adds(&C->out, rule);
    mf_jbuf_adds(&C->out, " ::= ");
    mf_jbuf_add(&C->out, alt.p ? alt.p : "", alt.n);
    mf_jbuf_adds(&C->out, "\n");
    free(alt.p);
    return 0;
}

static bool key_is(mf_jv k, const char *s) {
    return k.t == MF_JV_STR && k.u.s.n == strlen(s) && !memcmp(k.u.s.p, s, k.u.s.n);
}

static int get_count(conv *C, mf_jv s, const char *key, const char *path, long def, long *out) {
    mf_jv v = mf_jv_dict_get(s, key, strlen(key));
    *out = def;
    if (v.t == MF_JV_UNDEF)
        return 0;
    if (v.t != MF_JV_INT || v.u.i < 0 || v.u.i > 10000)
        return mf_errorf(C->err, "json schema: %s: '%s' must be an integer in 0..10000", path, key);
    *out = (long)v.u.i;
    return 0;
}

static int object_rule(conv *C, mf_jv s, const char *path, char *rule, size_t cap) {
    mf_jv props = mf_jv_dict_get(s, "properties", 10), req = mf_jv_dict_get(s, "required", 8),
          addl = mf_jv_dict_get(s, "additionalProperties", 20);
    if (props.t != MF_JV_UNDEF && props.t != MF_JV_DICT)
        return mf_errorf(C->err, "json schema: %s: 'properties' must be an object", path);
    if (req.t != MF_JV_UNDEF && req.t != MF_JV_LIST)
        return mf_errorf(C->err, "json schema: %s: 'required' must be an array", path);
    size_t np = props.t == MF_JV_DICT ? props.u.d->n : 0;
    if (req.t == MF_JV_LIST)
        for (size_t i = 0; i < req.u.l->n; i++) {
            mf_jv r = req.u.l->v[i];
            bool found = false;
            for (size_t k = 0; k < np && !found; k++)
                found = r.t == MF_JV_STR && mf_jv_equal(props.u.d->k[k], r);
            if (!found)
                return mf_errorf(C->err, "json schema: %s: required property '%.*s' is not in "
                                         "'properties'", path, r.t == MF_JV_STR ? (int)r.u.s.n : 1,
                                 r.t == MF_JV_STR ? r.u.s.p : "?");
        }
    new_name(C, rule, cap);
    if (!np) {
        /* a map: additionalProperties names the value schema (or any value) */
        char val[32] = "json-value";
        if (addl.t == MF_JV_BOOL && !addl.u.b) {
            mf_jbuf_adds(&C->out, rule);
            mf_jbuf_adds(&C->out, " ::= \"{\" ws \"}\"\n");
            return 0;
        }
        if (addl.t == MF_JV_DICT) {
            char p2[256];
            snprintf(p2, sizeof p2, "%s/additionalProperties", path);
            if (convert(C, addl, p2, val, sizeof val))
                return -1;
        }
        char line[256];
        snprintf(line, sizeof line,
                 "%s ::= \"{\" ws (json-string ws \":\" ws %s ws (\",\" ws json-string ws \":\" ws %s "
                 "ws)*)? \"}\"\n", rule, val, val);
        mf_jbuf_adds(&C->out, line);
        return 0;
    }
    if (addl.t == MF_JV_DICT || (addl.t == MF_JV_BOOL && addl.u.b))
        return mf_errorf(C->err, "json schema: %s: additionalProperties with properties is not "
                                 "supported (generation writes the listed properties only)", path);
    /* kv_i, then A_i (nothing written yet) and B_i (something written) */
    char (*kv)[32] = mf_malloc(np * sizeof *kv);
    bool *required = mf_calloc(np, 1);
    for (size_t k = 0; k < np; k++) {
        mf_jv name = props.u.d->k[k];
        if (req.t == MF_JV_LIST)
            for (size_t i = 0; i < req.u.l->n; i++)
                required[k] |= mf_jv_equal(req.u.l->v[i], name);
        char val[32], p2[256];
        snprintf(p2, sizeof p2, "%s/properties/%.*s", path, (int)name.u.s.n, name.u.s.p);
        if (convert(C, props.u.d->v[k], p2, val, sizeof val)) {
            free(kv);
            free(required);
            return -1;
        }
        new_name(C, kv[k], sizeof kv[k]);
        mf_jbuf j = {0};
        mf_jv_to_json(&j, name, -1, false, C->err);
        mf_jbuf_adds(&C->out, kv[k]);
        mf_jbuf_adds(&C->out, " ::= ");
        add_literal(&C->out, j.p, j.n);
        free(j.p);
        mf_jbuf_adds(&C->out, " ws \":\" ws ");
        mf_jbuf_adds(&C->out, val);
        mf_jbuf_adds(&C->out, " ws\n");
    }
    int base = C->n_rules;
    C->n_rules += 2 * (int)(np + 1);
    char line[256];
    for (size_t k = 0; k <= np; k++) {
        int A = base + 2 * (int)k, B = A + 1;
        if (k == np)
            snprintf(line, sizeof line, "s%d ::= \"\"\ns%d ::= \"\"\n", A, B);
        else if (required[k])
            snprintf(line, sizeof line, "s%d ::= %s s%d\ns%d ::= \",\" ws %s s%d\n", A, kv[k], B + 2,
                     B, kv[k], B + 2);
        else
            snprintf(line, sizeof line, "s%d ::= %s s%d | s%d\ns%d ::= \",\" ws %s s%d | s%d\n", A,
                     kv[k], B + 2, A + 2, B, kv[k], B + 2, B + 2);
        mf_jbuf_adds(&C->out, line);
    }
    free(kv);
    free(required);
    snprintf(line, sizeof line, "%s ::= \"{\" ws s%d \"}\"\n", rule, base);
    mf_jbuf_adds(&C->out, line);
    return 0;
}

static int array_rule(conv *C, mf_jv s, const char *path, char *rule, size_t cap) {
    mf_jv items = mf_jv_dict_get(s, "items", 5);
    long mn, mx;
    if (get_count(C, s, "minItems", path, 0, &mn) || get_count(C, s, "maxItems", path, -1, &mx))
        return -1;
    if (mx >= 0 && mx < mn)
        return mf_errorf(C->err, "json schema: %s: maxItems %ld < minItems %ld", path, mx, mn);
    char item[32] = "json-value";
    if (items.t == MF_JV_DICT) {
        char p2[256];
        snprintf(p2, sizeof p2, "%s/items", path);
        if (convert(C, items, p2, item, sizeof item))
            return -1;
    } else if (items.t != MF_JV_UNDEF) {
        return mf_errorf(C->err, "json schema: %s: 'items' must be a schema object", path);
    }
    new_name(C, rule, cap);
    char line[320], rep[48];
    if (mx == 0) {
        snprintf(line, sizeof line, "%s ::= \"[\" ws \"]\"\n", rule);
    } else {
        long lo = mn > 0 ? mn - 1 : 0;
        if (mx < 0)
            snprintf(rep, sizeof rep, "{%ld,}", lo);
        else
            snprintf(rep, sizeof rep, "{%ld,%ld}", lo, mx - 1);
        snprintf(line, sizeof line, "%s ::= \"[\" ws %s%s ws (\",\" ws %s ws)%s%s \"]\"\n", rule,
                 mn > 0 ? "" : "(", item, item, rep, mn > 0 ? "" : ")?");
    }
    mf_jbuf_adds(&C->out, line);
    return 0;
}

static int string_rule(conv *C, mf_jv s, const char *path, char *rule, size_t cap) {
    long mn, mx;
    if (get_count(C, s, "minLength", path, 0, &mn) || get_count(C, s, "maxLength", path, -1, &mx))
        return -1;
    if (mn == 0 && mx < 0) {
        snprintf(rule, cap, "json-string");
        return 0;
    }
    if (mx >= 0 && mx < mn)
        return mf_errorf(C->err, "json schema: %s: maxLength %ld < minLength %ld", path, mx, mn);
    new_name(C, rule, cap);
    char line[160];
    if (mx < 0)
        snprintf(line, sizeof line, "%s ::= \"\\\"\" json-char{%ld,} \"\\\"\"\n", rule, mn);
    else
        snprintf(line, sizeof line, "%s ::= \"\\\"\" json-char{%ld,%ld} \"\\\"\"\n", rule, mn, mx);
    mf_jbuf_adds(&C->out, line);
    return 0;
}

static int type_rule(conv *C, mf_jv s, mf_jv type, const char *path, char *rule, size_t cap) {
    if (type.t != MF_JV_STR)
        return mf_errorf(C->err, "json schema: %s: 'type' must be a string or an array of strings",
                         path);
    if (key_is(type, "object"))
        return object_rule(C, s, path, rule, cap);
    if (key_is(type, "array"))
        return array_rule(C, s, path, rule, cap);
    if (key_is(type, "string"))
        return string_rule(C, s, path, rule, cap);
    const char *fixed = key_is(type, "number") ? "json-number" : key_is(type, "integer") ? "json-integer"
                        : key_is(type, "boolean") ? "json-boolean" : key_is(type, "null") ? "json-null"
                        : NULL;
    if (!fixed)
        return mf_errorf(C->err, "json schema: %s: unknown type '%.*s'", path, (int)type.u.s.n, type.u.s.p);
    snprintf(rule, cap, "%s", fixed);
    return 0;
}

static int alternatives(conv *C, mf_jv list, const char *path, const char *what, char *rule,
                        size_t cap, mf_jv base) {
    if (list.t != MF_JV_LIST || !list.u.l->n)
        return mf_errorf(C->err, "json schema: %s: '%s' must be a non-empty array", path, what);
    mf_jbuf alt = {0};
    mf_jbuf_add(&alt, "", 0);
    for (size_t i = 0; i < list.u.l->n; i++) {
        char sub[32], p2[256];
        snprintf(p2, sizeof p2, "%s/%s/%zu", path, what, i);
        mf_jv item = list.u.l->v[i];
        if (base.t == MF_JV_DICT && item.t == MF_JV_STR) { /* a type list */
            if (type_rule(C, base, item, p2, sub, sizeof sub)) {
                free(alt.p);
                return -1;
            }
        } else if (convert(C, item, p2, sub, sizeof sub)) {
            free(alt.p);
            return -1;
        }
        if (i)
            mf_jbuf_adds(&alt, " | ");
        mf_jbuf_adds(&alt, sub);
    }
    new_name(C, rule, cap);
    mf_jbuf_adds(&C->out, rule);
    mf_jbuf_adds(&C->out, " ::= ");
    mf_jbuf_add(&C->out, alt.p, alt.n);
    mf_jbuf_adds(&C->out, "\n");
    free(alt.p);
    return 0;
}

static int ref_rule(conv *C, mf_jv ref, const char *path, char *rule, size_t cap) {
    const char *p = ref.u.s.p;
    size_t n = ref.u.s.n, pre;
    if (n > 8 && !memcmp(p, "#/$defs/", 8))
        pre = 8;
    else if (n > 14 && !memcmp(p, "#/definitions/", 14))
        pre = 14;
    else
        return mf_errorf(C->err, "json schema: %s: only local $ref to #/$defs/... or "
                                 "#/definitions/... is supported, not '%.*s'", path, (int)n, p);
    mf_jv done = mf_jv_dict_get(C->defs_done, p, n);
    if (done.t == MF_JV_STR) {
        snprintf(rule, cap, "%s", done.u.s.p);
        return 0;
    }
    mf_jv defs = mf_jv_dict_get(C->root, pre == 8 ? "$defs" : "definitions", pre == 8 ? 5 : 11);
    mf_jv target = mf_jv_dict_get(defs, p + pre, n - pre);
    if (target.t != MF_JV_DICT)
        return mf_errorf(C->err, "json schema: %s: $ref '%.*s' names no definition", path, (int)n, p);
    /* Name the rule before converting, so a recursive schema refers to it. */
    char name[32];
    new_name(C, name, sizeof name);
    mf_jv_dict_set(C->a, C->defs_done, mf_jv_str(C->a, p, n), mf_jv_cstr(C->a, name));
    char body[32];
    if (convert(C, target, p, body, sizeof body))
        return -1;
    mf_jbuf_adds(&C->out, name);
    mf_jbuf_adds(&C->out, " ::= ");
    mf_jbuf_adds(&C->out, body);
    mf_jbuf_adds(&C->out, "\n");
    snprintf(rule, cap, "%s", name);
    return 0;
}

static int convert(conv *C, mf_jv s, const char *path, char *rule, size_t cap) {
    if (++C->depth > 64) {
        C->depth--;
        return mf_errorf(C->err, "json schema: %s: nested deeper than 64", path);
    }
    int rc = -1;
    if (s.t == MF_JV_BOOL) {
        if (s.u.b) {
            snprintf(rule, cap, "json-value");
            rc = 0;
        } else {
            rc = mf_errorf(C->err, "json schema: %s: the schema 'false' matches nothing", path);
        }
        goto out;
    }
    if (s.t != MF_JV_DICT) {
        rc = mf_errorf(C->err, "json schema: %s: a schema must be an object", path);
        goto out;
    }
    static const char *const known[] = {"type", "properties", "required", "additionalProperties",
                                        "enum", "const", "items", "minItems", "maxItems", "minLength",
                                        "maxLength", "anyOf", "oneOf", "allOf", "$ref", "$defs",
                                        "definitions", "title", "description", "$schema", "$id",
                                        "default", "examples", "$comment", NULL};
    for (size_t i = 0; i < s.u.d->n; i++) {
        bool ok = false;
        for (int k = 0; known[k] && !ok; k++)
            ok = key_is(s.u.d->k[i], known[k]);
        if (!ok) {
            mf_jv k = s.u.d->k[i];
            rc = mf_errorf(C->err, "json schema: %s: '%.*s' is not supported", path,
                           k.t == MF_JV_STR ? (int)k.u.s.n : 1, k.t == MF_JV_STR ? k.u.s.p : "?");
            goto out;
        }
    }
    mf_jv v;
    if ((v = mf_jv_dict_get(s, "$ref", 4)).t != MF_JV_UNDEF) {
        rc = v.t == MF_JV_STR ? ref_rule(C, v, path, rule, cap)
                              : mf_errorf(C->err, "json schema: %s: '$ref' must be a string", path);
    } else if ((v = mf_jv_dict_get(s, "const", 5)).t != MF_JV_UNDEF) {
        rc = literal_rule(C, &v, 1, rule, cap);
    } else if ((v = mf_jv_dict_get(s, "enum", 4)).t != MF_JV_UNDEF) {
        rc = v.t == MF_JV_LIST && v.u.l->n ? literal_rule(C, v.u.l->v, v.u.l->n, rule, cap)
                                           : mf_errorf(C->err, "json schema: %s: 'enum' must be a non-empty array", path);
    } else if ((v = mf_jv_dict_get(s, "anyOf", 5)).t != MF_JV_UNDEF) {
        rc = alternatives(C, v, path, "anyOf", rule, cap, mf_jv_undef());
    } else if ((v = mf_jv_dict_get(s, "oneOf", 5)).t != MF_JV_UNDEF) {
        rc = alternatives(C, v, path, "oneOf", rule, cap, mf_jv_undef());
    } else if ((v = mf_jv_dict_get(s, "allOf", 5)).t != MF_JV_UNDEF) {
        if (v.t != MF_JV_LIST || v.u.l->n != 1)
            rc = mf_errorf(C->err, "json schema: %s: 'allOf' is supported with one schema only", path);
        else
            rc = convert(C, v.u.l->v[0], path, rule, cap);
    } else if ((v = mf_jv_dict_get(s, "type", 4)).t != MF_JV_UNDEF) {
        rc = v.t == MF_JV_LIST ? alternatives(C, v, path, "type", rule, cap, s)
                               : type_rule(C, s, v, path, rule, cap);
    } else if (mf_jv_dict_get(s, "properties", 10).t != MF_JV_UNDEF) {
        rc = object_rule(C, s, path, rule, cap);
    } else if (mf_jv_dict_get(s, "items", 5).t != MF_JV_UNDEF) {
        rc = array_rule(C, s, path, rule, cap);
    } else {
        snprintf(rule, cap, "json-value");
        rc = 0;
    }
out:
    C->depth--;
    return rc;
}

char *mf_json_schema_to_gbnf(const char *schema, size_t len, mf_error *err) {
    /* JSON text is UTF-8; a string that is not could not become a grammar
     * literal (the GBNF reader refuses such bytes) */
    const size_t ok = mf_utf8_valid_len(schema, len);
    if (ok != len) {
        mf_errorf(err, "json schema: byte %zu is not valid UTF-8", ok);
        return NULL;
    }
    conv C = {.a = mf_arena_new(), .err = err};
    mf_jv s;
    if (mf_jv_parse_json(C.a, schema, len, &s, err)) {
        mf_error_prefix(err, "json schema");
        mf_arena_free(C.a);
        return NULL;
    }
    C.root = s;
    C.defs_done = mf_jv_dict(C.a);
    mf_jbuf_add(&C.out, "", 0);
    char top[32];
    if (convert(&C, s, "#", top, sizeof top)) {
        free(C.out.p);
        mf_arena_free(C.a);
        return NULL;
    }
    mf_jbuf b = {0};
    mf_jbuf_adds(&b, "root ::= ");
    mf_jbuf_adds(&b, top);
    mf_jbuf_adds(&b, "\n" JSON_COMMON);
    mf_jbuf_add(&b, C.out.p, C.out.n);
    free(C.out.p);
    mf_arena_free(C.a);
    return b.p;
}
