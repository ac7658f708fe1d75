/* test_json_parse.c - the server's JSON reader/writer (tools/json.c, included
 * as a translation unit): exact values of hand-written documents, random trees
 * written then read back unchanged, a table of malformed inputs each refused
 * with its reason, invalid UTF-8 written as U+FFFD, and random corruptions of
 * valid documents that must parse or fail cleanly (never crash). */
#include "../../tools/json.c"

#include "mf_test.h"

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

static mf_json *parse_str(const char *s, mf_error *e) {
    return mf_json_parse(s, strlen(s), e);
}

MF_TEST(test_values) {
    mf_error e = {{0}};
    const char *doc = " {\"a\": [1, -0.5, 2e3, true, false, null, \"x\\\"y\\\\z\\n\\u00e9\\ud83d\\ude00\"],"
                      " \"b\": {\"c\": {}}, \"d\": [], \"a\": 12} ";
    mf_json *v = parse_str(doc, &e);
    CHECK_MSG(v != NULL, "%s", e.msg);
    if (!v)
        return;
    CHECK(v->type == MF_JSON_OBJECT && v->n == 4);
    const mf_json *a = mf_json_get(v, "a"); /* the last "a" wins */
    CHECK(a && a->type == MF_JSON_NUMBER && a->number == 12 && a->integral);
    const mf_json *arr = &v->kids[0];
    CHECK(arr->type == MF_JSON_ARRAY && arr->n == 7);
    if (arr->n == 7) {
        CHECK(arr->kids[0].number == 1 && arr->kids[0].integral);
        CHECK(arr->kids[1].number == -0.5 && !arr->kids[1].integral);
        CHECK(arr->kids[2].number == 2000 && !arr->kids[2].integral);
        CHECK(arr->kids[3].type == MF_JSON_BOOL && arr->kids[3].boolean);
        CHECK(arr->kids[4].type == MF_JSON_BOOL && !arr->kids[4].boolean);
        CHECK(arr->kids[5].type == MF_JSON_NULL);
        const char want[] = "x\"y\\z\n\xc3\xa9\xf0\x9f\x98\x80";
        CHECK(arr->kids[6].len == sizeof want - 1 && !memcmp(arr->kids[6].str, want, sizeof want));
    }
    const mf_json *b = mf_json_get(v, "b");
    CHECK(b && b->type == MF_JSON_OBJECT && mf_json_get(b, "c") && !mf_json_get(b, "x"));
    CHECK(mf_json_get(arr, "a") == NULL); /* not an object */
    mf_json_free(v);

    /* "\u0000" keeps its NUL: len counts it. */
    v = parse_str("\"a\\u0000b\"", &e);
    CHECK(v && v->len == 3 && v->str[1] == 0 && v->str[2] == 'b');
    mf_json_free(v);
}

