/* mf_test.h - the unit-test harness: CHECK macros and a closing summary.
 *
 * Each test file defines its cases with MF_TEST(name) and lists them in
 * MF_TEST_MAIN(...). A failed CHECK prints file:line and the values, marks the
 * case failed and continues; the program exits non-zero if any case failed and
 * ends with the line "N passed, N failed". */
#ifndef MF_TEST_H
#define MF_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int mf_test_case_failed;
static int mf_test_checks;

#define CHECK(cond)                                                                   \
    do {                                                                              \
        mf_test_checks++;                                                             \
        if (!(cond)) {                                                                \
            fprintf(stderr, "  %s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
            mf_test_case_failed = 1;                                                  \
        }                                                                             \
    } while (0)

#define CHECK_MSG(cond, ...)                                                          \
    do {                                                                              \
        mf_test_checks++;                                                             \
        if (!(cond)) {                                                                \
            fprintf(stderr, "  %s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                             \
            fputc('\n', stderr);                                                      \
            mf_test_case_failed = 1;                                                  \
        }                                                                             \
    } while (0)

#define CHECK_EQ_INT(a, b)                                                            \
    do {                                                                              \
        long long _a = (long long)(a), _b = (long long)(b);                           \
        CHECK_MSG(_a == _b, "%lld != %lld", _a, _b);                                  \
    } while (0)

#define CHECK_NEAR(a, b, tol)                                                         \
    do {                                                                              \
        double _a = (double)(a), _b = (double)(b), _t = (double)(tol);                \
        CHECK_MSG(fabs(_a - _b) <= _t, "%.9g vs %.9g (tol %.3g)", _a, _b, _t);        \
    } while (0)

#define CHECK_STR_CONTAINS(hay, needle)                                               \
    do {                                                                              \
        const char *_h = (hay), *_n = (needle);                                       \
        CHECK_MSG(_h && strstr(_h, _n), "\"%s\" does not contain \"%s\"",             \
                  _h ? _h : "(null)", _n);                                            \
    } while (0)

#define MF_TEST(name) static void name(void)

typedef struct {
    const char *name;
    void (*fn)(void);
} mf_test_entry;

#define MF_T(fn) {#fn, fn}

static inline int mf_test_run(const mf_test_entry *t, int n, int argc, char **argv) {
    int passed = 0, failed = 0;
    for (int i = 0; i < n; i++) {
        if (argc > 1 && !strstr(t[i].name, argv[1]))
            continue;
        mf_test_case_failed = 0;
        t[i].fn();
        if (mf_test_case_failed) {
            printf("FAIL %s\n", t[i].name);
            failed++;
        } else {
            printf("ok   %s\n", t[i].name);
            passed++;
        }
        fflush(stdout);
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}

#define MF_TEST_MAIN(...)                                                             \
    int main(int argc, char **argv) {                                                 \
        static const mf_test_entry tests_[] = {__VA_ARGS__};                          \
        return mf_test_run(tests_, (int)(sizeof tests_ / sizeof tests_[0]), argc, argv); \
    }

#endif
