/* test_runtime_multi.c - many sequences in one forward on the real model
 * ($MINFER_MODEL): a sequence's logits in a batch are bitwise those it gets
 * alone (prefill and decode, blocks placed apart so the paged attention
 * gathers), the paged path gives the single-sequence session's bits, a fork
 * shares its prefix copy-on-write without disturbing the source, the prompt
 * cache reuses the longest prefix, and bad batches / a full pool are errors
 * that change nothing. Skips (passes) when no model. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "mf_test.h"
#include "minfer.h"

static minfer_model *model;
static int32_t n_vocab;

enum { NS = 4, STEPS = 5, MAXP = 40 };

static minfer_multi *multi(int32_t n_seq, int32_t n_blocks, bool cache) {
    minfer_multi_options o;
    minfer_multi_options_default(&o);
    o.n_ctx = 256;
    o.n_seq_max = n_seq;
    o.n_blocks = n_blocks;
    o.block_size = 16;
    o.n_batch = 128;
    o.prompt_cache = cache;
    char err[512];
    minfer_multi *m = minfer_multi_new(model, &o, err, sizeof err);
    CHECK_MSG(m != NULL, "%s", err);
    return m;
}

static int32_t argmax(const float *a) {
    int32_t k = 0;
    for (int32_t i = 1; i < n_vocab; i++)
        if (a[i] > a[k])
            k = i;
    return k;
}

/* prompt i: distinct tokens; lengths 14 and 12 cross a block edge while decoding,
 * after their batch neighbours took the next blocks */
static int32_t prompt(int i, int32_t *t) {
    static const int32_t len[NS] = {5, 14, 33, 12};
    for (int32_t k = 0; k < len[i]; k++)
        t[k] = 100 + (i * 977 + k * 131) % 20000;
    return len[i];
}

/* Runs the prompts of seqs ids[0..n) in one batch, then STEPS greedy steps
 * of all of them batched; out[i][s] the logits of sequence i's step s (s = 0:
 * after the prompt). */
static void run(minfer_multi *m, const int *which, int n, float *out) {
    char err[512];
    int32_t sid[NS], tok[NS * MAXP], seq[NS * MAXP], pos[NS * MAXP], nt = 0;
    for (int i = 0; i < n; i++) {
        sid[i] = minfer_seq_new(m, err, sizeof err);
        CHECK_MSG(sid[i] >= 0, "%s", err);
        int32_t p[MAXP];
        int32_t len = prompt(which[i], p);
        for (int32_t k = 0; k < len; k++) {
            tok[nt] = p[k];
            seq[nt] = sid[i];
            pos[nt] = k;
            nt++;
        }
    }
    minfer_batch b = {.n_tokens = nt, .token = tok, .seq_id = seq, .pos = pos, .logits = NULL};
    CHECK_MSG(minfer_multi_decode(m, &b, err, sizeof err) == 0, "%s", err);
    int32_t last[NS];
    for (int i = 0; i < n; i++) {
        int32_t k = 0;
        for (int32_t j = 0; j < nt; j++)
            if (seq[j] == sid[i])
                k = j;
        last[i] = k;
    }
    for (int s = 0; s < STEPS; s++) {
        int32_t t2[NS], s2[NS], p2[NS];
        for (int i = 0; i < n; i++) {
            const float *lg = minfer_multi_logits(m, s == 0 ? last[i] : i);
            CHECK(lg != NULL);
            memcpy(out + ((size_t)which[i] * STEPS + s) * n_vocab, lg, (size_t)n_vocab * sizeof *lg);
            t2[i] = argmax(lg);
            s2[i] = sid[i];
            p2[i] = minfer_seq_len(m, sid[i]);
        }
        if (s == STEPS - 1)
            break;
        minfer_batch d = {.n_tokens = n, .token = t2, .seq_id = s2, .pos = p2, .logits = NULL};
        CHECK_MSG(minfer_multi_decode(m, &d, err, sizeof err) == 0, "%s", err);
    }
    for (int i = 0; i < n; i++)
        CHECK(minfer_seq_remove(m, sid[i], err, sizeof err) == 0);
}

