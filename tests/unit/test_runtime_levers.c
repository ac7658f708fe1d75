/* test_runtime_levers.c - the lever table against docs/ENV.md (every row
 * documented, every documented library lever a row), the registry's lines
 * (order, names, levers, op tables) and the layering rules the seam keeps:
 * no per-backend #ifdef in runtime/model/tools, no backend contract in the
 * model module, no environment read in src/ outside the lever table's file. */
#include <dirent.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/registry.h"
#include "mf_test.h"
#include "runtime/levers.h"

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    size_t got = fread(s, 1, (size_t)n, f);
    s[got] = 0;
    fclose(f);
    return s;
}

static char *src_path(const char *rel) {
    static char buf[4096];
    const char *src = getenv("MINFER_SRC");
    snprintf(buf, sizeof buf, "%s/%s", src && *src ? src : ".", rel);
    return buf;
}

/* The MINFER_* names in the first cell of each table row of the section
 * that starts at the heading `head` (up to the next "## "). */
static int doc_levers(const char *doc, const char *head, char names[][64], int cap) {
    const char *p = strstr(doc, head);
    if (!p)
        return -1;
    const char *end = strstr(p + strlen(head), "\n## ");
    int n = 0;
    for (const char *l = strchr(p, '\n'); l && (!end || l < end); l = strchr(l + 1, '\n')) {
        if (strncmp(l, "\n| `MINFER_", 11))
            continue;
        const char *cell_end = strchr(l + 2, '|');
        for (const char *q = l + 2; q && q < cell_end; q = strchr(q + 1, '`')) {
            if (strncmp(q, "`MINFER_", 8))
                continue;
            const char *e = strchr(q + 1, '`');
            if (n < cap && e && e - q - 1 < 64) {
                memcpy(names[n], q + 1, (size_t)(e - q - 1));
                names[n][e - q - 1] = 0;
                n++;
            }
            q = e;
        }
    }
    return n;
}

MF_TEST(lever_table_matches_env_md) {
    char *doc = slurp(src_path("docs/ENV.md"));
    CHECK_MSG(doc != NULL, "cannot read %s", src_path("docs/ENV.md"));
    if (!doc)
        return;
    static char names[256][64];
    int n = doc_levers(doc, "## Library levers", names, 256);
    CHECK_MSG(n > 0, "no 'Library levers' table in docs/ENV.md (%d)", n);
    for (int i = 0; i < n; i++)
        CHECK_MSG(mf_lever_find(names[i]) != NULL, "ENV.md documents %s, the lever table has no row",
                  names[i]);
    for (int i = 0; i < mf_lever_count(); i++) {
        const mf_lever *l = mf_lever_at(i);
        int found = 0;
        for (int k = 0; k < n; k++)
            found += !strcmp(names[k], l->name);
        CHECK_MSG(found == 1, "lever %s is documented %d times in ENV.md's library table", l->name, found);
        CHECK_MSG(l->meaning && *l->meaning && l->def, "lever %s has no meaning or default", l->name);
        CHECK_MSG(mf_lever_find(l->name) == l, "lever %s is in the table twice", l->name);
        if (l->type == MF_LEVER_INT) {
            char *e;
            strtol(l->def, &e, 10);
            CHECK_MSG(*l->def && !*e, "integer lever %s has default '%s'", l->name, l->def);
        }
    }
    free(doc);
}

