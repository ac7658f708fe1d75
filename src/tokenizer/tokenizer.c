/* tokenizer.c - vocab tables, pre-tokenizers, byte-level BPE, SentencePiece
 * BPE, special-token partition, token pieces and the streaming detokenizer.
 *
 * Text flows: special-token partition -> (gpt2) pre-tokenizer stages split
 * the raw fragments into pieces -> each piece is BPE-merged on its bytes ->
 * ids. The pre-tokenizer regexes are hand-written matchers over code points;
 * each returns the length of the regex's match at a position (0: none), and
 * a stage turns matches and the gaps between them into pieces, exactly like
 * a regex "split, isolated" pass. */
#include "tokenizer/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ==== pre-tokenizer kinds ================================================== */

typedef enum {
    PRE_GPT2,     /* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
    PRE_LLAMA3,   /* (?i:'s|..)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|... */
    PRE_QWEN2,    /* the llama3 regex with \p{N} single digits */
    PRE_SMOLLM,   /* \p{N} isolated, then the gpt2 regex */
    PRE_DEEPSEEK, /* deepseek-llm: six regexes applied in turn */
    PRE_NONE,     /* spm: no pre-tokenizer */
} pre_kind;

static const struct {
    const char *name;
    pre_kind kind;
} pre_names[] = {
    {"default", PRE_GPT2}, {"gpt2", PRE_GPT2}, {"gpt-2", PRE_GPT2}, {"mpt", PRE_GPT2},
    {"olmo", PRE_GPT2}, {"llama3", PRE_LLAMA3}, {"llama-v3", PRE_LLAMA3},
    {"llama-bpe", PRE_LLAMA3}, {"smaug-bpe", PRE_LLAMA3}, {"dbrx", PRE_LLAMA3},
    {"qwen2", PRE_QWEN2}, {"stablelm2", PRE_QWEN2}, {"smollm", PRE_SMOLLM},
    {"starcoder", PRE_SMOLLM}, {"refact", PRE_SMOLLM}, {"command-r", PRE_SMOLLM},
    {"codeshell", PRE_SMOLLM}, {"deepseek-llm", PRE_DEEPSEEK},
};

static const char *pre_canonical[] = {
    [PRE_GPT2] = "gpt2", [PRE_LLAMA3] = "llama3", [PRE_QWEN2] = "qwen2",
    [PRE_SMOLLM] = "smollm", [PRE_DEEPSEEK] = "deepseek-llm", [PRE_NONE] = "spm",
};

/* ==== the tokenizer ======================================================== */

typedef struct merge_slot {
    uint64_t key;   /* (left id << 32) | right id */
    int32_t rank;   /* -1: empty slot */
    int32_t result; /* id of left+right */
} merge_slot;

struct mf_tokenizer {
    mf_tokenizer_model model;
    pre_kind pre;
    int32_t n;
    char *arena;      /* all token texts, each NUL-terminated */
    uint32_t *off;    /* [n] offset into arena */
    uint32_t *len;    /* [n] byte length */
    uint8_t *type;    /* [n] mf_token_type */
    float *score;     /* [n] */
    uint8_t *eog;     /* [n] 1 when the token ends generation */
    int32_t *htab;    /* text -> id, open addressing, -1 empty */
    uint64_t hmask;
    merge_slot *mtab; /* (left, right) -> rank, result */
    uint64_t mmask;
    int32_t byte_tok[256]; /* gpt2: token of a byte's mapped char; spm: <0xNN> */
    int32_t bos, eos, eot, pad, unk;
    bool add_bos, add_eos, add_space_prefix, ignore_merges;
    int32_t *special;        /* control + user-defined ids, by first byte then length desc */
    int32_t n_special;
    int32_t sp_first[257];   /* special[sp_first[b] .. sp_first[b+1]) start with byte b */
};

/* ==== hashing ================================================================ */

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++) {
        h ^= (uint8_t)s[i];
        h *= 1099511628211ull;
    }
    return h ^ (h >> 29);
}

static uint64_t hash_u64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

static uint64_t pow2_at_least(uint64_t n) {
    uint64_t c = 16;
    while (c < n)
        c <<= 1;
    return c;
}

int32_t mf_token_lookup(const mf_tokenizer *t, const char *text, size_t len) {
    for (uint64_t h = hash_bytes(text, len) & t->hmask;; h = (h + 1) & t->hmask) {
        int32_t id = t->htab[h];
        if (id < 0)
            return -1;
        if (t->len[id] == len && !memcmp(t->arena + t->off[id], text, len))
            return id;
    }
}

static const merge_slot *merge_find(const mf_tokenizer *t, int32_t a, int32_t b) {
    if (!t->mtab || a < 0 || b < 0)
        return NULL;
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    for (uint64_t h = hash_u64(key) & t->mmask;; h = (h + 1) & t->mmask) {
        const merge_slot *s = &t->mtab[h];
        if (s->rank < 0)
            return NULL;
        if (s->key == key)
            return s;
    }
}

/* ==== unicode ================================================================ */

uint32_t mf_unicode_flags(uint32_t cp) {
    uint32_t lo = 0, hi = mf_unicode_n_ranges;
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        if (cp < mf_unicode_ranges[mid].lo)
            hi = mid;
        else if (cp > mf_unicode_ranges[mid].hi)
            lo = mid + 1;
        else
            return mf_unicode_ranges[mid].flags;
    }
    return 0;
}

static bool in_ranges(const mf_unicode_range *r, uint32_t n, uint32_t cp) {
    uint32_t lo = 0, hi = n;
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        if (cp < r[mid].lo)
            hi = mid;
        else if (cp > r[mid].hi)
            lo = mid + 1;
        else
            return true;
    }
    return false;
}

/* A code unit that is not valid UTF-8: no category, never equal to a real
 * code point. */
#define CP_INVALID 0xFFFFFFFFu

/* Decodes one UTF-8 sequence at s[0..n). Returns its length (1..4) and the
 * code point, or length 1 and CP_INVALID for a byte that does not start a
 * well-formed sequence (overlong, surrogate, > U+10FFFF, truncated). */
