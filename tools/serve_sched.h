/* serve_sched.h - the compute side of `minfer serve`: continuous batching.
 *
 * One thread owns the model's minfer_multi. Requests (jobs) wait in a
 * bounded queue; at every step boundary the thread admits queued jobs into
 * free slots (each starting from the longest cached prompt prefix), runs one
 * forward holding one token of every decoding slot plus a prefill chunk of
 * the slots still reading their prompt, then samples, detokenizes and checks
 * the stop conditions of each slot that got logits. A job whose client left
 * (cancel set by the connection side) is dropped at the next step, queued or
 * running. The connection threads only wait on their job's condition
 * variable, so nothing they do can stall the batch and nothing the batch does
 * blocks /health or /metrics. */
#ifndef MF_TOOLS_SERVE_SCHED_H
#define MF_TOOLS_SERVE_SCHED_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "json.h"
#include "minfer.h"

#define SV_MAX_STOP 4
#define SV_MAX_TOP 20

typedef struct sv_tokprob {
    int32_t token;
    float logprob;
    int32_t n_top;
    int32_t top[SV_MAX_TOP];
    float top_lp[SV_MAX_TOP];
} sv_tokprob;

typedef enum sv_state { SV_QUEUED, SV_RUNNING, SV_DONE } sv_state;

typedef struct sv_job {
    /* the request: set before sv_submit, read-only after */
    int32_t *prompt;
    int32_t n_prompt;
    minfer_sampler_options so;
    bool greedy;
    int32_t max_tokens;
    char *stop[SV_MAX_STOP];
    size_t stop_len[SV_MAX_STOP];
    int n_stop;
    bool logprobs;           /* record each token's logprob */
    int32_t n_top;           /* and this many alternatives (<= SV_MAX_TOP) */
    char *gbnf;              /* output grammar (response_format, forced tool call), or NULL */

    /* progress: written by the scheduler under mu, cv signalled */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    mf_sbuf text;            /* whole UTF-8 text so far, cut at a stop string */
    size_t ready;            /* bytes of text that no stop string can take back */
    sv_tokprob *probs;       /* per generated token (logprobs) */
    size_t *prob_end;        /* text length after each token's bytes */
    int32_t n_probs, cap_probs;
    int32_t n_gen, n_cached; /* generated tokens, prompt tokens taken from the cache */
    sv_state state;
    const char *finish;      /* "stop" / "length" when it ended well */
    int err_status;          /* else the status (500, 503) and err */
    char err[256];
    int slot;
    uint64_t t_submit_ns, t_first_ns, t_done_ns;

    _Atomic int cancel;      /* the client left: stop this job */
    _Atomic int refs;        /* the connection and the scheduler */
} sv_job;

/* A job with refs = 1 (the caller's), empty progress. */
sv_job *sv_job_new(void);
/* Drops a reference; the last frees the job. */
void sv_job_release(sv_job *j);

typedef struct sv_sched_opts {
    int32_t n_slots;         /* sequences decoded together */
    int32_t n_ctx;           /* positions per sequence */
    int32_t n_batch;         /* tokens per forward */
    int32_t chunk;           /* prompt tokens per forward and slot */
    int32_t queue_max;       /* jobs waiting for a slot; more: refused */
    int32_t n_blocks;        /* KV pool blocks (0: every slot a full context) */
    const char *cache_type;  /* K (and V when cache_type_v is unset) */
    const char *cache_type_v;
    bool flash_attn_off;     /* -fa off */
    bool prompt_cache;
    int32_t grace_ms;        /* at shutdown, running jobs get this long to finish */
} sv_sched_opts;

typedef struct sv_sched sv_sched;

sv_sched *sv_sched_new(minfer_model *m, const sv_sched_opts *o, char *err, size_t errlen);
/* Stops (queued and running jobs as at shutdown), joins, frees. */
void sv_sched_free(sv_sched *s);

/* 0: queued (the scheduler holds a reference), 1: the queue is full, 2: the
 * server is shutting down. */
int sv_submit(sv_sched *s, sv_job *j);
/* Begins shutdown: queued jobs end at once with 503, running ones get
 * grace_ms to finish, then end with 503 "shutting down". */
void sv_sched_shutdown(sv_sched *s);
/* True once shutdown began and no job is queued or running. */
bool sv_sched_idle(sv_sched *s);

int32_t sv_sched_n_ctx(const sv_sched *s);
int32_t sv_sched_n_slots(const sv_sched *s);
/* Counted by the connection side. */
void sv_sched_count_request(sv_sched *s, const char *endpoint, int status);
/* Prometheus text exposition of the counters, gauges and histograms. */
void sv_sched_metrics(sv_sched *s, mf_sbuf *b);
/* [{"id":0,"state":"idle"|"prefill"|"decode","n_prompt":..,"n_past":..,"n_gen":..},...] */
void sv_sched_slots_json(sv_sched *s, mf_sbuf *b);

#endif
