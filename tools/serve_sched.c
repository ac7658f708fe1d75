/* serve_sched.c - continuous batching for `minfer serve` (serve_sched.h). */
#include "serve_sched.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- jobs ------------------------------------------------------------------------------ */

sv_job *sv_job_new(void) {
    sv_job *j = mf_calloc(1, sizeof *j);
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    atomic_init(&j->cancel, 0);
    atomic_init(&j->refs, 1);
    j->slot = -1;
    mf_sbuf_add(&j->text, "", 0);
    return j;
}

void sv_job_release(sv_job *j) {
    if (!j || atomic_fetch_sub(&j->refs, 1) != 1)
        return;
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    mf_sbuf_free(&j->text);
    free(j->prompt);
    for (int i = 0; i < j->n_stop; i++)
        free(j->stop[i]);
    free(j->probs);
    free(j->prob_end);
    free(j->gbnf);
    free(j);
}

/* ---- histograms -------------------------------------------------------------------------- */

#define HIST_N 12
static const double hist_le[HIST_N] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                       0.5,   1,    2.5,   5,    10,  30};

typedef struct hist {
    uint64_t bucket[HIST_N + 1]; /* last: +Inf */
    double sum;
    uint64_t count;
} hist;

static void hist_add(hist *h, double v) {
    int i = 0;
    while (i < HIST_N && v > hist_le[i])
        i++;
    h->bucket[i]++;
    h->sum += v;
    h->count++;
}