static size_t utf8_decode(const uint8_t *s, size_t n, uint32_t *cp) {
    uint8_t c = s[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    size_t need;
    uint32_t v, min;
    if (c >= 0xC2 && c <= 0xDF) {
        need = 2, v = c & 0x1F, min = 0x80;
    } else if (c >= 0xE0 && c <= 0xEF) {
        need = 3, v = c & 0x0F, min = 0x800;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 4, v = c & 0x07, min = 0x10000;
    } else {
        *cp = CP_INVALID;
        return 1;
    }
    if (n < need) {
        *cp = CP_INVALID;
        return 1;
    }
    for (size_t i = 1; i < need; i++) {
        if ((s[i] & 0xC0) != 0x80) {
            *cp = CP_INVALID;
            return 1;
        }
        v = (v << 6) | (s[i] & 0x3F);
    }
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) {
        *cp = CP_INVALID;
        return 1;
    }
    *cp = v;
    return need;
}

static size_t utf8_encode(uint32_t cp, char *out) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* GPT-2 byte-level alphabet: printable Latin-1 bytes stand for themselves,
 * the other 68 bytes map in order to U+0100.. so every byte is a visible
 * character (space becomes 'Ġ' U+0120, newline 'Ċ' U+010A). */
static uint32_t byte_to_cp(uint8_t b) {
    if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174)
        return b;
    /* the unmapped bytes in order: 0..32, 127..160, 173 */
    if (b <= 32)
        return 256u + b;
    if (b <= 160)
        return 256u + 33u + (b - 127u);
    return 256u + 67u; /* 173 */
}

/* Inverse of byte_to_cp: the byte, or -1 for a code point outside the map. */
static int cp_to_byte(uint32_t cp) {
    if ((cp >= 33 && cp <= 126) || (cp >= 161 && cp <= 172) || (cp >= 174 && cp <= 255))
        return (int)cp;
    if (cp < 256 || cp > 256 + 67)
        return -1;
    uint32_t k = cp - 256;
    return k <= 32 ? (int)k : k <= 66 ? (int)(127 + (k - 33)) : 173;
}

size_t mf_gpt2_byte_symbol(uint8_t b, char out[3]) {
    size_t l = utf8_encode(byte_to_cp(b), out);
    out[l] = '\0';
    return l;
}

/* ==== construction ========================================================== */

void mf_tokenizer_spec_init(mf_tokenizer_spec *spec, mf_tokenizer_model model) {
    memset(spec, 0, sizeof *spec);
    spec->model = model;
    spec->bos = spec->eos = spec->eot = spec->pad = spec->unk = -1;
    spec->add_bos = model == MF_TOKENIZER_SPM;
    spec->add_space_prefix = true;
}

static const char *const eog_texts[] = {
    "<|im_end|>", "<|eot_id|>", "<|endoftext|>", "<|end|>", "<end_of_turn>", "<|eom_id|>",
    "<|end_of_text|>", "</s>", "<EOT>", "_<EOT>", "<|return|>", "<|call|>",
    "<\uff5cend\u2581of\u2581sentence\uff5c>",
};
/* Searched in this order when no eot id is given. */
static const char *const eot_texts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<EOT>", "_<EOT>",
};

typedef struct special_key {
    uint32_t first; /* first byte */
    uint32_t len;
    int32_t id;
} special_key;

/* By first byte, then longest first, so the first hit at a position is the
 * longest match. */
static int cmp_special(const void *a, const void *b) {
    const special_key *x = a, *y = b;
    if (x->first != y->first)
        return x->first < y->first ? -1 : 1;
    if (x->len != y->len)
        return x->len > y->len ? -1 : 1;
    return x->id < y->id ? -1 : (x->id > y->id);
}

static int check_id(const char *what, int32_t id, int32_t n, mf_error *err) {
    if (id < -1 || id >= n)
        return mf_errorf(err, "tokenizer: %s id %d out of range (vocab %d)", what, id, n);
    return 0;
}

/* Builds the string hash, the merge table, the byte tokens, the special
 * list and the eog flags. The arrays of spec are copied. */
