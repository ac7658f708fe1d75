/* api_model.c - the public model handle: GGUF model + tokenizer + chat
 * template + the backend choice, and the token/chat helpers of minfer.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/runtime.h"
#ifdef MINFER_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

static const char *const be_names[] = {[MF_BE_CPU] = "cpu", [MF_BE_REF] = "ref", [MF_BE_CUDA] = "cuda"};

void minfer_model_options_default(minfer_model_options *o) {
    *o = (minfer_model_options){.path = NULL,
                                .n_threads = 0,
                                .device = "auto",
                                .n_gpu_layers = -1,
                                .backends = NULL,
                                .progress = NULL,
                                .progress_user = NULL,
                                .chat_template = NULL};
}

static void set_err(char *err, size_t errlen, const mf_error *e) {
    if (err && errlen)
        snprintf(err, errlen, "%s", e->msg);
}

/* Parses a backend list ("ref,cpu"). The cpu backend must be in it: it is the
 * only one that runs every op, so a graph always has a home. */
static int parse_backends(minfer_model *mm, const char *list, const char *source, mf_error *err) {
    mm->n_be = 0;
    bool cpu = false;
    const char *p = list;
    while (*p) {
        const char *e = strchr(p, ',');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        int c = -1;
        for (int k = 0; k < (int)(sizeof be_names / sizeof be_names[0]); k++)
            if (n == strlen(be_names[k]) && !strncmp(p, be_names[k], n))
                c = k;
        if (c < 0)
            return mf_errorf(err, "%s '%s': unknown backend '%.*s' (known: cuda, ref, cpu)", source,
                             list, (int)n, p);
        for (int i = 0; i < mm->n_be; i++)
            if ((int)mm->be[i] == c)
                return mf_errorf(err, "%s '%s': backend '%.*s' listed twice", source, list, (int)n,
                                 p);
        if (mm->n_be == MF_RT_MAX_BACKENDS)
            return mf_errorf(err, "%s '%s': too many backends", source, list);
        mm->be[mm->n_be++] = (mf_backend_choice)c;
        cpu |= c == MF_BE_CPU;
        p += n;
        if (*p == ',')
            p++;
    }
    if (!cpu)
        return mf_errorf(err, "%s '%s': the cpu backend must be in the list", source, list);
    return 0;
}

static void name_backends(minfer_model *mm) {
    mm->backend_name[0] = 0;
    for (int i = 0; i < mm->n_be; i++) {
        size_t l = strlen(mm->backend_name);
        snprintf(mm->backend_name + l, sizeof mm->backend_name - l, "%s%s", i ? "," : "",
                 be_names[mm->be[i]]);
    }
}

static void drop_backend(minfer_model *mm, mf_backend_choice c) {
    int k = 0;
    for (int i = 0; i < mm->n_be; i++)
        if (mm->be[i] != c)
            mm->be[k++] = mm->be[i];
    mm->n_be = k;
}

#ifdef MINFER_HAVE_CUDA
typedef struct {
    minfer_progress_fn fn;
    void *user;
} upload_progress;

static void on_upload(void *user, uint64_t done, uint64_t total) {
    upload_progress *u = user;
    if (u->fn)
        u->fn(u->user, total ? (float)((double)done / (double)total) : 1.0f, "uploading");
}
#endif

/* Makes the GPU backend the list asks for, uploading every weight once. With
 * device "auto" a GPU that cannot be used is not an error: the model runs on
 * the CPU (the reason is logged at info level); an explicit request fails. */
static int make_gpu(minfer_model *mm, const minfer_model_options *o, bool required, mf_error *err) {
    bool want = false;
    for (int i = 0; i < mm->n_be; i++)
        want |= mm->be[i] == MF_BE_CUDA;
    if (!want)
        return 0;
#ifdef MINFER_HAVE_CUDA
    upload_progress u = {o->progress, o->progress_user};
    mf_error e = {{0}};
    if (mf_backend_cuda_new_progress(mm->m->weights, on_upload, &u, &mm->gpu, &e) == 0)
        return 0;
    mm->gpu = NULL;
    if (required)
        return mf_errorf(err, "model: %s", e.msg);
    mf_log(MF_LOG_INFO, "cuda not used: %s", e.msg);
#else
    (void)o;
    if (required)
        return mf_errorf(err, "model: device 'cuda' is not available in this build (configure "
                              "with -DMINFER_CUDA=ON)");
#endif
    drop_backend(mm, MF_BE_CUDA);
    return 0;
}

/* Resolves device / n_gpu_layers / backends into the priority list. "auto"
 * puts cuda first when this build has it (make_gpu drops it again when no
 * device can be used); "cpu", -ngl 0 and MINFER_DISABLE_CUDA=1 leave it out.
 * *gpu_required is set when the user asked for the GPU explicitly. */