static void batch_bitwise_equals_alone(void) {
    const size_t per = (size_t)STEPS * n_vocab;
    float *alone = malloc(NS * per * sizeof(float)), *batch = malloc(NS * per * sizeof(float));
    for (int i = 0; i < NS; i++) {
        minfer_multi *m = multi(NS, 0, false);
        run(m, (int[]){i}, 1, alone);
        minfer_multi_free(m);
    }
    minfer_multi *m = multi(NS, 0, false);
    /* a leftover sequence first, so the batch's blocks do not start at 0 */
    char err[256];
    int32_t pad = minfer_seq_new(m, err, sizeof err);
    int32_t pt[3] = {7, 8, 9};
    minfer_batch pb = {.n_tokens = 3, .token = pt, .seq_id = (int32_t[]){pad, pad, pad},
                       .pos = (int32_t[]){0, 1, 2}};
    CHECK_MSG(minfer_multi_decode(m, &pb, err, sizeof err) == 0, "%s", err);
    run(m, (int[]){0, 1, 2}, 3, batch);
    CHECK(minfer_seq_remove(m, pad, err, sizeof err) == 0);
    run(m, (int[]){3}, 1, batch);
    minfer_multi_free(m);
    for (int i = 0; i < NS; i++)
        for (int s = 0; s < STEPS; s++) {
            const size_t o = (size_t)i * per + (size_t)s * n_vocab;
            CHECK_MSG(memcmp(alone + o, batch + o, (size_t)n_vocab * sizeof(float)) == 0,
                      "sequence %d step %d: batch logits differ from alone", i, s);
        }
    free(alone);
    free(batch);
}

static void paged_agrees_with_session(void) {
    char err[512];
    minfer_session_options so;
    minfer_session_options_default(&so);
    so.n_ctx = 256;
    minfer_session *s = minfer_session_new(model, &so, err, sizeof err);
    CHECK_MSG(s != NULL, "%s", err);
    minfer_multi *m = multi(2, 0, false);
    int32_t p[MAXP], len = prompt(2, p);
    CHECK(minfer_prefill(s, p, len, err, sizeof err) == 0);
    int32_t sq = minfer_seq_new(m, err, sizeof err), seq[MAXP], pos[MAXP];
    for (int32_t k = 0; k < len; k++) {
        seq[k] = sq;
        pos[k] = k;
    }
    minfer_batch b = {.n_tokens = len, .token = p, .seq_id = seq, .pos = pos};
    CHECK_MSG(minfer_multi_decode(m, &b, err, sizeof err) == 0, "%s", err);
    for (int step = 0; step < 4; step++) {
        const float *a = minfer_logits(s), *c = minfer_multi_logits(m, step == 0 ? len - 1 : 0);
        CHECK(a && c);
        double md = 0;
        for (int32_t i = 0; i < n_vocab; i++)
            md = fmax(md, fabs((double)a[i] - c[i]));
        /* the same per-row kernels on the same values: the same bits */
        CHECK_MSG(md == 0, "step %d: paged vs session max |diff| %g", step, md);
        int32_t t = argmax(a), ps = len + step;
        CHECK(minfer_decode(s, t, err, sizeof err) == 0);
        minfer_batch d = {.n_tokens = 1, .token = &t, .seq_id = &sq, .pos = &ps};
        CHECK_MSG(minfer_multi_decode(m, &d, err, sizeof err) == 0, "%s", err);
    }
    minfer_multi_free(m);
    minfer_session_free(s);
}

/* Prefills toks[0..n) into a fresh sequence of m and returns its last logits copied. */
static void fresh_logits(const int32_t *toks, int32_t n, float *out) {
    char err[256];
    minfer_multi *m = multi(1, 0, false);
    int32_t sq = minfer_seq_new(m, err, sizeof err), seq[64], pos[64];
    for (int32_t k = 0; k < n; k++) {
        seq[k] = sq;
        pos[k] = k;
    }
    minfer_batch b = {.n_tokens = n, .token = toks, .seq_id = seq, .pos = pos};
    CHECK_MSG(minfer_multi_decode(m, &b, err, sizeof err) == 0, "%s", err);
    memcpy(out, minfer_multi_logits(m, n - 1), (size_t)n_vocab * sizeof *out);
    minfer_multi_free(m);
}