int mf_tokenizer_new(const mf_tokenizer_spec *spec, mf_tokenizer **out, mf_error *err) {
    *out = NULL;
    if (spec->n_tokens <= 0 || !spec->tokens)
        return mf_errorf(err, "tokenizer: empty vocab (%d tokens)", spec->n_tokens);
    pre_kind pre = PRE_NONE;
    if (spec->model == MF_TOKENIZER_GPT2) {
        const char *name = spec->pre ? spec->pre : "default";
        size_t i;
        for (i = 0; i < sizeof pre_names / sizeof pre_names[0]; i++)
            if (!strcmp(name, pre_names[i].name))
                break;
        if (i == sizeof pre_names / sizeof pre_names[0])
            return mf_errorf(err, "tokenizer: unknown pre-tokenizer '%s'", MF_ESC(name));
        pre = pre_names[i].kind;
    } else if (spec->model != MF_TOKENIZER_SPM) {
        return mf_errorf(err, "tokenizer: unknown model %d", (int)spec->model);
    }
    int32_t n = spec->n_tokens;
    if (check_id("bos", spec->bos, n, err) || check_id("eos", spec->eos, n, err) ||
        check_id("eot", spec->eot, n, err) || check_id("pad", spec->pad, n, err) ||
        check_id("unknown", spec->unk, n, err))
        return -1;

    mf_tokenizer *t = mf_calloc(1, sizeof *t);
    t->model = spec->model;
    t->pre = pre;
    t->n = n;
    t->bos = spec->bos, t->eos = spec->eos, t->eot = spec->eot, t->pad = spec->pad;
    t->unk = spec->unk;
    t->add_bos = spec->add_bos, t->add_eos = spec->add_eos;
    t->add_space_prefix = spec->add_space_prefix;
    t->ignore_merges = pre == PRE_LLAMA3; /* llama3's tokenizer.json sets ignore_merges */

    uint64_t total = 0;
    for (int32_t i = 0; i < n; i++) {
        size_t l = spec->token_lens ? spec->token_lens[i]
                                    : (spec->tokens[i] ? strlen(spec->tokens[i]) : 0);
        total += l + 1;
    }
    if (total > UINT32_MAX) {
        mf_tokenizer_free(t);
        return mf_errorf(err, "tokenizer: token texts total %llu bytes (limit 4 GiB)",
                         (unsigned long long)total);
    }
    t->arena = mf_malloc(total ? total : 1);
    t->off = mf_malloc(sizeof *t->off * (size_t)n);
    t->len = mf_malloc(sizeof *t->len * (size_t)n);
    t->type = mf_malloc((size_t)n);
    t->score = mf_malloc(sizeof *t->score * (size_t)n);
    t->eog = mf_calloc((size_t)n, 1);
    uint64_t pos = 0;
    for (int32_t i = 0; i < n; i++) {
        size_t l = spec->token_lens ? spec->token_lens[i]
                                    : (spec->tokens[i] ? strlen(spec->tokens[i]) : 0);
        if (l)
            memcpy(t->arena + pos, spec->tokens[i], l);
        t->arena[pos + l] = 0;
        t->off[i] = (uint32_t)pos;
        t->len[i] = (uint32_t)l;
        int32_t ty = spec->types ? spec->types[i] : MF_TOKEN_NORMAL;
        t->type[i] = (uint8_t)((ty >= 0 && ty <= MF_TOKEN_BYTE) ? ty : MF_TOKEN_UNDEFINED);
        t->score[i] = spec->scores ? spec->scores[i] : 0.0f;
        pos += l + 1;
    }

    /* text -> id; on duplicate texts the lowest id wins (the first inserted) */
    uint64_t cap = pow2_at_least((uint64_t)n * 2);
    t->htab = mf_malloc(sizeof *t->htab * cap);
    memset(t->htab, 0xFF, sizeof *t->htab * cap);
    t->hmask = cap - 1;
    for (int32_t i = 0; i < n; i++) {
        const char *s = t->arena + t->off[i];
        uint64_t h = hash_bytes(s, t->len[i]) & t->hmask;
        for (;; h = (h + 1) & t->hmask) {
            int32_t id = t->htab[h];
            if (id < 0) {
                t->htab[h] = i;
                break;
            }
            if (t->len[id] == t->len[i] && !memcmp(t->arena + t->off[id], s, t->len[i]))
                break;
        }
    }

    /* merges: "left right" -> rank */
    if (spec->n_merges > 0 && spec->merges) {
        if (spec->n_merges > INT32_MAX) {
            mf_tokenizer_free(t);
            return mf_errorf(err, "tokenizer: %lld merges (limit %d)",
                             (long long)spec->n_merges, INT32_MAX);
        }
        uint64_t mcap = pow2_at_least((uint64_t)spec->n_merges * 2);
        t->mtab = mf_malloc(sizeof *t->mtab * mcap);
        for (uint64_t i = 0; i < mcap; i++)
            t->mtab[i].rank = -1;
        t->mmask = mcap - 1;
        char stackbuf[512];
        int64_t skipped = 0;
        for (int64_t r = 0; r < spec->n_merges; r++) {
            const char *m = spec->merges[r] ? spec->merges[r] : "";
            size_t ml = spec->merge_lens ? spec->merge_lens[r] : strlen(m);
            const char *sp = ml > 1 ? memchr(m + 1, ' ', ml - 1) : NULL;
            if (!sp) {
                mf_tokenizer_free(t);
                return mf_errorf(err, "tokenizer: merge %lld '%s' has no space", (long long)r,
                                 MF_ESCN(m, ml > 64 ? 64 : ml));
            }
            size_t la = (size_t)(sp - m), lb = ml - la - 1;
            int32_t a = mf_token_lookup(t, m, la), b = mf_token_lookup(t, sp + 1, lb);
            char *cat = la + lb <= sizeof stackbuf ? stackbuf : mf_malloc(la + lb);
            memcpy(cat, m, la);
            memcpy(cat + la, sp + 1, lb);
            int32_t c = mf_token_lookup(t, cat, la + lb);
            if (cat != stackbuf)
                free(cat);
            if (a < 0 || b < 0 || c < 0) {
                skipped++;
                continue;
            }
            uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
            for (uint64_t h = hash_u64(key) & t->mmask;; h = (h + 1) & t->mmask) {
                merge_slot *s = &t->mtab[h];
                if (s->rank < 0) {
                    s->key = key, s->rank = (int32_t)r, s->result = c;
                    break;
                }
                if (s->key == key)
                    break; /* a repeated merge keeps its first (best) rank */
            }
        }
        if (skipped)
            mf_log(MF_LOG_DEBUG, "tokenizer: %lld merges name tokens not in the vocab; skipped",
                   (long long)skipped);
    }

    for (int b = 0; b < 256; b++) {
        char buf[8];
        size_t l;
        if (t->model == MF_TOKENIZER_GPT2)
            l = utf8_encode(byte_to_cp((uint8_t)b), buf);
        else
            l = (size_t)snprintf(buf, sizeof buf, "<0x%02X>", b);
        t->byte_tok[b] = mf_token_lookup(t, buf, l);
    }

    /* tokens matched verbatim in text before BPE */
    special_key *keys = mf_malloc(sizeof *keys * (size_t)n);
    for (int32_t i = 0; i < n; i++)
        if ((t->type[i] == MF_TOKEN_CONTROL || t->type[i] == MF_TOKEN_USER_DEFINED) && t->len[i])
            keys[t->n_special++] = (special_key){(uint8_t)t->arena[t->off[i]], t->len[i], i};
    qsort(keys, (size_t)t->n_special, sizeof *keys, cmp_special);
    t->special = mf_malloc(sizeof *t->special * (size_t)(t->n_special ? t->n_special : 1));
    for (int32_t k = 0; k < t->n_special; k++)
        t->special[k] = keys[k].id;
    free(keys);
    for (int b = 0, k = 0; b <= 256; b++) {
        while (k < t->n_special && (uint8_t)t->arena[t->off[t->special[k]]] < b)
            k++;
        t->sp_first[b] = k;
    }

    if (t->eot < 0)
        for (size_t i = 0; i < sizeof eot_texts / sizeof eot_texts[0] && t->eot < 0; i++)
            t->eot = mf_token_lookup(t, eot_texts[i], strlen(eot_texts[i]));
    if (t->eos >= 0)
        t->eog[t->eos] = 1;
    if (t->eot >= 0)
        t->eog[t->eot] = 1;
    for (size_t i = 0; i < sizeof eog_texts / sizeof eog_texts[0]; i++) {
        int32_t id = mf_token_lookup(t, eog_texts[i], strlen(eog_texts[i]));
        if (id >= 0 && t->type[id] != MF_TOKEN_NORMAL)
            t->eog[id] = 1;
    }
    *out = t;
    return 0;
}