MF_TEST(lever_values_and_defaults) {
    unsetenv("MINFER_GRAPH_TRACE");
    CHECK_EQ_INT(mf_lever_int("MINFER_GRAPH_TRACE"), 0);
    setenv("MINFER_GRAPH_TRACE", "2", 1);
    CHECK_EQ_INT(mf_lever_int("MINFER_GRAPH_TRACE"), 2);
    unsetenv("MINFER_GRAPH_TRACE");
    unsetenv("MINFER_GPU_TIMEOUT_MS");
    mf_backend_options o;
    mf_levers_backend_options(&o);
    CHECK(o.gpu_timeout_ms == 10000 && o.graphs && o.fusion && !o.trace && o.tune == NULL);
    setenv("MINFER_NO_CUDA_GRAPH", "1", 1);
    setenv("MINFER_GPU_TIMEOUT_MS", "250", 1);
    mf_levers_backend_options(&o);
    CHECK(!o.graphs && o.gpu_timeout_ms == 250);
    unsetenv("MINFER_NO_CUDA_GRAPH");
    unsetenv("MINFER_GPU_TIMEOUT_MS");
    setenv("MINFER_CUDA_TUNE", "gemv=v3", 1);
    CHECK(mf_lever_str("MINFER_CUDA_TUNE") && !strcmp(mf_lever_str("MINFER_CUDA_TUNE"), "gemv=v3"));
    unsetenv("MINFER_CUDA_TUNE");
    CHECK(mf_lever_str("MINFER_CUDA_TUNE") == NULL);
    /* the Metal backend's levers reach it as options.metal */
    mf_levers_backend_options(&o);
    CHECK(!o.metal.disable && o.metal.gemm == 2 && o.metal.attn_chunk == 0 && o.metal.fuse_qkv &&
          o.metal.fuse_ffn && o.metal.fuse_qkv_norm && !o.metal.metallib && !o.cpu_isa);
    setenv("MINFER_DISABLE_MPS", "yes", 1);
    setenv("MINFER_METAL_GEMM", "0", 1);
    setenv("MINFER_ATTN_CHUNK", "2", 1);
    setenv("MINFER_METAL_NO_FUSED_FFN", "1", 1);
    setenv("MINFER_METALLIB_FILE", "/x.metallib", 1);
    setenv("MINFER_CPU_ISA", "scalar", 1);
    mf_levers_backend_options(&o);
    CHECK(o.metal.disable && o.metal.gemm == 0 && o.metal.attn_chunk == 2 && o.metal.fuse_qkv &&
          !o.metal.fuse_ffn && o.metal.metallib && !strcmp(o.metal.metallib, "/x.metallib"));
    CHECK(o.cpu_isa && !strcmp(o.cpu_isa, "scalar"));
    const char *set[] = {"MINFER_DISABLE_MPS", "MINFER_METAL_GEMM", "MINFER_ATTN_CHUNK", "MINFER_METAL_NO_FUSED_FFN",
                         "MINFER_METALLIB_FILE", "MINFER_CPU_ISA"};
    for (size_t i = 0; i < sizeof set / sizeof set[0]; i++)
        unsetenv(set[i]);
    /* MINFER_LOG as a level; an unknown value is warn */
    setenv("MINFER_LOG", "ERROR", 1);
    CHECK_EQ_INT(mf_levers_log_level(), MF_LOG_ERROR);
    setenv("MINFER_LOG", "loud", 1);
    CHECK_EQ_INT(mf_levers_log_level(), MF_LOG_WARN);
    setenv("MINFER_LOG", "debug", 1);
    CHECK_EQ_INT(mf_levers_log_level(), MF_LOG_DEBUG);
    unsetenv("MINFER_LOG");
    CHECK_EQ_INT(mf_levers_log_level(), MF_LOG_WARN);
}

MF_TEST(registry_lines) {
    const int n = mf_registry_count();
    CHECK(n >= 2);
    int homes = 0;
    mf_weights *w = mf_weights_new();
    for (int i = 0; i < n; i++) {
        const mf_backend_entry *e = mf_registry_at(i);
        CHECK_MSG(mf_registry_find(e->name, strlen(e->name)) == e, "%s: found elsewhere", e->name);
        if (i > 0)
            CHECK_MSG(mf_registry_at(i - 1)->priority >= e->priority, "%s out of priority order", e->name);
        CHECK_MSG(strstr(mf_registry_names(), e->name) != NULL, "%s missing from the names", e->name);
        const char *lv[3] = {e->disable_lever, e->device_lever, e->tune_lever};
        for (int k = 0; k < 3; k++)
            CHECK_MSG(!lv[k] || mf_lever_find(lv[k]), "%s names lever %s, not in the lever table", e->name,
                      lv[k]);
        homes += e->runs_every_op;
        if (e->is_gpu)
            continue; /* needs a device */
        mf_backend_options o;
        mf_backend_options_default(&o);
        mf_backend *b = NULL;
        mf_error err = {{0}};
        CHECK_MSG(e->create(w, &o, &b, &err) == 0, "%s: %s", e->name, err.msg);
        if (!b)
            continue;
        CHECK_MSG(b->kind == e->kind && b->is_gpu == e->is_gpu && !strcmp(b->ops->name(b), e->name),
                  "%s: the backend made says %s", e->name, b->ops->name(b));
        /* runs_every_op is what the op table says */
        int ops = 0;
        for (int op = 0; op < MF_OP_COUNT; op++)
            ops += b->ops->op_table[op].exec != NULL;
        CHECK_MSG(!e->runs_every_op || ops == MF_OP_COUNT, "%s claims every op, its table has %d of %d",
                  e->name, ops, MF_OP_COUNT);
        CHECK_MSG(e->runs_every_op || ops < MF_OP_COUNT, "%s runs every op but does not say so", e->name);
        mf_backend_free(b);
    }
    mf_weights_free(w);
    CHECK_MSG(homes >= 1, "no registered backend runs every op");
    CHECK(mf_registry_find("tpu", 3) == NULL);
}