static void fork_is_copy_on_write(void) {
    char err[256];
    int32_t t[24];
    for (int k = 0; k < 24; k++)
        t[k] = 300 + 17 * k;
    float *want_a = malloc((size_t)n_vocab * 4), *want_b = malloc((size_t)n_vocab * 4);
    int32_t ta[21], tb[21];
    memcpy(ta, t, 20 * 4);
    memcpy(tb, t, 20 * 4);
    ta[20] = 1111;
    tb[20] = 2222;
    fresh_logits(ta, 21, want_a);
    fresh_logits(tb, 21, want_b);

    minfer_multi *m = multi(2, 0, false);
    int32_t a = minfer_seq_new(m, err, sizeof err), seq[20], pos[20];
    for (int k = 0; k < 20; k++) {
        seq[k] = a;
        pos[k] = k;
    }
    minfer_batch pb = {.n_tokens = 20, .token = t, .seq_id = seq, .pos = pos};
    CHECK(minfer_multi_decode(m, &pb, err, sizeof err) == 0);
    minfer_multi_stats st0, st1;
    minfer_multi_get_stats(m, &st0);
    int32_t b = minfer_seq_fork(m, a, 20, err, sizeof err);
    CHECK_MSG(b >= 0, "%s", err);
    CHECK_EQ_INT(minfer_seq_len(m, b), 20);
    minfer_multi_get_stats(m, &st1);
    CHECK_EQ_INT(st1.blocks_used, st0.blocks_used); /* shared, nothing copied yet */
    /* both write into the shared partial block: each gets its own copy */
    minfer_batch d = {.n_tokens = 2, .token = (int32_t[]){2222, 1111}, .seq_id = (int32_t[]){b, a},
                      .pos = (int32_t[]){20, 20}};
    CHECK_MSG(minfer_multi_decode(m, &d, err, sizeof err) == 0, "%s", err);
    CHECK(memcmp(minfer_multi_logits(m, 0), want_b, (size_t)n_vocab * 4) == 0);
    CHECK(memcmp(minfer_multi_logits(m, 1), want_a, (size_t)n_vocab * 4) == 0);
    /* a fork inside the first block: n_keep 7 */
    CHECK(minfer_seq_remove(m, b, err, sizeof err) == 0);
    int32_t c = minfer_seq_fork(m, a, 7, err, sizeof err);
    CHECK_EQ_INT(minfer_seq_len(m, c), 7);
    CHECK(minfer_seq_fork(m, a, 30, err, sizeof err) < 0); /* past its length (and no slot) */
    minfer_multi_free(m);
    free(want_a);
    free(want_b);
}

static void prompt_cache_reuses_longest_prefix(void) {
    char err[256];
    int32_t t[40];
    for (int k = 0; k < 40; k++)
        t[k] = 500 + 29 * k;
    float *want = malloc((size_t)n_vocab * 4);
    fresh_logits(t, 40, want);
    minfer_multi *m = multi(2, 0, true);
    int32_t reused = -1;
    int32_t a = minfer_seq_from_cache(m, t, 30, &reused, err, sizeof err);
    CHECK_EQ_INT(reused, 0);
    int32_t seq[40], pos[40];
    for (int k = 0; k < 40; k++)
        seq[k] = a, pos[k] = k;
    minfer_batch pb = {.n_tokens = 30, .token = t, .seq_id = seq, .pos = pos};
    CHECK(minfer_multi_decode(m, &pb, err, sizeof err) == 0);
    CHECK(minfer_seq_remove(m, a, err, sizeof err) == 0);
    minfer_multi_stats st;
    minfer_multi_get_stats(m, &st);
    CHECK_EQ_INT(st.n_seqs, 0);
    CHECK_EQ_INT(st.blocks_cached, 2); /* 30 positions in blocks of 16 */
    int32_t b = minfer_seq_from_cache(m, t, 40, &reused, err, sizeof err);
    CHECK_MSG(b >= 0, "%s", err);
    CHECK_EQ_INT(reused, 30);
    for (int k = 30; k < 40; k++)
        seq[k] = b;
    minfer_batch rest = {.n_tokens = 10, .token = t + 30, .seq_id = seq + 30, .pos = pos + 30};
    CHECK_MSG(minfer_multi_decode(m, &rest, err, sizeof err) == 0, "%s", err);
    CHECK(memcmp(minfer_multi_logits(m, 9), want, (size_t)n_vocab * 4) == 0);
    minfer_multi_get_stats(m, &st);
    CHECK_EQ_INT(st.cache_hits, 1);
    CHECK_EQ_INT(st.cache_tokens_reused, 30);
    /* the same whole prompt again: at most n - 1 reused, so its last token runs */
    int32_t c = minfer_seq_from_cache(m, t, 40, &reused, err, sizeof err);
    CHECK(c >= 0);
    CHECK_EQ_INT(reused, 39);
    minfer_multi_free(m);
    free(want);
}