void mf_tokenizer_free(mf_tokenizer *t) {
    if (!t)
        return;
    free(t->arena);
    free(t->off);
    free(t->len);
    free(t->type);
    free(t->score);
    free(t->eog);
    free(t->htab);
    free(t->mtab);
    free(t->special);
    free(t);
}

/* ==== accessors ============================================================= */

int32_t mf_tokenizer_n_vocab(const mf_tokenizer *t) { return t->n; }
mf_tokenizer_model mf_tokenizer_get_model(const mf_tokenizer *t) { return t->model; }
const char *mf_tokenizer_pre_name(const mf_tokenizer *t) { return pre_canonical[t->pre]; }
int32_t mf_token_bos(const mf_tokenizer *t) { return t->bos; }
int32_t mf_token_eos(const mf_tokenizer *t) { return t->eos; }
int32_t mf_token_eot(const mf_tokenizer *t) { return t->eot; }
int32_t mf_token_pad(const mf_tokenizer *t) { return t->pad; }
int32_t mf_token_unk(const mf_tokenizer *t) { return t->unk; }
bool mf_tokenizer_add_bos(const mf_tokenizer *t) { return t->add_bos; }

const char *mf_token_text(const mf_tokenizer *t, int32_t id) {
    return (id >= 0 && id < t->n) ? t->arena + t->off[id] : "";
}

mf_token_type mf_token_get_type(const mf_tokenizer *t, int32_t id) {
    return (id >= 0 && id < t->n) ? (mf_token_type)t->type[id] : MF_TOKEN_UNDEFINED;
}

bool mf_token_is_eog(const mf_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n && t->eog[id];
}

/* ==== work buffers of one mf_tokenize call ==================================== */

typedef struct heap_ent {
    double key;      /* gpt2: rank; spm: -score (smaller pops first); exact for both */
    uint32_t left;   /* symbol index: ties pop the leftmost */
    uint32_t right;
    int32_t a, b;    /* gpt2: the ids of the pair when pushed; spm: merged byte length in a */
} heap_ent;

typedef struct sym {
    int32_t id;      /* gpt2 */
    uint32_t start;  /* spm: byte offset in the fragment text */
    uint32_t len;    /* spm: byte length; 0 once merged away */
    int32_t prev, next;
} sym;

typedef struct work {
    const mf_tokenizer *t;
    int32_t *out;
    int64_t cap, n;
    /* code points of the current fragment */
    const uint8_t *text;
    uint32_t *cp;
    uint32_t *off;   /* [n_cp + 1] byte offset of each code point */
    size_t n_cp;
    /* BPE scratch, grown as needed */
    sym *syms;
    size_t syms_cap;
    heap_ent *heap;
    size_t heap_n, heap_cap;
    char *scratch;
    size_t scratch_cap;
    int bad_byte;    /* first byte with no token and no unk to stand for it; -1 none */
} work;

static void emit(work *w, int32_t id) {
    if (w->n < w->cap)
        w->out[w->n] = id;
    w->n++;
}

/* A byte the vocab cannot spell: the unk token when there is one, else
 * remembered so mf_tokenize fails naming it (never silently dropped). */
static void emit_unknown_byte(work *w, uint8_t b) {
    if (w->t->unk >= 0)
        emit(w, w->t->unk);
    else if (w->bad_byte < 0)
        w->bad_byte = b;
}

static void grow_syms(work *w, size_t n) {
    if (n > w->syms_cap) {
        w->syms_cap = n * 2;
        w->syms = mf_realloc(w->syms, sizeof *w->syms * w->syms_cap);
    }
}

static void grow_scratch(work *w, size_t n) {
    if (n > w->scratch_cap) {
        w->scratch_cap = n * 2;
        w->scratch = mf_realloc(w->scratch, w->scratch_cap);
    }
}

static bool heap_less(const heap_ent *x, const heap_ent *y) {
    return x->key < y->key || (x->key == y->key && x->left < y->left);
}

static void heap_push(work *w, heap_ent e) {
    if (w->heap_n == w->heap_cap) {
        w->heap_cap = w->heap_cap ? w->heap_cap * 2 : 64;
        w->heap = mf_realloc(w->heap, sizeof *w->heap * w->heap_cap);
    }
    size_t i = w->heap_n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!heap_less(&e, &w->heap[p]))
            break;
        w->heap[i] = w->heap[p];
        i = p;
    }
    w->heap[i] = e;
}

static heap_ent heap_pop(work *w) {
    heap_ent top = w->heap[0], last = w->heap[--w->heap_n];
    size_t i = 0, n = w->heap_n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && heap_less(&w->heap[c + 1], &w->heap[c]))
            c++;
        if (!heap_less(&w->heap[c], &last))
            break;
        w->heap[i] = w->heap[c];
        i = c;
    }
    if (n)
        w->heap[i] = last;
    return top;
}

/* ==== byte-level BPE (gpt2) ================================================= */

static void gpt2_push_pair(work *w, uint32_t l) {
    const sym *s = w->syms;
    if (s[l].next < 0)
        return;
    uint32_t r = (uint32_t)s[l].next;
    const merge_slot *m = merge_find(w->t, s[l].id, s[r].id);
    if (m)
        heap_push(w, (heap_ent){(double)m->rank, l, r, s[l].id, s[r].id});
}

