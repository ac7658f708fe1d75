/* test_grammar_core.c - GBNF parsing (valid grammars and clear errors for
 * invalid ones), the byte matcher, and JSON Schema -> grammar. */
#include "grammar/grammar.h"
#include "mf_test.h"

static mf_grammar *compile(const char *text) {
    mf_grammar *g = NULL;
    mf_error err = {{0}};
    if (mf_grammar_parse(text, strlen(text), "root", &g, &err))
        fprintf(stderr, "  compile failed: %s\n", err.msg);
    return g;
}

/* Does the grammar accept exactly this text (all of it, and complete)? */
static int accepts(const mf_grammar *g, const char *text) {
    mf_gstate st;
    mf_error err;
    if (mf_gstate_init(g, &st, &err))
        return -1;
    bool ok = mf_gstate_advance(g, &st, text, strlen(text)) && mf_gstate_done(&st);
    mf_gstate_free(&st);
    return ok;
}

/* Accepted as a prefix (not necessarily complete)? */
static int prefix_ok(const mf_grammar *g, const char *text) {
    mf_gstate st;
    mf_error err;
    if (mf_gstate_init(g, &st, &err))
        return -1;
    bool ok = mf_gstate_advance(g, &st, text, strlen(text));
    mf_gstate_free(&st);
    return ok;
}