MF_TEST(test_malformed) {
    static const struct {
        const char *text;
        const char *why;
    } cases[] = {
        {"", "expected a value"},
        {"   ", "expected a value"},
        {"{", "expected a string key"},
        {"{\"a\"", "expected ':'"},
        {"{\"a\" 1}", "expected ':'"},
        {"{\"a\":1,}", "expected a string key"},
        {"[1,]", "expected a value"},
        {"[1 2]", "expected ','"},
        {"{'a':1}", "expected a string key"},
        {"01", "leading zero"},
        {"1.", "digit after '.'"},
        {"1e", "exponent"},
        {"-", "expected a digit"},
        {"+1", "expected a value"},
        {"tru", "expected a value"},
        {"NaN", "expected a value"},
        {"1e999", "out of range"},
        {"[1] 2", "unexpected text"},
        {"\"abc", "unterminated string"},
        {"\"\\x\"", "unknown escape"},
        {"\"\\u12g4\"", "bad hex digit"},
        {"\"\\u12", "truncated"},
        {"\"a\nb\"", "control character"},
        {"\"\\ud800\"", "high surrogate"},
        {"\"\\ud800\\u0041\"", "low surrogate"},
        {"\"\\udc00\"", "unpaired low surrogate"},
        {"\"\xff\"", "invalid UTF-8"},
        {"\"\xc0\xaf\"", "invalid UTF-8"},     /* overlong '/' */
        {"\"\xed\xa0\x80\"", "invalid UTF-8"}, /* an encoded surrogate */
        {"\"\xf4\x90\x80\x80\"", "invalid UTF-8"}, /* above U+10FFFF */
        {"\"\xe2\x82\"", "invalid UTF-8"},     /* truncated sequence */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        mf_error e = {{0}};
        mf_json *v = parse_str(cases[i].text, &e);
        CHECK_MSG(v == NULL, "case %zu parsed", i);
        mf_json_free(v);
        CHECK_STR_CONTAINS(e.msg, cases[i].why);
        CHECK_MSG(!strncmp(e.msg, "byte ", 5), "case %zu: '%s' names no byte", i, e.msg);
    }
    /* Depth: 64 levels parse, 65 do not. */
    char deep[200];
    for (int d = 64; d <= 65; d++) {
        memset(deep, '[', (size_t)d);
        memset(deep + d, ']', (size_t)d);
        mf_error e = {{0}};
        mf_json *v = mf_json_parse(deep, (size_t)(2 * d), &e);
        CHECK_MSG((v != NULL) == (d == 64), "depth %d: %s", d, e.msg);
        if (!v)
            CHECK_STR_CONTAINS(e.msg, "nesting");
        mf_json_free(v);
    }
}

/* ---- random round trips ------------------------------------------------------------- */

static void rand_string(mf_sbuf *s) {
    static const unsigned ranges[][2] = {{0x00, 0x7F}, {0x80, 0x7FF}, {0x800, 0xFFFF},
                                         {0x10000, 0x10FFFF}, {'"', '"'}, {'\\', '\\'}};
    int n = (int)(rnd() % 12);
    mf_sbuf_add(s, "", 0);
    for (int i = 0; i < n; i++) {
        const unsigned *r = ranges[rnd() % 6];
        unsigned cp = r[0] + (unsigned)(rnd() % (r[1] - r[0] + 1));
        if (cp >= 0xD800 && cp <= 0xDFFF)
            cp = 0xFFFD;
        put_utf8(s, cp);
    }
}

/* Writes a random value to out and records its strings and numbers, in
 * document order, in ref (the parse is compared against it). */
typedef struct ref_item {
    mf_json_type type;
    double number;
    mf_sbuf str;
    size_t n;
} ref_item;

static ref_item refs[4096];
static size_t n_refs;

static void rand_value(mf_sbuf *out, int depth) {
    int kind = (int)(rnd() % (depth >= 5 ? 4 : 6));
    ref_item *r = &refs[n_refs++];
    memset(r, 0, sizeof *r);
    switch (kind) {
    case 0:
        r->type = MF_JSON_NULL;
        mf_sbuf_puts(out, "null");
        break;
    case 1:
        r->type = MF_JSON_BOOL;
        r->number = (double)(rnd() & 1);
        mf_sbuf_puts(out, r->number ? "true" : "false");
        break;
    case 2:
        r->type = MF_JSON_NUMBER;
        if (rnd() & 1)
            r->number = (double)(int64_t)(rnd() % 2000001) - 1000000;
        else
            r->number = ((double)(rnd() % 1000000) - 500000) * pow(10, (double)(rnd() % 40) - 20);
        mf_sbuf_printf(out, "%.17g", r->number);
        break;
    case 3:
        r->type = MF_JSON_STRING;
        rand_string(&r->str);
        mf_json_add_string(out, r->str.p, r->str.n);
        break;
    default: {
        bool obj = kind == 5;
        r->type = obj ? MF_JSON_OBJECT : MF_JSON_ARRAY;
        r->n = rnd() % 5;
        mf_sbuf_puts(out, obj ? "{ " : "[\n");
        for (size_t i = 0; i < r->n && n_refs < 4000; i++) {
            if (i)
                mf_sbuf_puts(out, " ,\t");
            if (obj) {
                mf_sbuf k = {0};
                rand_string(&k);
                mf_json_add_string(out, k.p, k.n);
                mf_sbuf_puts(out, ":");
                mf_sbuf_free(&k);
            }
            rand_value(out, depth + 1);
        }
        mf_sbuf_puts(out, obj ? "}" : "\r\n]");
    }
    }
}

