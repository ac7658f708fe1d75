/* api_model.c - the public model handle: GGUF model + tokenizer + chat
 * template + the backend choice, and the token/chat helpers of minfer.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/levers.h"
#include "runtime/runtime.h"

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

/* Parses a backend list ("ref,cpu") against the registry. A backend that
 * runs every op (cpu) must be in it, so a graph always has a home. */
static int parse_backends(minfer_model *mm, const char *list, const char *source, mf_error *err) {
    mm->n_be = 0;
    bool home = false;
    const char *p = list;
    while (*p) {
        const char *e = strchr(p, ',');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        const mf_backend_entry *be = mf_registry_find(p, n);
        if (!be)
            return mf_errorf(err, "%s '%s': unknown backend '%.*s' (this build: %s)", source, list, (int)n,
                             p, mf_registry_names());
        for (int i = 0; i < mm->n_be; i++)
            if (mm->be[i] == be)
                return mf_errorf(err, "%s '%s': backend '%.*s' listed twice", source, list, (int)n, p);
        if (mm->n_be == MF_RT_MAX_BACKENDS)
            return mf_errorf(err, "%s '%s': too many backends", source, list);
        mm->be[mm->n_be++] = be;
        home |= be->runs_every_op;
        p += n;
        if (*p == ',')
            p++;
    }
    if (!home) {
        for (int i = 0; i < mf_registry_count(); i++)
            if (mf_registry_at(i)->runs_every_op)
                return mf_errorf(err, "%s '%s': the %s backend must be in the list", source, list,
                                 mf_registry_at(i)->name);
        return mf_errorf(err, "%s '%s': no backend of the list runs every op", source, list);
    }
    return 0;
}

static void name_backends(minfer_model *mm) {
    mm->backend_name[0] = 0;
    for (int i = 0; i < mm->n_be; i++) {
        size_t l = strlen(mm->backend_name);
        snprintf(mm->backend_name + l, sizeof mm->backend_name - l, "%s%s", i ? "," : "", mm->be[i]->name);
    }
}

static void drop_backend(minfer_model *mm, int i) {
    for (int k = i; k + 1 < mm->n_be; k++) {
        mm->be[k] = mm->be[k + 1];
        mm->made[k] = mm->made[k + 1];
    }
    mm->n_be--;
}

typedef struct {
    minfer_progress_fn fn;
    void *user;
} upload_progress;

static void on_upload(void *user, uint64_t done, uint64_t total) {
    upload_progress *u = user;
    if (u->fn)
        u->fn(u->user, total ? (float)((double)done / (double)total) : 1.0f, "uploading");
}

/* The options of entry be: the model's, plus the levers its registry line
 * names (device index, tuning string). */
static mf_backend_options options_for(const minfer_model *mm, const mf_backend_entry *be) {
    mf_backend_options o = mm->bo;
    if (be->device_lever)
        o.device = (int32_t)mf_lever_int(be->device_lever);
    if (be->tune_lever)
        o.tune = mf_lever_str(be->tune_lever);
    return o;
}

/* Makes the GPU backends of the list, uploading every weight once. With
 * device "auto" a GPU that cannot be used is not an error: the model runs on
 * the next one or the CPU (the reason is logged at info level); an explicit
 * request fails. */
static int make_gpus(minfer_model *mm, const minfer_model_options *o, bool required, mf_error *err) {
    for (int i = 0; i < mm->n_be; i++) {
        const mf_backend_entry *be = mm->be[i];
        if (!be->is_gpu)
            continue;
        upload_progress u = {o->progress, o->progress_user};
        mf_backend_options bo = options_for(mm, be);
        bo.progress = on_upload;
        bo.progress_user = &u;
        mf_error e = {{0}};
        int rc = -1;
        if (be->disable_lever && mf_lever_flag(be->disable_lever))
            mf_errorf(&e, "%s: disabled by %s", be->name, be->disable_lever);
        else
            rc = be->create(mm->m->weights, &bo, &mm->made[i], &e);
        if (rc == 0)
            continue;
        mm->made[i] = NULL;
        if (required)
            return mf_errorf(err, "model: %s", e.msg);
        mf_log(MF_LOG_INFO, "%s not used: %s", be->name, e.msg);
        drop_backend(mm, i--);
    }
    return 0;
}

/* The default list for a device: "auto" is every backend of priority >= 0
 * in priority order, less the GPUs a disable lever turns off (make_gpus then
 * drops those it cannot start); a named device is that backend, followed by
 * a backend that runs every op when it does not itself. */
static void default_list(const char *dev, bool no_gpu, char *buf, size_t cap) {
    buf[0] = 0;
    const mf_backend_entry *named = strcmp(dev, "auto") ? mf_registry_find(dev, strlen(dev)) : NULL;
    for (int i = 0; i < mf_registry_count(); i++) {
        const mf_backend_entry *be = mf_registry_at(i);
        bool take;
        if (named)
            take = be == named || (!named->runs_every_op && be->runs_every_op && be->priority >= 0);
        else
            take = be->priority >= 0 && !(be->is_gpu && (no_gpu || (be->disable_lever &&
                                                                    mf_lever_flag(be->disable_lever))));
        if (!take)
            continue;
        size_t l = strlen(buf);
        snprintf(buf + l, cap - l, "%s%s", l ? "," : "", be->name);
        if (named && be->runs_every_op)
            break;
    }
}