MF_TEST(parse_errors_name_the_problem) {
    static const struct {
        const char *text, *want;
    } cases[] = {
        {"root ::= [abc", "1:10: expected ']' to close the character class"},
        {"root ::= \"abc", "unterminated string literal"},
        {"root ::= foo", "1:10: undefined rule 'foo'"},
        {"start ::= \"x\"", "no rule 'root'"},
        {"root ::= (\"a\" | \"b\"", "expected ')' to close the group"},
        {"root ::= \"a\"\nroot ::= \"b\"", "2:1: rule 'root' defined twice"},
        {"root ::= \"a\"{3,1}", "{m,n} with n < m"},
        {"root ::= * \"a\"", "a repetition operator with nothing before it"},
        {"root ::= root \"a\" | \"b\"", "rule 'root' is left-recursive"},
        {"root ::= x\nx ::= y? x \"a\"\ny ::= \"b\"", "rule 'x' is left-recursive"},
        {"root \"a\"", "expected '::=' after the rule name"},
        {"root ::= [z-a]", "character range with its end before its start"},
        {"root ::= \"\\q\"", "unknown escape '\\q'"},
        {"root ::= []", "empty character class"},
        {"root ::= \"a\" @", "unexpected character '@'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        mf_grammar *g = NULL;
        mf_error err = {{0}};
        int rc = mf_grammar_parse(cases[i].text, strlen(cases[i].text), "root", &g, &err);
        CHECK_MSG(rc == -1 && !g, "case %zu parsed", i);
        CHECK_STR_CONTAINS(err.msg, cases[i].want);
        CHECK_STR_CONTAINS(err.msg, "grammar: ");
        mf_grammar_free(g);
    }
}

MF_TEST(literals_classes_repetition) {
    mf_grammar *g = compile("root ::= \"ab\" [0-9]+ (\"x\" | \"yz\")* [^a-c]? \"!\"{2,3}\n");
    CHECK(g);
    if (!g)
        return;
    CHECK_EQ_INT(accepts(g, "ab1!!"), 1);
    CHECK_EQ_INT(accepts(g, "ab123xyzxd!!!"), 1);
    CHECK_EQ_INT(accepts(g, "ab!!"), 0);       /* + needs one digit */
    CHECK_EQ_INT(accepts(g, "ab1b!!"), 0);     /* b is excluded by [^a-c] */
    CHECK_EQ_INT(accepts(g, "ab1!!!!!"), 0);   /* [^a-c] takes one !, then at most 3 */
    CHECK_EQ_INT(accepts(g, "ab1!"), 0);       /* at least 2 */
    CHECK_EQ_INT(prefix_ok(g, "ab1!"), 1);     /* ... but a valid prefix */
    CHECK_EQ_INT(prefix_ok(g, "ac"), 0);
    mf_grammar_free(g);

    /* comments, newlines inside groups, a continued alternative, escapes */
    g = compile("# greeting\nroot ::= greet (\n  \" \" name\n)?  # trailing\n"
                "greet ::= \"hi\"\n  | \"hello\"\nname ::= [a-zA-Z\\x5f]{1,4} \"\\n\"\n");
    CHECK(g);
    if (g) {
        CHECK_EQ_INT(accepts(g, "hi"), 1);
        CHECK_EQ_INT(accepts(g, "hello Bob_\n"), 1);
        CHECK_EQ_INT(accepts(g, "hello Bobby\n"), 0);
        CHECK_EQ_INT(accepts(g, "hey"), 0);
        CHECK(mf_grammar_n_rules(g) >= 3);
    }
    mf_grammar_free(g);
}

MF_TEST(utf8_code_points) {
    mf_grammar *g = compile("root ::= [α-ω]+ \"✓\" [^\\x00-\\x7F]\n");
    CHECK(g);
    if (!g)
        return;
    CHECK_EQ_INT(accepts(g, "αβγ✓é"), 1);
    CHECK_EQ_INT(accepts(g, "abc✓é"), 0);
    CHECK_EQ_INT(accepts(g, "αβγ✓e"), 0);
    /* a character split across two feeds (byte tokens) */
    mf_gstate st;
    mf_error err;
    CHECK(mf_gstate_init(g, &st, &err) == 0);
    CHECK(mf_gstate_advance(g, &st, "\xce", 1));      /* first byte of α: some completion fits */
    CHECK(mf_gstate_advance(g, &st, "\xb1", 1));      /* ... completed */
    CHECK(!mf_gstate_advance(g, &st, "\xff", 1));     /* never valid UTF-8 */
    CHECK(!mf_gstate_advance(g, &st, "a", 1));        /* state unchanged after a failure */
    CHECK(mf_gstate_advance(g, &st, "\xe2\x9c\x93\xc3\xa9", 5));
    CHECK(mf_gstate_done(&st) && mf_gstate_finished(&st));
    mf_gstate_free(&st);
    /* overlong and surrogate encodings are not characters */
    mf_grammar *l = compile("root ::= \"l\" [^a]*\n");
    CHECK(l && mf_gstate_init(l, &st, &err) == 0);
    CHECK(!mf_gstate_advance(l, &st, "\xe0\x81\xac", 3)); /* 'l' written overlong */
    CHECK(!mf_gstate_advance(l, &st, "\xc1\xac", 2));
    CHECK(mf_gstate_advance(l, &st, "l", 1));
    CHECK(!mf_gstate_advance(l, &st, "\xed\xa0\x80", 3)); /* U+D800 */
    CHECK(!mf_gstate_advance(l, &st, "\xe0\x81", 2));      /* no completion is valid */
    CHECK(mf_gstate_advance(l, &st, "\xf0\x9f\x8e\x89", 4));
    mf_gstate_free(&st);
    mf_grammar_free(l);
    /* a lead byte whose characters all lie outside the first class */
    CHECK(mf_gstate_init(g, &st, &err) == 0);
    CHECK(!mf_gstate_advance(g, &st, "\xe2", 1)); /* U+2000.. cannot become [α-ω] */
    mf_gstate_free(&st);
    mf_grammar_free(g);
}

MF_TEST(json_object_grammar) {
    const char *t = mf_grammar_json_object_gbnf();
    mf_grammar *g = compile(t);
    CHECK(g);
    if (!g)
        return;
    CHECK_EQ_INT(accepts(g, "{}"), 1);
    CHECK_EQ_INT(accepts(g, "{\"a\": [1, -2.5e3, true, null, \"x\\u00e9\\n\"], \"b\": {}}"), 1);
    CHECK_EQ_INT(accepts(g, "{\"a\":1,}"), 0);
    CHECK_EQ_INT(accepts(g, "[1]"), 0);         /* the root is an object */
    CHECK_EQ_INT(accepts(g, "{\"a\": 01}"), 0);  /* no leading zeros */
    CHECK_EQ_INT(accepts(g, "{\"a\": \"tab\there\"}"), 0); /* raw control character */
    CHECK_EQ_INT(accepts(g, "{\"a\": 1}   "), 0);   /* nothing after the object */
    mf_grammar_free(g);
}

static mf_grammar *from_schema(const char *schema) {
    mf_error err = {{0}};
    char *gb = mf_json_schema_to_gbnf(schema, strlen(schema), &err);
    if (!gb) {
        fprintf(stderr, "  schema failed: %s\n", err.msg);
        return NULL;
    }
    mf_grammar *g = compile(gb);
    if (!g)
        fprintf(stderr, "  grammar was:\n%s\n", gb);
    free(gb);
    return g;
}

MF_TEST(json_schema_objects) {
    mf_grammar *g = from_schema(
        "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"minLength\":1,"
        "\"maxLength\":5},\"age\":{\"type\":\"integer\"},\"tags\":{\"type\":\"array\",\"items\":"
        "{\"enum\":[\"a\",\"b\",3]},\"minItems\":1,\"maxItems\":2},\"ok\":{\"type\":[\"boolean\","
        "\"null\"]}},\"required\":[\"name\",\"tags\"],\"additionalProperties\":false}");
    CHECK(g);
    if (!g)
        return;
    CHECK_EQ_INT(accepts(g, "{\"name\": \"Bob\", \"tags\": [\"a\"]}"), 1);
    CHECK_EQ_INT(accepts(g, "{\"name\":\"Bob\",\"age\":42,\"tags\":[3, \"b\"],\"ok\":null}"), 1);
    CHECK_EQ_INT(accepts(g, "{\"name\": \"Bob\", \"tags\": [\"a\"], \"ok\": true}"), 1);
    CHECK_EQ_INT(accepts(g, "{\"tags\": [\"a\"]}"), 0);                    /* name required */
    CHECK_EQ_INT(accepts(g, "{\"name\": \"\", \"tags\": [\"a\"]}"), 0);     /* minLength */
    CHECK_EQ_INT(accepts(g, "{\"name\": \"Robert\", \"tags\": [\"a\"]}"), 0); /* maxLength */
    CHECK_EQ_INT(accepts(g, "{\"name\": \"Bob\", \"tags\": []}"), 0);        /* minItems */
    CHECK_EQ_INT(accepts(g, "{\"name\": \"Bob\", \"tags\": [\"a\",\"a\",\"a\"]}"), 0); /* maxItems */
    CHECK_EQ_INT(accepts(g, "{\"name\": \"Bob\", \"tags\": [\"c\"]}"), 0);   /* enum */
    CHECK_EQ_INT(accepts(g, "{\"name\": \"Bob\", \"tags\": [\"a\"], \"x\": 1}"), 0); /* extra key */
    CHECK_EQ_INT(accepts(g, "{\"name\": \"Bob\", \"age\": 1.5, \"tags\": [\"a\"]}"), 0); /* integer */
    mf_grammar_free(g);

    /* $defs / $ref (recursive), anyOf, const */
    g = from_schema("{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"const\":1},"
                    "\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"}}},"
                    "\"required\":[\"v\"]}},\"anyOf\":[{\"$ref\":\"#/$defs/node\"},{\"type\":\"number\"}]}");
    CHECK(g);
    if (g) {
        CHECK_EQ_INT(accepts(g, "{\"v\": 1, \"kids\": [{\"v\": 1}, {\"v\": 1, \"kids\": []}]}"), 1);
        CHECK_EQ_INT(accepts(g, "-3.25"), 1);
        CHECK_EQ_INT(accepts(g, "{\"v\": 2}"), 0);
    }
    mf_grammar_free(g);
}