static int choose_backends(minfer_model *mm, const minfer_model_options *o, bool *gpu_required,
                           mf_error *err) {
    const char *dev = o->device && *o->device ? o->device : "auto";
    if (strcmp(dev, "auto") && strcmp(dev, "cpu") && strcmp(dev, "cuda"))
        return mf_errorf(err, "model: unknown device '%s' (cpu, cuda, auto)", dev);
    if (o->n_gpu_layers != -1 && o->n_gpu_layers != 0)
        return mf_errorf(err,
                         "model: n_gpu_layers %d is not supported (-1: all layers, 0: none; the "
                         "GPU takes the whole model or nothing)",
                         o->n_gpu_layers);
    if (!strcmp(dev, "cuda") && o->n_gpu_layers == 0)
        return mf_errorf(err, "model: device 'cuda' with 0 GPU layers is a contradiction");
    const char *list = o->backends;
    const char *source = "backends";
    if (!list || !*list) {
        list = mf_env_str("MINFER_BACKENDS", NULL);
        source = "MINFER_BACKENDS";
    }
    bool from_list = list && *list;
    if (!from_list) {
        bool cuda = !strcmp(dev, "cuda") ||
                    (!strcmp(dev, "auto") && o->n_gpu_layers != 0 && !mf_env_flag("MINFER_DISABLE_CUDA"));
#ifndef MINFER_HAVE_CUDA
        cuda = cuda && !strcmp(dev, "cuda"); /* auto: nothing to try in this build */
#endif
        list = cuda ? "cuda,cpu" : "cpu";
        source = "device";
    }
    if (parse_backends(mm, list, source, err))
        return -1;
    *gpu_required = !strcmp(dev, "cuda") || (from_list && strstr(list, "cuda"));
    if (!strcmp(dev, "cpu") || o->n_gpu_layers == 0)
        drop_backend(mm, MF_BE_CUDA);
    return 0;
}

/* Far more threads than cores only adds switching (4096 on 2 cores: tens of
 * seconds a token); allowed, but said once per process. */
static void warn_threads(int32_t n_threads) {
    static bool warned;
    const int cores = mf_cpu_count();
    if (warned || cores <= 0 || n_threads <= 4 * cores)
        return;
    warned = true;
    mf_log(MF_LOG_WARN, "%d threads on %d cores (more than 4x) will run slowly", n_threads, cores);
}

minfer_model *minfer_model_load(const minfer_model_options *o, char *err, size_t errlen) {
    mf_error e = {{0}};
    minfer_model_options def;
    if (!o) {
        minfer_model_options_default(&def);
        o = &def;
    }
    if (!o->path || !*o->path) {
        mf_errorf(&e, "model: no model path given");
        set_err(err, errlen, &e);
        return NULL;
    }
    minfer_model *mm = mf_calloc(1, sizeof *mm);
    mm->n_threads = o->n_threads > 0 ? o->n_threads : mf_cpu_count();
    warn_threads(mm->n_threads);
    bool gpu_required = false;
    if (choose_backends(mm, o, &gpu_required, &e) ||
        mf_model_load(o->path, o->progress, o->progress_user, &mm->m, &e) ||
        make_gpu(mm, o, gpu_required, &e))
        goto fail;
    name_backends(mm);
    if (mf_tokenizer_from_gguf(mm->m->gguf, &mm->tok, &e))
        goto fail;
    if (mf_tokenizer_n_vocab(mm->tok) > mm->m->hp.n_vocab) {
        /* A tokenizer id past the embedding would index outside token_embd. */
        mf_errorf(&e, "model: tokenizer has %d tokens but token_embd.weight has %d rows",
                  mf_tokenizer_n_vocab(mm->tok), mm->m->hp.n_vocab);
        goto fail;
    }
    mf_chat_template_detect(mm->m->gguf, mm->tok, &mm->tmpl);
    if (mf_rt_chat_init(mm, o->chat_template && *o->chat_template, &e))
        goto fail;
    return mm;
fail:
    set_err(err, errlen, &e);
    minfer_model_free(mm);
    return NULL;
}

void minfer_model_free(minfer_model *m) {
    if (!m)
        return;
    mf_rt_chat_free(m);
    mf_backend_free(m->gpu);
    mf_tokenizer_free(m->tok);
    mf_model_free(m->m);
    free(m);
}

int32_t minfer_model_n_vocab(const minfer_model *m) { return m->m->hp.n_vocab; }
int32_t minfer_model_n_ctx_train(const minfer_model *m) { return m->m->hp.n_ctx_train; }
int32_t minfer_model_n_layers(const minfer_model *m) { return m->m->hp.n_layer; }
int64_t minfer_model_n_params(const minfer_model *m) { return m->m->n_params; }
uint64_t minfer_model_size(const minfer_model *m) { return m->m->weight_bytes; }
const char *minfer_model_arch(const minfer_model *m) { return mf_arch_name(m->m->arch); }
const char *minfer_model_desc(const minfer_model *m) { return m->m->desc; }
const char *minfer_model_backend(const minfer_model *m) { return m->backend_name; }

const char *minfer_model_device_desc(const minfer_model *m) {
#ifdef MINFER_HAVE_CUDA
    if (m->gpu)
        return mf_cuda_device_desc(m->gpu);
#endif
    (void)m;
    return "";
}

void minfer_log_set_level(minfer_log_level level) {
    _Static_assert((int)MINFER_LOG_ERROR == (int)MF_LOG_ERROR, "log levels line up");
    mf_log_set_level((mf_log_level)level);
}

/* ---- tokens ------------------------------------------------------------------------ */

int64_t minfer_tokenize(const minfer_model *m, const char *text, size_t len, bool add_special,
                        bool parse_special, int32_t *out, int64_t cap) {
    mf_error e;
    return mf_tokenize(m->tok, text, len, add_special, parse_special, out, cap, &e);
}

int32_t minfer_token_to_piece(const minfer_model *m, int32_t token, char *buf, size_t cap) {
    return mf_token_to_piece(m->tok, token, false, buf, cap);
}

bool minfer_token_is_eog(const minfer_model *m, int32_t token) {
    return mf_token_is_eog(m->tok, token);
}

int32_t minfer_token_bos(const minfer_model *m) { return mf_token_bos(m->tok); }
int32_t minfer_token_eos(const minfer_model *m) { return mf_token_eos(m->tok); }