/* BPE over the bytes of one piece: start from one symbol per byte, merge the
 * lowest-ranked adjacent pair (leftmost among equals) until none applies. */
static void bpe_gpt2(work *w, const uint8_t *b, size_t m) {
    const mf_tokenizer *t = w->t;
    if (m == 0)
        return;
    if (t->ignore_merges) {
        grow_scratch(w, m * 2);
        size_t l = 0;
        for (size_t i = 0; i < m; i++)
            l += utf8_encode(byte_to_cp(b[i]), w->scratch + l);
        int32_t id = mf_token_lookup(t, w->scratch, l);
        if (id >= 0) {
            emit(w, id);
            return;
        }
    }
    grow_syms(w, m);
    sym *s = w->syms;
    for (size_t i = 0; i < m; i++) {
        s[i].id = t->byte_tok[b[i]];
        s[i].len = 1;
        s[i].prev = (int32_t)i - 1;
        s[i].next = i + 1 < m ? (int32_t)i + 1 : -1;
    }
    w->heap_n = 0;
    for (size_t i = 0; i + 1 < m; i++)
        gpt2_push_pair(w, (uint32_t)i);
    while (w->heap_n) {
        heap_ent e = heap_pop(w);
        uint32_t l = e.left, r = e.right;
        if (!s[l].len || !s[r].len || s[l].next != (int32_t)r || s[l].id != e.a || s[r].id != e.b)
            continue;
        s[l].id = merge_find(t, e.a, e.b)->result;
        s[r].len = 0;
        s[l].next = s[r].next;
        if (s[r].next >= 0)
            s[s[r].next].prev = (int32_t)l;
        if (s[l].prev >= 0)
            gpt2_push_pair(w, (uint32_t)s[l].prev);
        gpt2_push_pair(w, l);
    }
    for (int32_t i = 0; i >= 0; i = s[i].next) {
        if (s[i].id >= 0)
            emit(w, s[i].id);
        else
            emit_unknown_byte(w, b[i]); /* an unmerged symbol is still the byte at i */
    }
}

/* ==== pre-tokenizer matchers ================================================== */

static inline uint32_t cpf(const work *w, size_t i) {
    uint32_t c = w->cp[i];
    if (c < 0x80) {
        /* ASCII fast path */
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
            return MF_UC_LETTER;
        if (c >= '0' && c <= '9')
            return MF_UC_NUMBER;
        if (c == ' ' || (c >= 9 && c <= 13))
            return MF_UC_SPACE;
        return 0;
    }
    return c == CP_INVALID ? 0 : mf_unicode_flags(c);
}

#define IS_L(i) (cpf(w, (i)) & MF_UC_LETTER)
#define IS_N(i) (cpf(w, (i)) & MF_UC_NUMBER)
#define IS_S(i) (cpf(w, (i)) & MF_UC_SPACE)
#define IS_OTHER(i) (!(cpf(w, (i)) & (MF_UC_LETTER | MF_UC_NUMBER | MF_UC_SPACE)))

static uint32_t lower_ascii(uint32_t c) { return (c >= 'A' && c <= 'Z') ? c + 32 : c; }

/* 's 't 're 've 'm 'll 'd at i; case-insensitive for llama3/qwen2. */
static size_t m_contraction(const work *w, size_t i, size_t e, bool icase) {
    if (w->cp[i] != '\'' || i + 1 >= e)
        return 0;
    uint32_t a = w->cp[i + 1], b = i + 2 < e ? w->cp[i + 2] : 0;
    if (icase)
        a = lower_ascii(a), b = lower_ascii(b);
    if (a == 's' || a == 't' || a == 'm' || a == 'd')
        return 2;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l'))
        return 3;
    return 0;
}

/* \s+(?!\S)|\s+ at i (cp[i] is whitespace): the run minus its last char
 * when a non-space follows a run of 2+, else the whole run. */
static size_t m_spaces(const work *w, size_t i, size_t e) {
    size_t k = i;
    while (k < e && IS_S(k))
        k++;
    if (k < e && k - i >= 2)
        return k - i - 1;
    return k - i;
}

/* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
static size_t m_gpt2(const work *w, size_t s, size_t e, size_t i) {
    (void)s;
    size_t n = m_contraction(w, i, e, false);
    if (n)
        return n;
    size_t j = (w->cp[i] == ' ' && i + 1 < e) ? i + 1 : i;
    if (IS_L(j)) {
        size_t k = j + 1;
        while (k < e && IS_L(k))
            k++;
        return k - i;
    }
    if (IS_N(j)) {
        size_t k = j + 1;
        while (k < e && IS_N(k))
            k++;
        return k - i;
    }
    if (IS_OTHER(j)) {
        size_t k = j + 1;
        while (k < e && IS_OTHER(k))
            k++;
        return k - i;
    }
    if (IS_S(i))
        return m_spaces(w, i, e);
    return 1; /* a lone ' ' at the end (j == i): \s+ */
}

/* (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,max_n}
 * | ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+ */
static size_t m_llama3_common(const work *w, size_t e, size_t i, size_t max_n) {
    size_t n = m_contraction(w, i, e, true);
    if (n)
        return n;
    uint32_t c = w->cp[i];
    if (c != '\r' && c != '\n' && !IS_L(i) && !IS_N(i) && i + 1 < e && IS_L(i + 1)) {
        size_t k = i + 2;
        while (k < e && IS_L(k))
            k++;
        return k - i;
    }
    if (IS_L(i)) {
        size_t k = i + 1;
        while (k < e && IS_L(k))
            k++;
        return k - i;
    }
    if (IS_N(i)) {
        size_t k = i + 1;
        while (k < e && k - i < max_n && IS_N(k))
            k++;
        return k - i;
    }
    size_t j = (c == ' ' && i + 1 < e) ? i + 1 : i;
    if (IS_OTHER(j)) {
        size_t k = j + 1;
        while (k < e && IS_OTHER(k))
            k++;
        while (k < e && (w->cp[k] == '\r' || w->cp[k] == '\n'))
            k++;
        return k - i;
    }
    /* whitespace: \s*[\r\n]+ ends at the run's last newline, if any */
    size_t k = i, last_nl = SIZE_MAX;
    while (k < e && IS_S(k)) {
        if (w->cp[k] == '\r' || w->cp[k] == '\n')
            last_nl = k;
        k++;
    }
    if (last_nl != SIZE_MAX)
        return last_nl + 1 - i;
    return m_spaces(w, i, e);
}