static size_t ref_pos;
static void compare(const mf_json *v) {
    ref_item *r = &refs[ref_pos++];
    CHECK_MSG(v->type == r->type, "item %zu: type %d vs %d", ref_pos - 1, v->type, r->type);
    if (v->type != r->type)
        return;
    if (v->type == MF_JSON_BOOL)
        CHECK(v->boolean == (r->number != 0));
    if (v->type == MF_JSON_NUMBER)
        CHECK_MSG(v->number == r->number, "%.17g vs %.17g", v->number, r->number);
    if (v->type == MF_JSON_STRING)
        CHECK(v->len == r->str.n && !memcmp(v->str, r->str.p, v->len));
    for (size_t i = 0; i < v->n; i++)
        compare(&v->kids[i]);
}

MF_TEST(test_random_roundtrip) {
    for (int iter = 0; iter < 300; iter++) {
        mf_sbuf doc = {0};
        n_refs = 0;
        rand_value(&doc, 0);
        mf_error e = {{0}};
        mf_json *v = mf_json_parse(doc.p, doc.n, &e);
        CHECK_MSG(v != NULL, "iter %d: %s", iter, e.msg);
        if (v) {
            ref_pos = 0;
            compare(v);
            CHECK_EQ_INT(ref_pos, n_refs);
        }
        mf_json_free(v);

        /* Corruptions: a changed byte or a cut must parse or fail with a
         * positioned message, never crash or read out of bounds. */
        for (int k = 0; k < 8 && doc.n; k++) {
            char *bad = mf_malloc(doc.n);
            memcpy(bad, doc.p, doc.n);
            size_t len = doc.n;
            if (k & 1)
                len = rnd() % doc.n;
            else
                bad[rnd() % doc.n] = (char)rnd();
            mf_error e2 = {{0}};
            mf_json *w = mf_json_parse(bad, len, &e2);
            if (!w)
                CHECK_MSG(!strncmp(e2.msg, "byte ", 5), "'%s'", e2.msg);
            mf_json_free(w);
            free(bad);
        }
        for (size_t i = 0; i < n_refs; i++)
            mf_sbuf_free(&refs[i].str);
        mf_sbuf_free(&doc);
    }
}

MF_TEST(test_writer_escapes) {
    mf_sbuf b = {0};
    const char in[] = "a\"b\\c\n\t\x01\x1f\x7f caf\xc3\xa9 \xff\xc3 \xe2\x82";
    mf_json_add_string(&b, in, sizeof in - 1);
    const char want[] = "\"a\\\"b\\\\c\\n\\t\\u0001\\u001f\x7f caf\xc3\xa9 \xef\xbf\xbd\xef\xbf\xbd "
                        "\xef\xbf\xbd\xef\xbf\xbd\"";
    CHECK_MSG(b.n == sizeof want - 1 && !memcmp(b.p, want, b.n), "got %s", b.p);
    /* What the writer produces, the reader reads. */
    mf_error e = {{0}};
    mf_json *v = mf_json_parse(b.p, b.n, &e);
    CHECK_MSG(v && v->type == MF_JSON_STRING, "%s", e.msg);
    CHECK(v && mf_utf8_valid_prefix(v->str, v->len) == v->len);
    mf_json_free(v);
    mf_sbuf_free(&b);
    CHECK_EQ_INT(mf_utf8_valid_prefix("ab\xc3\xa9\xe2\x82", 6), 4);
}

MF_TEST_MAIN(MF_T(test_values), MF_T(test_malformed), MF_T(test_random_roundtrip),
             MF_T(test_writer_escapes))