MF_TEST(json_schema_errors) {
    static const struct {
        const char *schema, *want;
    } cases[] = {
        {"{\"type\":\"string\",\"pattern\":\"^a\"}", "'pattern' is not supported"},
        {"{\"type\":\"strin\"}", "unknown type 'strin'"},
        {"{\"$ref\":\"#/$defs/missing\"}", "names no definition"},
        {"{\"$ref\":\"http://x/y\"}", "only local $ref"},
        {"{\"type\":\"object\",\"properties\":{\"a\":{}},\"required\":[\"b\"]}", "required property 'b'"},
        {"{\"type\":\"array\",\"minItems\":3,\"maxItems\":2}", "maxItems 2 < minItems 3"},
        {"{\"type\":", "json schema: json:"},
        {"{\"properties\":{\"a\":{\"minimum\":3}}}", "#/properties/a: 'minimum' is not supported"},
        /* a string that is not UTF-8 (found by fuzz_grammar: it became a
         * grammar literal the GBNF reader refused) */
        {"{\"enum\":[1,\"\xac\"]}", "byte 12 is not valid UTF-8"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        mf_error err = {{0}};
        char *gb = mf_json_schema_to_gbnf(cases[i].schema, strlen(cases[i].schema), &err);
        CHECK_MSG(!gb, "case %zu converted", i);
        free(gb);
        CHECK_STR_CONTAINS(err.msg, cases[i].want);
    }
}

MF_TEST_MAIN(MF_T(parse_errors_name_the_problem), MF_T(literals_classes_repetition),
             MF_T(utf8_code_points), MF_T(json_object_grammar), MF_T(json_schema_objects),
             MF_T(json_schema_errors))