static size_t m_llama3(const work *w, size_t s, size_t e, size_t i) {
    (void)s;
    return m_llama3_common(w, e, i, 3);
}

static size_t m_qwen2(const work *w, size_t s, size_t e, size_t i) {
    (void)s;
    return m_llama3_common(w, e, i, 1);
}

/* \p{N} */
static size_t m_digit(const work *w, size_t s, size_t e, size_t i) {
    (void)s, (void)e;
    return IS_N(i) ? 1 : 0;
}

/* deepseek-llm stages */
static size_t m_ds_newline(const work *w, size_t s, size_t e, size_t i) {
    (void)s, (void)e;
    return (w->cp[i] == '\r' || w->cp[i] == '\n') ? 1 : 0;
}

static size_t ds_class_run(const work *w, size_t e, size_t i, const mf_unicode_range *r, uint32_t nr) {
    size_t j = i;
    if (IS_S(i) && i + 1 < e && in_ranges(r, nr, w->cp[i + 1]))
        j = i + 1;
    else if (!in_ranges(r, nr, w->cp[i]))
        return 0;
    while (j < e && in_ranges(r, nr, w->cp[j]))
        j++;
    return j - i;
}

static size_t m_ds_letters(const work *w, size_t s, size_t e, size_t i) {
    (void)s;
    return ds_class_run(w, e, i, mf_unicode_ds_letters, mf_unicode_n_ds_letters);
}

static size_t m_ds_punct(const work *w, size_t s, size_t e, size_t i) {
    (void)s;
    return ds_class_run(w, e, i, mf_unicode_ds_punct, mf_unicode_n_ds_punct);
}

/* \s+$ : only where a whitespace run starts (a run reaching the end matches
 * from its first char), so each run is scanned once. */
static size_t m_ds_trailing(const work *w, size_t s, size_t e, size_t i) {
    if (!IS_S(i) || (i > s && IS_S(i - 1)))
        return 0;
    size_t k = i;
    while (k < e && IS_S(k))
        k++;
    return k == e ? k - i : 0;
}

static size_t m_ds_cjk(const work *w, size_t s, size_t e, size_t i) {
    (void)s;
    size_t k = i;
    while (k < e && in_ranges(mf_unicode_ds_cjk, mf_unicode_n_ds_cjk, w->cp[k]))
        k++;
    return k - i;
}

static size_t m_ds_numbers(const work *w, size_t s, size_t e, size_t i) {
    (void)s;
    size_t k = i;
    while (k < e && IS_N(k))
        k++;
    return k - i;
}

typedef size_t (*matcher)(const work *w, size_t s, size_t e, size_t i);

typedef struct stage_list {
    const matcher *m;
    int n;
} stage_list;

static stage_list stages_of(pre_kind k) {
    static const matcher gpt2[] = {m_gpt2};
    static const matcher llama3[] = {m_llama3};
    static const matcher qwen2[] = {m_qwen2};
    static const matcher smollm[] = {m_digit, m_gpt2};
    static const matcher deepseek[] = {m_ds_newline, m_ds_letters, m_ds_punct,
                                       m_ds_trailing, m_ds_cjk, m_ds_numbers};
    switch (k) {
    case PRE_GPT2: return (stage_list){gpt2, 1};
    case PRE_LLAMA3: return (stage_list){llama3, 1};
    case PRE_QWEN2: return (stage_list){qwen2, 1};
    case PRE_SMOLLM: return (stage_list){smollm, 2};
    case PRE_DEEPSEEK: return (stage_list){deepseek, 6};
    case PRE_NONE: break;
    }
    return (stage_list){NULL, 0};
}

/* Splits code points [s, e) with stage st: every match and every gap between
 * matches becomes a piece for the next stage; after the last stage a piece
 * goes to BPE. Depth is the stage count (at most 6). */
static void split_stage(work *w, const stage_list *sl, int st, size_t s, size_t e) {
    if (st == sl->n) {
        bpe_gpt2(w, w->text + w->off[s], w->off[e] - w->off[s]);
        return;
    }
    size_t gap = s, i = s;
    while (i < e) {
        size_t n = sl->m[st](w, s, e, i);
        if (!n) {
            i++;
            continue;
        }
        if (n > e - i)
            n = e - i; /* never past the piece, whatever a matcher says */
        if (gap < i)
            split_stage(w, sl, st + 1, gap, i);
        split_stage(w, sl, st + 1, i, i + n);
        i += n;
        gap = i;
    }
    if (gap < e)
        split_stage(w, sl, st + 1, gap, e);
}

static void decode_fragment(work *w, const uint8_t *text, size_t len) {
    w->text = text;
    size_t n = 0, i = 0;
    while (i < len) {
        uint32_t c;
        size_t l = utf8_decode(text + i, len - i, &c);
        w->cp[n] = c;
        w->off[n] = (uint32_t)i;
        n++;
        i += l;
    }
    w->off[n] = (uint32_t)len;
    w->n_cp = n;
}

static void tokenize_gpt2(work *w, const uint8_t *text, size_t len) {
    decode_fragment(w, text, len);
    stage_list sl = stages_of(w->t->pre);
    split_stage(w, &sl, 0, 0, w->n_cp);
}

/* ==== SentencePiece BPE (spm) ============================================== */

static void spm_push_pair(work *w, const char *text, uint32_t l) {
    const sym *s = w->syms;
    if (s[l].next < 0)
        return;
    uint32_t r = (uint32_t)s[l].next;
    int32_t id = mf_token_lookup(w->t, text + s[l].start, s[l].len + s[r].len);
    if (id >= 0)
        heap_push(w, (heap_ent){-(double)w->t->score[id], l, r, (int32_t)(s[l].len + s[r].len), 0});
}