static void hist_print(mf_sbuf *b, const char *name, const char *help, const hist *h) {
    mf_sbuf_printf(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (int i = 0; i < HIST_N; i++) {
        cum += h->bucket[i];
        mf_sbuf_printf(b, "%s_bucket{le=\"%g\"} %llu\n", name, hist_le[i], (unsigned long long)cum);
    }
    cum += h->bucket[HIST_N];
    mf_sbuf_printf(b, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name,
                   (unsigned long long)cum, name, h->sum, name, (unsigned long long)h->count);
}

/* ---- the scheduler ------------------------------------------------------------------------ */

typedef struct slot {
    sv_job *job;             /* NULL: free */
    int32_t seq;
    int32_t n_done;          /* prompt tokens in the KV (cached ones included) */
    int32_t next;            /* decoding: the token to run next */
    bool decoding;
    minfer_sampler *smp;
    char pend[8];            /* bytes of an incomplete UTF-8 character */
    int n_pend;
    uint64_t t_last_ns;
} slot;

#define N_FINISH 5
static const char *const finish_names[N_FINISH] = {"stop", "length", "cancelled", "error",
                                                   "shutdown"};

typedef struct endpoint_count {
    char name[32];
    int status;
    uint64_t n;
} endpoint_count;

#define MAX_ENDPOINT_COUNTS 64

struct sv_sched {
    minfer_model *m;
    minfer_multi *mm;
    sv_sched_opts o;
    int32_t n_vocab;
    pthread_t th;
    bool started;

    pthread_mutex_t mu;      /* guards everything below */
    pthread_cond_t work;
    sv_job **q;              /* ring of queue_max */
    int32_t q_head, q_n;
    bool stopping, exited;
    uint64_t stop_deadline_ns;
    slot *slots;
    int32_t n_run;
    /* metrics */
    uint64_t n_submitted, n_rejected, n_finished[N_FINISH];
    uint64_t tok_prompt, tok_cached, tok_gen, n_steps;
    hist ttft, e2e, itl, queue_wait;
    minfer_multi_stats kv;
    endpoint_count ep[MAX_ENDPOINT_COUNTS];
    int n_ep;

    /* the batch of the step (scheduler thread only) */
    int32_t *b_tok, *b_seq, *b_pos, *b_slot;
    bool *b_logits;
    float *scratch;          /* n_vocab */
};

int32_t sv_sched_n_ctx(const sv_sched *s) { return s->o.n_ctx; }
int32_t sv_sched_n_slots(const sv_sched *s) { return s->o.n_slots; }

static double secs(uint64_t ns) { return (double)ns / 1e9; }

/* Ends job j (lock s->mu held or not: only j->mu is taken here) with a
 * finish reason, or an error status and message. */
static void job_end(sv_job *j, const char *finish, int status, const char *msg) {
    pthread_mutex_lock(&j->mu);
    j->finish = finish;
    j->err_status = finish ? 0 : status;
    if (!finish)
        snprintf(j->err, sizeof j->err, "%s", msg);
    j->ready = j->text.n;
    j->state = SV_DONE;
    j->t_done_ns = mf_time_ns();
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

static int finish_index(const char *f) {
    for (int i = 0; i < N_FINISH; i++)
        if (!strcmp(finish_names[i], f))
            return i;
    return 3;
}

/* Frees slot k: its sequence goes to the prompt cache; counts the finish. */
static void slot_end(sv_sched *s, int32_t k, const char *finish, int status, const char *msg,
                     const char *count_as) {
    slot *sl = &s->slots[k];
    sv_job *j = sl->job;
    char err[256];
    minfer_seq_remove(s->mm, sl->seq, err, sizeof err);
    minfer_sampler_free(sl->smp);
    sl->smp = NULL;
    job_end(j, finish, status, msg);
    pthread_mutex_lock(&s->mu);
    s->n_finished[finish_index(count_as)]++;
    if (j->t_done_ns > j->t_submit_ns)
        hist_add(&s->e2e, secs(j->t_done_ns - j->t_submit_ns));
    s->n_run--;
    sl->job = NULL;
    pthread_mutex_unlock(&s->mu);
    sv_job_release(j);
}

/* Ends the queued jobs whose client left, keeping the others in order
 * (s->mu held): a client that leaves the queue does not wait for a slot. */
static void drop_cancelled(sv_sched *s) {
    int32_t kept = 0;
    for (int32_t i = 0; i < s->q_n; i++) {
        sv_job *j = s->q[(s->q_head + i) % s->o.queue_max];
        if (atomic_load(&j->cancel)) {
            s->n_finished[finish_index("cancelled")]++;
            job_end(j, "cancelled", 0, "");
            sv_job_release(j);
            continue;
        }
        s->q[(s->q_head + kept) % s->o.queue_max] = j;
        kept++;
    }
    s->q_n = kept;
}

/* Takes queued jobs into free slots (s->mu held). */
static void admit(sv_sched *s) {
    while (s->q_n > 0 && s->n_run < s->o.n_slots) {
        sv_job *j = s->q[s->q_head];
        s->q_head = (s->q_head + 1) % s->o.queue_max;
        s->q_n--;
        if (atomic_load(&j->cancel)) {
            s->n_finished[finish_index("cancelled")]++;
            job_end(j, "cancelled", 0, "");
            sv_job_release(j);
            continue;
        }
        int32_t k = 0;
        while (s->slots[k].job)
            k++;
        slot *sl = &s->slots[k];
        char err[256];
        int32_t reused = 0;
        sl->seq = minfer_seq_from_cache(s->mm, j->prompt, j->n_prompt, &reused, err, sizeof err);
        if (sl->seq < 0) {
            s->n_finished[finish_index("error")]++;
            job_end(j, NULL, 500, err);
            sv_job_release(j);
            continue;
        }
        sl->job = j;
        sl->n_done = reused;
        sl->decoding = false;
        sl->n_pend = 0;
        /* A grammar needs the sampler even for a greedy job: it masks the
         * logits before the argmax (temp 0 keeps the sampler greedy). */
        sl->smp = j->greedy && !j->gbnf ? NULL : minfer_sampler_new(&j->so);
        if (j->gbnf && minfer_sampler_set_grammar(sl->smp, s->m, j->gbnf, err, sizeof err)) {
            minfer_sampler_free(sl->smp);
            sl->smp = NULL;
            char e2[128];
            minfer_seq_remove(s->mm, sl->seq, e2, sizeof e2);
            sl->job = NULL;
            s->n_finished[finish_index("error")]++;
            job_end(j, NULL, 500, err);
            sv_job_release(j);
            continue;
        }
        for (int32_t i = 0; sl->smp && i < j->n_prompt; i++)
            minfer_sampler_accept(sl->smp, j->prompt[i]);
        s->n_run++;
        s->tok_prompt += (uint64_t)j->n_prompt;
        s->tok_cached += (uint64_t)reused;
        hist_add(&s->queue_wait, secs(mf_time_ns() - j->t_submit_ns));
        pthread_mutex_lock(&j->mu);
        j->state = SV_RUNNING;
        j->slot = k;
        j->n_cached = reused;
        pthread_cond_broadcast(&j->cv);
        pthread_mutex_unlock(&j->mu);
    }
}

/* Bytes at the end of text that could still grow into a stop string. */
static size_t stop_holdback(const sv_job *j) {
    size_t best = 0;
    for (int i = 0; i < j->n_stop; i++) {
        size_t sl = j->stop_len[i];
        for (size_t k = sl - 1; k > best; k--)
            if (k <= j->text.n && !memcmp(j->text.p + j->text.n - k, j->stop[i], k)) {
                best = k;
                break;
            }
    }
    return best;
}

/* Appends bytes to the job's text (j->mu held); true when a stop string ended it. */
static bool add_text(sv_job *j, const char *p, size_t n) {
    const size_t old = j->text.n;
    mf_sbuf_add(&j->text, p, n);
    size_t cut = SIZE_MAX;
    for (int i = 0; i < j->n_stop; i++) {
        const size_t sl = j->stop_len[i];
        const size_t from = old >= sl - 1 ? old - (sl - 1) : 0;
        for (size_t q = from; q + sl <= j->text.n && q < cut; q++)
            if (!memcmp(j->text.p + q, j->stop[i], sl)) {
                cut = q;
                break;
            }
    }
    if (cut != SIZE_MAX) {
        j->text.n = cut;
        j->text.p[cut] = 0;
        j->ready = cut;
        return true;
    }
    j->ready = j->text.n - stop_holdback(j);
    return false;
}

/* The length of a UTF-8 sequence its lead byte announces (0: not a lead byte). */
static int utf8_len(unsigned char c) {
    return c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
}

/* A token's bytes (any length) into the slot's text: whole characters now,
 * a character's first bytes held until the rest comes. flush (the last
 * token): a character still incomplete is dropped, never sent as bytes
 * that are not UTF-8 or as a U+FFFD the model did not produce. */
static bool slot_text(slot *sl, const char *piece, int32_t n, bool flush) {
    char small[512];
    const size_t len = (size_t)sl->n_pend + (size_t)(n > 0 ? n : 0);
    char *buf = len <= sizeof small ? small : malloc(len);
    if (!buf)
        return false; /* out of memory: the piece is lost, never cut mid-character */
    memcpy(buf, sl->pend, (size_t)sl->n_pend);
    if (n > 0)
        memcpy(buf + sl->n_pend, piece, (size_t)n);
    size_t emit = len;
    sl->n_pend = 0;
    /* the last up to 3 bytes: an unfinished character */
    for (size_t back = 1; back <= 3 && back <= len; back++) {
        const unsigned char c = (unsigned char)buf[len - back];
        if ((c & 0xC0) == 0x80)
            continue;
        const int need = utf8_len(c);
        if (need > (int)back) {
            emit = len - back;
            if (!flush) {
                memcpy(sl->pend, buf + emit, back);
                sl->n_pend = (int)back;
            }
        }
        break;
    }
    const bool stopped = add_text(sl->job, buf, emit);
    if (buf != small)
        free(buf);
    return stopped;
}

/* Token logprobs of the raw distribution (temperature 1), as OpenAI reports. */
static void token_probs(sv_sched *s, const float *lg, int32_t tok, int32_t n_top, sv_tokprob *tp) {
    const int32_t V = s->n_vocab;
    float mx = -INFINITY;
    for (int32_t i = 0; i < V; i++)
        mx = lg[i] > mx ? lg[i] : mx;
    double sum = 0;
    for (int32_t i = 0; i < V; i++)
        sum += exp((double)(lg[i] - mx));
    const double lse = (double)mx + log(sum);
    tp->token = tok;
    tp->logprob = (float)((double)lg[tok] - lse);
    tp->n_top = 0;
    for (int32_t i = 0; i < V && n_top > 0; i++) {
        int32_t k;
        if (tp->n_top < n_top)
            k = tp->n_top++;
        else if (lg[i] > lg[tp->top[n_top - 1]])
            k = n_top - 1;
        else
            continue;
        while (k > 0 && lg[tp->top[k - 1]] < lg[i]) { /* kept sorted, highest first */
            tp->top[k] = tp->top[k - 1];
            k--;
        }
        tp->top[k] = i;
    }
    for (int32_t k = 0; k < tp->n_top; k++)
        tp->top_lp[k] = (float)((double)lg[tp->top[k]] - lse);
}

static int32_t argmax(const float *a, int32_t n) {
    int32_t k = 0;
    for (int32_t i = 1; i < n; i++)
        if (a[i] > a[k])
            k = i;
    return k;
}

/* Slot k got logits lg: sample, record, detokenize, check the stops. */
static void slot_step(sv_sched *s, int32_t k, const float *lg) {
    slot *sl = &s->slots[k];
    sv_job *j = sl->job;
    const int32_t tok = sl->smp ? minfer_sampler_sample(sl->smp, lg, s->n_vocab) : argmax(lg, s->n_vocab);
    const uint64_t now = mf_time_ns();
    if (tok < 0 || tok >= s->n_vocab) {
        /* with a grammar, -1 means no token of the vocabulary continues the
         * output: an error the client sees, never a silent stop */
        char msg[128];
        snprintf(msg, sizeof msg, j->gbnf ? "grammar: no token continues the constrained output "
                                            "after %d generated tokens"
                                          : "the sampler returned no token (after %d tokens)",
                 j->n_gen);
        pthread_mutex_lock(&j->mu);
        slot_text(sl, NULL, 0, true);
        pthread_mutex_unlock(&j->mu);
        slot_end(s, k, NULL, 500, msg, "error");
        return;
    }
    pthread_mutex_lock(&s->mu);
    if (j->n_gen == 0)
        hist_add(&s->ttft, secs(now - j->t_submit_ns));
    else
        hist_add(&s->itl, secs(now - sl->t_last_ns));
    pthread_mutex_unlock(&s->mu);
    sl->t_last_ns = now;
    if (minfer_token_is_eog(s->m, tok)) {
        pthread_mutex_lock(&j->mu);
        slot_text(sl, NULL, 0, true);
        pthread_mutex_unlock(&j->mu);
        slot_end(s, k, "stop", 0, NULL, "stop");
        return;
    }
    if (sl->smp)
        minfer_sampler_accept(sl->smp, tok);
    char small[256], *piece = small;
    int32_t n = minfer_token_to_piece(s->m, tok, small, sizeof small);
    if (n > (int32_t)sizeof small && (piece = malloc((size_t)n)) != NULL)
        n = minfer_token_to_piece(s->m, tok, piece, (size_t)n); /* a long piece, whole */
    if (n < 0 || !piece) {
        n = 0;
        piece = small;
    }
    const int32_t len = minfer_seq_len(s->mm, sl->seq);
    const bool at_max = j->max_tokens >= 0 && j->n_gen + 1 >= j->max_tokens;
    const bool at_ctx = len >= s->o.n_ctx; /* no room to run this token */
    pthread_mutex_lock(&j->mu);
    if (j->n_gen == 0)
        j->t_first_ns = now;
    j->n_gen++;
    const bool stopped = slot_text(sl, piece, n, at_max || at_ctx);
    if (piece != small)
        free(piece);
    if (j->logprobs) {
        if (j->n_probs == j->cap_probs) {
            j->cap_probs = j->cap_probs ? 2 * j->cap_probs : 64;
            j->probs = mf_realloc(j->probs, (size_t)j->cap_probs * sizeof *j->probs);
            j->prob_end = mf_realloc(j->prob_end, (size_t)j->cap_probs * sizeof *j->prob_end);
        }
        token_probs(s, lg, tok, j->n_top, &j->probs[j->n_probs]);
        j->prob_end[j->n_probs++] = j->text.n;
    }
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    pthread_mutex_lock(&s->mu);
    s->tok_gen++;
    pthread_mutex_unlock(&s->mu);
    if (stopped) {
        slot_end(s, k, "stop", 0, NULL, "stop");
        return;
    }
    if (at_max || at_ctx) {
        slot_end(s, k, "length", 0, NULL, "length");
        return;
    }
    sl->next = tok;
    sl->decoding = true;
}

static void *sched_main(void *arg) {
    sv_sched *s = arg;
    char err[512];
    for (;;) {
        pthread_mutex_lock(&s->mu);
        while (!s->stopping && s->n_run == 0 && s->q_n == 0)
            pthread_cond_wait(&s->work, &s->mu);
        if (s->stopping) {
            while (s->q_n > 0) { /* never started: the client may retry elsewhere */
                sv_job *j = s->q[s->q_head];
                s->q_head = (s->q_head + 1) % s->o.queue_max;
                s->q_n--;
                s->n_finished[finish_index("shutdown")]++;
                job_end(j, NULL, 503, "the server is shutting down");
                sv_job_release(j);
            }
            if (s->n_run == 0) {
                s->exited = true;
                pthread_mutex_unlock(&s->mu);
                break;
            }
        }
        const bool past_grace = s->stopping && mf_time_ns() >= s->stop_deadline_ns;
        drop_cancelled(s);
        if (!s->stopping)
            admit(s);
        pthread_mutex_unlock(&s->mu);

        /* jobs whose client left, or cut by the shutdown */
        for (int32_t k = 0; k < s->o.n_slots; k++) {
            if (!s->slots[k].job)
                continue;
            if (atomic_load(&s->slots[k].job->cancel))
                slot_end(s, k, "cancelled", 0, NULL, "cancelled");
            else if (past_grace)
                slot_end(s, k, NULL, 503, "the server is shutting down; generation was cut short",
                         "shutdown");
        }

        /* the step: one token per decoding slot, then prompt chunks */
        int32_t nt = 0;
        for (int32_t k = 0; k < s->o.n_slots && nt < s->o.n_batch; k++) {
            slot *sl = &s->slots[k];
            if (!sl->job || !sl->decoding)
                continue;
            s->b_tok[nt] = sl->next;
            s->b_seq[nt] = sl->seq;
            s->b_pos[nt] = minfer_seq_len(s->mm, sl->seq);
            s->b_slot[nt] = k;
            s->b_logits[nt] = true;
            nt++;
        }
        for (int32_t k = 0; k < s->o.n_slots && nt < s->o.n_batch; k++) {
            slot *sl = &s->slots[k];
            if (!sl->job || sl->decoding)
                continue;
            const sv_job *j = sl->job;
            int32_t take = j->n_prompt - sl->n_done;
            take = take < s->o.chunk ? take : s->o.chunk;
            take = take < s->o.n_batch - nt ? take : s->o.n_batch - nt;
            const int32_t p0 = minfer_seq_len(s->mm, sl->seq);
            for (int32_t i = 0; i < take; i++) {
                s->b_tok[nt] = j->prompt[sl->n_done + i];
                s->b_seq[nt] = sl->seq;
                s->b_pos[nt] = p0 + i;
                s->b_slot[nt] = k;
                s->b_logits[nt] = sl->n_done + i == j->n_prompt - 1;
                nt++;
            }
            sl->n_done += take;
        }
        if (nt == 0)
            continue;
        minfer_batch b = {.n_tokens = nt, .token = s->b_tok, .seq_id = s->b_seq, .pos = s->b_pos,
                          .logits = s->b_logits};
        if (minfer_multi_decode(s->mm, &b, err, sizeof err)) {
            /* every slot of this step fails with the reason (it names the numbers) */
            for (int32_t i = 0; i < nt; i++) {
                const int32_t k = s->b_slot[i];
                if (s->slots[k].job && (i == 0 || s->b_slot[i - 1] != k))
                    slot_end(s, k, NULL, 500, err, "error");
            }
            continue;
        }
        for (int32_t i = 0; i < nt; i++) {
            const int32_t k = s->b_slot[i];
            if (!s->b_logits[i] || !s->slots[k].job)
                continue;
            slot_step(s, k, minfer_multi_logits(s->mm, i));
        }
        minfer_multi_stats st;
        minfer_multi_get_stats(s->mm, &st);
        pthread_mutex_lock(&s->mu);
        s->kv = st;
        s->n_steps++;
        pthread_mutex_unlock(&s->mu);
    }
    return NULL;
}

sv_sched *sv_sched_new(minfer_model *m, const sv_sched_opts *o, char *err, size_t errlen) {
    sv_sched *s = mf_calloc(1, sizeof *s);
    s->m = m;
    s->o = *o;
    s->n_vocab = minfer_model_n_vocab(m);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->work, NULL);
    minfer_multi_options mo;
    minfer_multi_options_default(&mo);
    mo.n_ctx = o->n_ctx;
    mo.n_seq_max = o->n_slots;
    mo.n_blocks = o->n_blocks;
    mo.n_batch = o->n_batch;
    mo.cache_type = o->cache_type;
    mo.cache_type_v = o->cache_type_v;
    mo.flash_attn_off = o->flash_attn_off;
    mo.prompt_cache = o->prompt_cache;
    s->mm = minfer_multi_new(m, &mo, err, errlen);
    if (!s->mm) {
        sv_sched_free(s);
        return NULL;
    }
    s->o.n_ctx = minfer_multi_n_ctx(s->mm);
    minfer_multi_get_stats(s->mm, &s->kv);
    s->q = mf_calloc((size_t)o->queue_max, sizeof *s->q);
    s->slots = mf_calloc((size_t)o->n_slots, sizeof *s->slots);
    const size_t nb = (size_t)o->n_batch;
    s->b_tok = mf_malloc(nb * 4 * sizeof(int32_t));
    s->b_seq = s->b_tok + nb;
    s->b_pos = s->b_seq + nb;
    s->b_slot = s->b_pos + nb;
    s->b_logits = mf_malloc(nb * sizeof *s->b_logits);
    if (pthread_create(&s->th, NULL, sched_main, s)) {
        snprintf(err, errlen, "serve: cannot start the compute thread");
        sv_sched_free(s);
        return NULL;
    }
    s->started = true;
    return s;
}

void sv_sched_shutdown(sv_sched *s) {
    pthread_mutex_lock(&s->mu);
    if (!s->stopping) {
        s->stopping = true;
        s->stop_deadline_ns = mf_time_ns() + (uint64_t)s->o.grace_ms * 1000000ull;
    }
    pthread_cond_broadcast(&s->work);
    pthread_mutex_unlock(&s->mu);
}

bool sv_sched_idle(sv_sched *s) {
    pthread_mutex_lock(&s->mu);
    bool idle = s->exited || (s->stopping && s->n_run == 0 && s->q_n == 0);
    pthread_mutex_unlock(&s->mu);
    return idle;
}

void sv_sched_free(sv_sched *s) {
    if (!s)
        return;
    if (s->started) {
        sv_sched_shutdown(s);
        pthread_join(s->th, NULL);
    }
    minfer_multi_free(s->mm);
    free(s->q);
    free(s->slots);
    free(s->b_tok);
    free(s->b_logits);
    free(s->scratch);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->work);
    free(s);
}