/* Resolves device / n_gpu_layers / backends into the priority list. A
 * device (or list) naming a GPU backend makes its failure an error (the
 * user asked for it); "auto" falls back. -ngl 0 leaves every GPU out. */
static int choose_backends(minfer_model *mm, const minfer_model_options *o, bool *gpu_required,
                           mf_error *err) {
    const char *dev = o->device && *o->device ? o->device : "auto";
    const mf_backend_entry *named = mf_registry_find(dev, strlen(dev));
    if (strcmp(dev, "auto") && !named)
        return mf_errorf(err, "model: unknown device '%s' (this build: %s; or auto)", dev, mf_registry_names());
    if (o->n_gpu_layers < -1)
        return mf_errorf(err, "model: n_gpu_layers %d is not valid (-1 or N >= layers: all, 0: "
                              "none)", o->n_gpu_layers);
    if (named && named->is_gpu && o->n_gpu_layers == 0)
        return mf_errorf(err, "model: device '%s' with 0 GPU layers is a contradiction", dev);
    const char *list = o->backends;
    const char *source = "backends";
    if (!list || !*list) {
        list = mf_lever_str("MINFER_BACKENDS");
        source = "MINFER_BACKENDS";
    }
    bool from_list = list && *list;
    char def[128];
    if (!from_list) {
        default_list(dev, o->n_gpu_layers == 0, def, sizeof def);
        list = def;
        source = "device";
    }
    if (parse_backends(mm, list, source, err))
        return -1;
    mf_log(MF_LOG_DEBUG, "model: backend list '%s' (from %s; device %s, n_gpu_layers %d)", list,
           source, dev, o->n_gpu_layers);
    *gpu_required = named && named->is_gpu;
    for (int i = 0; i < mm->n_be; i++)
        if (from_list && mm->be[i]->is_gpu)
            *gpu_required = true;
    for (int i = 0; i < mm->n_be; i++)
        if (mm->be[i]->is_gpu && ((named && !named->is_gpu) || o->n_gpu_layers == 0))
            drop_backend(mm, i--);
    return 0;
}

/* llama.cpp's -ngl counts layers; N at or above the model's layer count (the
 * usual -ngl 99) means the whole model. The design keeps GPU participation
 * all-or-nothing, so a count that would split the layers is refused. */
static int check_gpu_layers(const minfer_model *mm, const minfer_model_options *o,
                            mf_error *err) {
    int32_t nl = mm->m->hp.n_layer;
    if (o->n_gpu_layers > 0 && o->n_gpu_layers < nl)
        return mf_errorf(err,
                         "model: n_gpu_layers %d of %d layers is a partial offload, which is "
                         "not supported (the GPU takes the whole model or nothing: -1 or >= %d "
                         "for all, 0 for none)",
                         o->n_gpu_layers, nl, nl);
    return 0;
}

/* llama.cpp warns when -ngl asks for GPU layers that no GPU takes; so do
 * we (the model still runs, on what the build and machine have). */
static void warn_no_gpu(const minfer_model *mm, const minfer_model_options *o) {
    if (o->n_gpu_layers <= 0)
        return;
    for (int i = 0; i < mm->n_be; i++)
        if (mm->be[i]->is_gpu)
            return;
    mf_log(MF_LOG_WARN, "-ngl %d asks for the GPU, but no GPU backend is in use (this build: %s); "
           "running on %s", o->n_gpu_layers, mf_registry_names(), mm->backend_name);
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
    mf_levers_init();
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
    mf_levers_backend_options(&mm->bo);
    mm->bo.n_threads = mm->n_threads;
    mf_gguf_open_options open = {.read = mf_lever_flag("MINFER_NO_MMAP"),
                                 .lock = mf_lever_flag("MINFER_MLOCK")};
    if (choose_backends(mm, o, &gpu_required, &e) ||
        mf_model_load(o->path, &open, o->progress, o->progress_user, &mm->m, &e) ||
        check_gpu_layers(mm, o, &e) || make_gpus(mm, o, gpu_required, &e))
        goto fail;
    name_backends(mm);
    warn_no_gpu(mm, o);
    mf_log(MF_LOG_DEBUG, "model: %s, %d layers, %lld parameters, %llu weight bytes, backends %s",
           mm->m->desc, mm->m->hp.n_layer, (long long)mm->m->n_params,
           (unsigned long long)mm->m->weight_bytes, mm->backend_name);
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
    for (int i = 0; i < m->n_be; i++)
        mf_backend_free(m->made[i]);
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
    for (int i = 0; i < m->n_be; i++)
        if (m->made[i] && m->made[i]->ops->describe)
            return m->made[i]->ops->describe(m->made[i]);
    return "";
}

const char *minfer_build_devices(void) {
    return mf_registry_names();
}

bool minfer_build_has_device(const char *name) {
    return name && mf_registry_find(name, strlen(name)) != NULL;
}

#ifndef MINFER_BUILD_COMMIT
#define MINFER_BUILD_COMMIT "unknown"
#endif

const char *minfer_build_commit(void) {
    return MINFER_BUILD_COMMIT;
}

void minfer_log_set_level(minfer_log_level level) {
    _Static_assert((int)MINFER_LOG_ERROR == (int)MF_LOG_ERROR, "log levels line up");
    mf_levers_init();
    mf_log_set_level((mf_log_level)level);
}

minfer_log_level minfer_log_get_level(void) {
    mf_levers_init();
    return (minfer_log_level)mf_log_get_level();
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