/* text: the fragment with ' ' already replaced by U+2581. Symbols start as
 * UTF-8 characters; the adjacent pair whose concatenation is the highest-
 * scored vocab token merges first (leftmost among equals). A final symbol
 * that is not a token falls back to <0xNN> byte tokens, then to unk. */
static void bpe_spm(work *w, const char *text, size_t len) {
    const mf_tokenizer *t = w->t;
    if (len == 0)
        return;
    grow_syms(w, len);
    sym *s = w->syms;
    size_t n = 0;
    for (size_t i = 0; i < len;) {
        uint32_t c;
        size_t l = utf8_decode((const uint8_t *)text + i, len - i, &c);
        s[n].start = (uint32_t)i;
        s[n].len = (uint32_t)l;
        s[n].prev = (int32_t)n - 1;
        s[n].next = (int32_t)n + 1;
        n++;
        i += l;
    }
    s[n - 1].next = -1;
    w->heap_n = 0;
    for (size_t i = 0; i + 1 < n; i++)
        spm_push_pair(w, text, (uint32_t)i);
    while (w->heap_n) {
        heap_ent e = heap_pop(w);
        uint32_t l = e.left, r = e.right;
        if (!s[l].len || !s[r].len || s[l].next != (int32_t)r ||
            s[l].len + s[r].len != (uint32_t)e.a)
            continue;
        s[l].len += s[r].len;
        s[r].len = 0;
        s[l].next = s[r].next;
        if (s[r].next >= 0)
            s[s[r].next].prev = (int32_t)l;
        if (s[l].prev >= 0)
            spm_push_pair(w, text, (uint32_t)s[l].prev);
        spm_push_pair(w, text, l);
    }
    for (int32_t i = 0; i >= 0; i = s[i].next) {
        int32_t id = mf_token_lookup(t, text + s[i].start, s[i].len);
        if (id >= 0) {
            emit(w, id);
            continue;
        }
        for (uint32_t k = 0; k < s[i].len; k++) {
            int32_t b = t->byte_tok[(uint8_t)text[s[i].start + k]];
            if (b >= 0)
                emit(w, b);
            else
                emit_unknown_byte(w, (uint8_t)text[s[i].start + k]);
        }
    }
}

static void tokenize_spm(work *w, const uint8_t *text, size_t len, bool prefix) {
    size_t n_sp = 0;
    for (size_t i = 0; i < len; i++)
        n_sp += text[i] == ' ';
    size_t need = len + 2 * n_sp + (prefix ? 3 : 0);
    grow_scratch(w, need + 1);
    char *o = w->scratch;
    size_t k = 0;
    if (prefix) {
        memcpy(o, "\xe2\x96\x81", 3);
        k = 3;
    }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') {
            memcpy(o + k, "\xe2\x96\x81", 3);
            k += 3;
        } else {
            o[k++] = (char)text[i];
        }
    }
    /* bpe_spm reads w->scratch through text; it does not grow scratch */
    bpe_spm(w, o, k);
}

/* ==== mf_tokenize ============================================================ */

/* The special token starting at p (leftmost-longest), or -1. */
static int32_t match_special(const mf_tokenizer *t, const uint8_t *p, size_t left,
                             bool parse_special) {
    for (int32_t k = t->sp_first[*p]; k < t->sp_first[*p + 1]; k++) {
        int32_t id = t->special[k];
        if (t->type[id] == MF_TOKEN_CONTROL && !parse_special)
            continue;
        if (t->len[id] <= left && !memcmp(t->arena + t->off[id], p, t->len[id]))
            return id;
    }
    return -1;
}

static void raw_fragment(work *w, const uint8_t *p, size_t n, bool *prev_special) {
    if (w->t->model == MF_TOKENIZER_GPT2) {
        if (n)
            tokenize_gpt2(w, p, n);
    } else {
        /* spm prefixes a space to the text start and after each special */
        bool prefix = w->t->add_space_prefix && *prev_special;
        if (n || prefix)
            tokenize_spm(w, p, n, prefix && n);
    }
    *prev_special = false;
}

/* Partition on special tokens, then tokenize each raw fragment. */
int64_t mf_tokenize(const mf_tokenizer *t, const char *text, size_t len, bool add_special,
                    bool parse_special, int32_t *out, int64_t cap, mf_error *err) {
    if (len > INT32_MAX)
        return mf_errorf(err, "tokenize: text of %zu bytes exceeds the 2 GiB limit", len);
    if (!text && len)
        return mf_errorf(err, "tokenize: NULL text with length %zu", len);
    work w = {.t = t, .out = out, .cap = out ? (cap < 0 ? 0 : cap) : 0, .bad_byte = -1};
    w.cp = mf_malloc(sizeof *w.cp * (len + 1));
    w.off = mf_malloc(sizeof *w.off * (len + 1));
    if (add_special && t->add_bos && t->bos >= 0)
        emit(&w, t->bos);
    const uint8_t *p = (const uint8_t *)text;
    size_t raw = 0;
    bool prev_special = true;
    for (size_t i = 0; i < len;) {
        int32_t id = t->n_special ? match_special(t, p + i, len - i, parse_special) : -1;
        if (id < 0) {
            i++;
            continue;
        }
        if (raw < i)
            raw_fragment(&w, p + raw, i - raw, &prev_special);
        emit(&w, id);
        prev_special = true;
        i += t->len[id];
        raw = i;
    }
    if (raw < len)
        raw_fragment(&w, p + raw, len - raw, &prev_special);
    if (add_special && t->add_eos && t->eos >= 0)
        emit(&w, t->eos);
    free(w.cp);
    free(w.off);
    free(w.syms);
    free(w.heap);
    free(w.scratch);
    if (w.bad_byte >= 0)
        return mf_errorf(err, "tokenize: byte 0x%02X has no token in the vocabulary and there is no "
                         "unknown token to stand for it", (unsigned)w.bad_byte);
    return w.n;
}