int sv_submit(sv_sched *s, sv_job *j) {
    pthread_mutex_lock(&s->mu);
    int rc = 0;
    if (s->stopping) {
        rc = 2;
    } else if (s->q_n >= s->o.queue_max) {
        s->n_rejected++;
        rc = 1;
    } else {
        atomic_fetch_add(&j->refs, 1);
        j->t_submit_ns = mf_time_ns();
        j->state = SV_QUEUED;
        s->q[(s->q_head + s->q_n) % s->o.queue_max] = j;
        s->q_n++;
        s->n_submitted++;
        pthread_cond_signal(&s->work);
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

void sv_sched_count_request(sv_sched *s, const char *endpoint, int status) {
    pthread_mutex_lock(&s->mu);
    int i = 0;
    while (i < s->n_ep && (s->ep[i].status != status || strcmp(s->ep[i].name, endpoint)))
        i++;
    if (i == s->n_ep && s->n_ep < MAX_ENDPOINT_COUNTS) {
        snprintf(s->ep[i].name, sizeof s->ep[i].name, "%s", endpoint);
        s->ep[i].status = status;
        s->n_ep++;
    }
    if (i < s->n_ep)
        s->ep[i].n++;
    pthread_mutex_unlock(&s->mu);
}

void sv_sched_metrics(sv_sched *s, mf_sbuf *b) {
    pthread_mutex_lock(&s->mu);
    mf_sbuf_puts(b, "# HELP minfer_http_requests_total HTTP requests answered, by endpoint and status.\n"
                    "# TYPE minfer_http_requests_total counter\n");
    for (int i = 0; i < s->n_ep; i++)
        mf_sbuf_printf(b, "minfer_http_requests_total{endpoint=\"%s\",status=\"%d\"} %llu\n", s->ep[i].name,
                       s->ep[i].status, (unsigned long long)s->ep[i].n);
    mf_sbuf_printf(b,
                   "# HELP minfer_requests_submitted_total Completion requests queued.\n"
                   "# TYPE minfer_requests_submitted_total counter\nminfer_requests_submitted_total %llu\n"
                   "# HELP minfer_requests_rejected_total Completion requests refused: queue full (503).\n"
                   "# TYPE minfer_requests_rejected_total counter\nminfer_requests_rejected_total %llu\n"
                   "# HELP minfer_requests_finished_total Completion requests ended, by reason.\n"
                   "# TYPE minfer_requests_finished_total counter\n",
                   (unsigned long long)s->n_submitted, (unsigned long long)s->n_rejected);
    for (int i = 0; i < N_FINISH; i++)
        mf_sbuf_printf(b, "minfer_requests_finished_total{reason=\"%s\"} %llu\n", finish_names[i],
                       (unsigned long long)s->n_finished[i]);
    mf_sbuf_printf(b,
                   "# HELP minfer_prompt_tokens_total Prompt tokens of admitted requests.\n"
                   "# TYPE minfer_prompt_tokens_total counter\nminfer_prompt_tokens_total %llu\n"
                   "# HELP minfer_prompt_tokens_cached_total Prompt tokens taken from the prompt cache.\n"
                   "# TYPE minfer_prompt_tokens_cached_total counter\nminfer_prompt_tokens_cached_total %llu\n"
                   "# HELP minfer_generated_tokens_total Tokens generated.\n"
                   "# TYPE minfer_generated_tokens_total counter\nminfer_generated_tokens_total %llu\n"
                   "# HELP minfer_steps_total Batched forwards run.\n"
                   "# TYPE minfer_steps_total counter\nminfer_steps_total %llu\n"
                   "# HELP minfer_queue_depth Requests waiting for a slot.\n"
                   "# TYPE minfer_queue_depth gauge\nminfer_queue_depth %d\n"
                   "# HELP minfer_running_sequences Requests in a slot.\n"
                   "# TYPE minfer_running_sequences gauge\nminfer_running_sequences %d\n"
                   "# HELP minfer_slots Slots (sequences decoded together).\n"
                   "# TYPE minfer_slots gauge\nminfer_slots %d\n"
                   "# HELP minfer_kv_blocks_used KV pool blocks held (live sequences and the prompt cache).\n"
                   "# TYPE minfer_kv_blocks_used gauge\nminfer_kv_blocks_used %d\n"
                   "# HELP minfer_kv_blocks_free KV pool blocks free.\n"
                   "# TYPE minfer_kv_blocks_free gauge\nminfer_kv_blocks_free %d\n"
                   "# HELP minfer_kv_blocks_cached KV pool blocks only the prompt cache holds.\n"
                   "# TYPE minfer_kv_blocks_cached gauge\nminfer_kv_blocks_cached %d\n"
                   "# HELP minfer_prompt_cache_lookups_total Prompt cache lookups.\n"
                   "# TYPE minfer_prompt_cache_lookups_total counter\nminfer_prompt_cache_lookups_total %lld\n"
                   "# HELP minfer_prompt_cache_hits_total Lookups that reused a cached prefix.\n"
                   "# TYPE minfer_prompt_cache_hits_total counter\nminfer_prompt_cache_hits_total %lld\n",
                   (unsigned long long)s->tok_prompt, (unsigned long long)s->tok_cached,
                   (unsigned long long)s->tok_gen, (unsigned long long)s->n_steps, s->q_n, s->n_run,
                   s->o.n_slots, s->kv.blocks_used, s->kv.n_blocks - s->kv.blocks_used, s->kv.blocks_cached,
                   (long long)s->kv.cache_lookups, (long long)s->kv.cache_hits);
    hist_print(b, "minfer_time_to_first_token_seconds", "From queueing to the first generated token.",
               &s->ttft);
    hist_print(b, "minfer_inter_token_seconds", "Between two tokens of one request.", &s->itl);
    hist_print(b, "minfer_queue_wait_seconds", "From queueing to a slot.", &s->queue_wait);
    hist_print(b, "minfer_request_duration_seconds", "From queueing to the end of generation.", &s->e2e);
    pthread_mutex_unlock(&s->mu);
}

void sv_sched_slots_json(sv_sched *s, mf_sbuf *b) {
    pthread_mutex_lock(&s->mu);
    mf_sbuf_puts(b, "[");
    for (int32_t k = 0; k < s->o.n_slots; k++) {
        const slot *sl = &s->slots[k];
        const sv_job *j = sl->job;
        mf_sbuf_printf(b, "%s{\"id\":%d,\"state\":\"%s\",\"n_ctx\":%d", k ? "," : "", k,
                       !j ? "idle" : sl->decoding ? "decode" : "prefill", s->o.n_ctx);
        if (j)
            mf_sbuf_printf(b, ",\"n_prompt\":%d,\"n_prompt_done\":%d,\"n_cached\":%d,\"n_gen\":%d,"
                              "\"max_tokens\":%d",
                           j->n_prompt, sl->n_done, j->n_cached, j->n_gen, j->max_tokens);
        mf_sbuf_puts(b, "}");
    }
    mf_sbuf_puts(b, "]");
    pthread_mutex_unlock(&s->mu);
}
