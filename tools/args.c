/* args.c - flag parsing helpers (see args.h). */
#include "args.h"
#include "tools.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <string.h>

int mf_arg_int(const char *flag, const char *text, int64_t lo, int64_t hi, int64_t *out,
               mf_error *err) {
    if (!text || !*text)
        return mf_errorf(err, "%s: missing integer value", flag);
    char *end = NULL;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (end == text || *end != '\0')
        return mf_errorf(err, "%s: '%s' is not an integer", flag, text);
    if (errno == ERANGE || v < lo || v > hi)
        return mf_errorf(err, "%s: %s is out of range [%lld, %lld]", flag, text, (long long)lo,
                         (long long)hi);
    *out = v;
    return 0;
}

int mf_arg_i32(const char *flag, const char *text, int32_t lo, int32_t hi, int32_t *out,
               mf_error *err) {
    int64_t v = 0;
    if (mf_arg_int(flag, text, lo, hi, &v, err))
        return -1;
    *out = (int32_t)v;
    return 0;
}

int mf_arg_float(const char *flag, const char *text, double *out, mf_error *err) {
    if (!text || !*text)
        return mf_errorf(err, "%s: missing number", flag);
    char *end = NULL;
    errno = 0;
    double v = strtod(text, &end);
    if (end == text || *end != '\0')
        return mf_errorf(err, "%s: '%s' is not a number", flag, text);
    if (errno == ERANGE || !isfinite(v))
        return mf_errorf(err, "%s: '%s' is out of range", flag, text);
    *out = v;
    return 0;
}

int mf_arg_value(int argc, char **argv, int *i, const char *flag, const char **value,
                 mf_error *err) {
    const char *a = argv[*i];
    size_t n = strlen(flag);
    if (strncmp(a, flag, n) != 0)
        return 0;
    if (a[n] == '=') {
        *value = a + n + 1;
        return 1;
    }
    if (a[n] != '\0')
        return 0;
    if (*i + 1 >= argc) {
        mf_errorf(err, "%s needs a value", flag);
        return -1;
    }
    *i += 1;
    *value = argv[*i];
    return 1;
}

bool mf_arg_is_help(const char *arg) {
    return !strcmp(arg, "--help") || !strcmp(arg, "-h");
}

int mf_arg_fail(const char *cmd, const mf_error *err) {
    fprintf(stderr, "%s: %s\n", cmd, err ? err->msg : "bad arguments");
    return 2;
}

const char *mf_default_model(void) {
    const char *env = getenv("MINFER_MODEL");
    if (env && *env)
        return env;
#ifdef MINFER_SOURCE_DIR
    if (access(MF_DEFAULT_MODEL, F_OK) != 0 &&
        access(MINFER_SOURCE_DIR "/" MF_DEFAULT_MODEL, F_OK) == 0)
        return MINFER_SOURCE_DIR "/" MF_DEFAULT_MODEL;
#endif
    return MF_DEFAULT_MODEL;
}

int mf_parse_flash_attn(const char *cmd, const char *v, bool *off, mf_error *err) {
    (void)cmd;
    if (!strcmp(v, "on") || !strcmp(v, "auto") || !strcmp(v, "1") || !strcmp(v, "true")) {
        *off = false;
        return 0;
    }
    if (!strcmp(v, "off") || !strcmp(v, "0") || !strcmp(v, "false")) {
        *off = true;
        return 0;
    }
    return mf_errorf(err, "-fa: '%s' is not on, off or auto", v);
}