/* Whether any .c/.h file under dir contains needle; names the first. */
static int grep_dir(const char *dir, const char *needle, char *hit, size_t cap) {
    DIR *d = opendir(src_path(dir));
    if (!d)
        return -1;
    int found = 0;
    struct dirent *de;
    while (!found && (de = readdir(d))) {
        size_t l = strlen(de->d_name);
        if (l < 3 || (strcmp(de->d_name + l - 2, ".c") && strcmp(de->d_name + l - 2, ".h")))
            continue;
        char rel[1024];
        snprintf(rel, sizeof rel, "%s/%s", dir, de->d_name);
        char *s = slurp(src_path(rel));
        if (s && strstr(s, needle)) {
            snprintf(hit, cap, "%s", rel);
            found = 1;
        }
        free(s);
    }
    closedir(d);
    return found;
}

MF_TEST(layers_name_no_backend) {
    char hit[1024];
    const char *dirs[] = {"src/runtime", "src/model", "tools", "src/engine", "src/ir"};
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
        CHECK_MSG(grep_dir(dirs[i], "MINFER_HAVE_", hit, sizeof hit) == 0, "%s has a per-backend #ifdef",
                  hit);
        CHECK_MSG(grep_dir(dirs[i], "backend/cuda", hit, sizeof hit) == 0, "%s includes the CUDA backend", hit);
        CHECK_MSG(grep_dir(dirs[i], "backend/cpu/", hit, sizeof hit) == 0, "%s includes the CPU backend", hit);
    }
    CHECK_MSG(grep_dir("src/model", "#include \"backend/", hit, sizeof hit) == 0, "%s includes the contract", hit);
    CHECK_MSG(grep_dir("src/ir", "#include \"engine/", hit, sizeof hit) == 0, "%s (IR) includes the engine", hit);
    CHECK_MSG(grep_dir("src/ir", "#include \"backend/", hit, sizeof hit) == 0, "%s (IR) includes a backend header", hit);
}

/* The source files under dir (recursive) that contain needle, except the
 * one named `allowed`; the first few go to hits. Returns how many, -1 when
 * dir cannot be opened. */
static int grep_tree(const char *dir, const char *needle, const char *allowed, char *hits, size_t cap) {
    DIR *d = opendir(src_path(dir));
    if (!d)
        return -1;
    int found = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.')
            continue;
        char rel[1024];
        snprintf(rel, sizeof rel, "%s/%s", dir, de->d_name);
        struct stat st;
        if (stat(src_path(rel), &st))
            continue;
        if (S_ISDIR(st.st_mode)) {
            int n = grep_tree(rel, needle, allowed, hits, cap);
            found += n > 0 ? n : 0;
            continue;
        }
        const char *dot = strrchr(de->d_name, '.');
        if (!dot || (strcmp(dot, ".c") && strcmp(dot, ".h") && strcmp(dot, ".m") && strcmp(dot, ".cu") &&
                     strcmp(dot, ".cuh")))
            continue;
        if (!strcmp(rel, allowed))
            continue;
        char *s = slurp(src_path(rel));
        if (s && strstr(s, needle)) {
            size_t l = strlen(hits);
            snprintf(hits + l, cap - l, "%s%s", l ? ", " : "", rel);
            found++;
        }
        free(s);
    }
    closedir(d);
    return found;
}

MF_TEST(only_the_lever_table_reads_the_environment) {
    char hits[2048] = "";
    const char *needles[] = {"getenv(", "secure_getenv", "environ["};
    for (size_t i = 0; i < sizeof needles / sizeof needles[0]; i++) {
        hits[0] = 0;
        int n = grep_tree("src", needles[i], "src/runtime/levers.c", hits, sizeof hits);
        CHECK_MSG(n == 0, "%d file(s) of src/ call %s outside src/runtime/levers.c: %s", n, needles[i], hits);
    }
    /* the table's file is where the reads are (the grep looks at the right tree) */
    char *lv = slurp(src_path("src/runtime/levers.c"));
    CHECK_MSG(lv && strstr(lv, "getenv("), "src/runtime/levers.c reads no environment, or is not at %s",
              src_path("src/runtime/levers.c"));
    free(lv);
}

MF_TEST_MAIN(MF_T(lever_table_matches_env_md), MF_T(lever_values_and_defaults), MF_T(registry_lines),
             MF_T(layers_name_no_backend), MF_T(only_the_lever_table_reads_the_environment))