/* ==== pieces ================================================================= */

static int parse_byte_token(const char *s, size_t n) {
    if (n != 6 || memcmp(s, "<0x", 3) || s[5] != '>')
        return -1;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        int d = (c >= '0' && c <= '9') ? c - '0'
              : (c >= 'A' && c <= 'F') ? c - 'A' + 10
              : (c >= 'a' && c <= 'f') ? c - 'a' + 10 : -1;
        if (d < 0)
            return -1;
        v = v * 16 + d;
    }
    return v;
}

static size_t put(char *buf, size_t cap, size_t n, const void *src, size_t l) {
    if (n < cap)
        memcpy(buf + n, src, l <= cap - n ? l : cap - n);
    return n + l;
}

int mf_token_to_piece(const mf_tokenizer *t, int32_t id, bool render_special, char *buf,
                      size_t cap) {
    if (id < 0 || id >= t->n)
        return -1;
    const char *s = t->arena + t->off[id];
    size_t l = t->len[id], n = 0;
    switch ((mf_token_type)t->type[id]) {
    case MF_TOKEN_CONTROL:
    case MF_TOKEN_UNUSED:
        return render_special ? (int)put(buf, cap, 0, s, l) : 0;
    case MF_TOKEN_USER_DEFINED:
        return (int)put(buf, cap, 0, s, l);
    case MF_TOKEN_UNKNOWN:
        if (t->model == MF_TOKENIZER_SPM)
            return (int)put(buf, cap, 0, "\xe2\x96\x85", 3); /* what llama prints for unk */
        return render_special ? (int)put(buf, cap, 0, s, l) : 0;
    case MF_TOKEN_BYTE: {
        int b = parse_byte_token(s, l);
        if (b >= 0) {
            uint8_t c = (uint8_t)b;
            return (int)put(buf, cap, 0, &c, 1);
        }
        return (int)put(buf, cap, 0, s, l);
    }
    case MF_TOKEN_NORMAL:
    case MF_TOKEN_UNDEFINED:
        break;
    }
    if (t->model == MF_TOKENIZER_SPM) {
        for (size_t i = 0; i < l;) {
            if (i + 3 <= l && !memcmp(s + i, "\xe2\x96\x81", 3)) {
                n = put(buf, cap, n, " ", 1);
                i += 3;
            } else {
                n = put(buf, cap, n, s + i, 1);
                i++;
            }
        }
        return (int)n;
    }
    for (size_t i = 0; i < l;) {
        uint32_t c;
        size_t k = utf8_decode((const uint8_t *)s + i, l - i, &c);
        int b = c == CP_INVALID ? -1 : cp_to_byte(c);
        if (b >= 0) {
            uint8_t ch = (uint8_t)b;
            n = put(buf, cap, n, &ch, 1);
        } else {
            n = put(buf, cap, n, s + i, k); /* not in the byte map: keep as is */
        }
        i += k;
    }
    return (int)n;
}

/* ==== streaming detokenizer ================================================== */

void mf_detok_init(mf_detok *d) { memset(d, 0, sizeof *d); }

/* A piece is never longer than its token text (or 3 bytes for spm's unk);
 * each byte may become a 3-byte U+FFFD, plus one held sequence flushed. */
size_t mf_detok_max_bytes(const mf_tokenizer *t) {
    size_t m = 3;
    for (int32_t i = 0; i < t->n; i++)
        if (t->len[i] > m)
            m = t->len[i];
    return 3 * m + 8;
}

static const char replacement[3] = {(char)0xEF, (char)0xBF, (char)0xBD};

/* Whether byte c may follow the n_pend bytes held (the second byte of E0,
 * ED, F0, F4 sequences is restricted so overlongs and surrogates fail). */
static bool detok_accepts(const mf_detok *d, uint8_t c) {
    if ((c & 0xC0) != 0x80)
        return false;
    if (d->n_pend == 1) {
        switch (d->pend[0]) {
        case 0xE0: return c >= 0xA0;
        case 0xED: return c <= 0x9F;
        case 0xF0: return c >= 0x90;
        case 0xF4: return c <= 0x8F;
        default: break;
        }
    }
    return true;
}

static size_t detok_bytes(mf_detok *d, const uint8_t *p, size_t l, char *out, size_t cap,
                          size_t n) {
    for (size_t i = 0; i < l; i++) {
        uint8_t c = p[i];
        if (d->n_pend) {
            if (detok_accepts(d, c)) {
                d->pend[d->n_pend++] = c;
                if (d->n_pend == d->need) {
                    n = put(out, cap, n, d->pend, d->need);
                    d->n_pend = 0;
                }
                continue;
            }
            n = put(out, cap, n, replacement, 3);
            d->n_pend = 0; /* and c starts afresh below */
        }
        if (c < 0x80) {
            n = put(out, cap, n, &c, 1);
        } else if (c >= 0xC2 && c <= 0xF4) {
            d->pend[0] = c;
            d->n_pend = 1;
            d->need = c <= 0xDF ? 2 : c <= 0xEF ? 3 : 4;
        } else {
            n = put(out, cap, n, replacement, 3);
        }
    }
    return n;
}

size_t mf_detok_push(const mf_tokenizer *t, mf_detok *d, int32_t id, char *out, size_t cap) {
    char stackbuf[256];
    int l = mf_token_to_piece(t, id, d->render_special, stackbuf, sizeof stackbuf);
    if (l <= 0)
        return 0;
    const char *piece = stackbuf;
    char *heap = NULL;
    if ((size_t)l > sizeof stackbuf) {
        heap = mf_malloc((size_t)l);
        mf_token_to_piece(t, id, d->render_special, heap, (size_t)l);
        piece = heap;
    }
    size_t n = detok_bytes(d, (const uint8_t *)piece, (size_t)l, out, cap, 0);
    free(heap);
    return n;
}

size_t mf_detok_flush(mf_detok *d, char *out, size_t cap) {
    size_t n = 0;
    if (d->n_pend)
        n = put(out, cap, 0, replacement, 3);
    d->n_pend = 0;
    return n;
}