static void bad_batches_change_nothing(void) {
    char err[256];
    minfer_multi *m = multi(2, 3, false); /* 3 blocks: 48 positions in all */
    int32_t a = minfer_seq_new(m, err, sizeof err);
    int32_t tok[40], seq[40], pos[40];
    for (int k = 0; k < 40; k++)
        tok[k] = 10 + k, seq[k] = a, pos[k] = k;
    minfer_batch b = {.n_tokens = 40, .token = tok, .seq_id = seq, .pos = pos};
    CHECK(minfer_multi_decode(m, &b, err, sizeof err) == 0);
    int32_t c = minfer_seq_new(m, err, sizeof err);
    for (int k = 0; k < 20; k++)
        seq[k] = c;
    b.n_tokens = 20;
    CHECK(minfer_multi_decode(m, &b, err, sizeof err) != 0);
    CHECK_STR_CONTAINS(err, "blocks");
    CHECK_EQ_INT(minfer_seq_len(m, c), 0);
    CHECK_EQ_INT(minfer_seq_len(m, a), 40);
    pos[0] = 5; /* not the sequence's length */
    b.n_tokens = 1;
    CHECK(minfer_multi_decode(m, &b, err, sizeof err) != 0);
    CHECK_STR_CONTAINS(err, "position 5");
    seq[0] = 7;
    CHECK(minfer_multi_decode(m, &b, err, sizeof err) != 0);
    CHECK_STR_CONTAINS(err, "sequence 7");
    seq[0] = c;
    pos[0] = 0;
    tok[0] = n_vocab;
    CHECK(minfer_multi_decode(m, &b, err, sizeof err) != 0);
    CHECK_STR_CONTAINS(err, "vocabulary");
    CHECK(minfer_seq_new(m, err, sizeof err) < 0); /* both slots live */
    /* a batch that wants no logits (a prompt chunk) runs and exposes none */
    CHECK(minfer_seq_remove(m, a, err, sizeof err) == 0); /* its blocks back to the pool */
    bool none[2] = {false, false};
    minfer_batch nb = {.n_tokens = 2, .token = (int32_t[]){5, 6}, .seq_id = (int32_t[]){c, c},
                       .pos = (int32_t[]){0, 1}, .logits = none};
    CHECK_MSG(minfer_multi_decode(m, &nb, err, sizeof err) == 0, "%s", err);
    CHECK(minfer_multi_logits(m, 0) == NULL && minfer_multi_logits(m, 1) == NULL);
    CHECK_EQ_INT(minfer_seq_len(m, c), 2);
    minfer_multi_free(m);
}

static void setup(void) {
    const char *p = getenv("MINFER_MODEL");
    if (!p)
        return;
    minfer_model_options o;
    minfer_model_options_default(&o);
    o.path = p;
    o.n_threads = 2;
    o.device = "cpu";
    char err[512];
    model = minfer_model_load(&o, err, sizeof err);
    if (!model)
        fprintf(stderr, "cannot load %s: %s\n", p, err);
    else
        n_vocab = minfer_model_n_vocab(model);
}

static const mf_test_entry tests[] = {MF_T(batch_bitwise_equals_alone), MF_T(paged_agrees_with_session),
                                      MF_T(fork_is_copy_on_write),
                                      MF_T(prompt_cache_reuses_longest_prefix),
                                      MF_T(bad_batches_change_nothing)};

int main(int argc, char **argv) {
    setup();
    if (!model) {
        printf("skip: no model (set MINFER_MODEL)\n");
        return getenv("MINFER_MODEL") ? 1 : 0;
    }
    int rc = mf_test_run(tests, (int)(sizeof tests / sizeof tests[0]), argc, argv);
    minfer_model_free(model);
    return rc;
}
