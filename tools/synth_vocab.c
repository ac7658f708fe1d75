/* synth_vocab.c - deterministic byte-level BPE vocabulary (see synth_vocab.h). */
#include "synth_vocab.h"
#include "tokenizer/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the corpus ------------------------------------------------------------------ */

/* Written for this project: a little of everything a tokenizer meets (prose,
 * dialogue, code, numbers, punctuation, a few non-ASCII words) so that the
 * merges look like a real vocabulary's, with frequent English words and
 * code keywords becoming single tokens. */
static const char corpus[] =
    "The river ran past the old mill at the edge of the town, and every morning the "
    "miller opened the doors to let the light in. He had worked there for thirty "
    "years, and his father before him, and the wheel still turned as it always had.\n"
    "\"Good morning,\" said the baker, who was carrying a basket of bread to the market. "
    "\"Will it rain today, do you think?\"\n"
    "\"It might,\" the miller answered. \"The clouds in the west are heavy, but the wind "
    "is turning. We will see what the afternoon brings.\"\n"
    "In the spring the children of the town played in the fields near the water. They "
    "built small boats from pieces of wood and watched them float down towards the "
    "bridge. Some of the boats were lost, and some were found again in the reeds.\n"
    "A good question is often more useful than a quick answer. When you are learning "
    "something new, it helps to write down what you know, what you think you know, and "
    "what you would like to find out. Then you can test each idea in turn.\n"
    "The committee met on Tuesday to discuss the budget for the coming year. After a "
    "long debate, the members agreed to increase the funding for the library and the "
    "public gardens, while reducing the cost of the new roads.\n"
    "Scientists measure the temperature of the ocean at many depths. The data show that "
    "the surface is warming faster than the deep water, which changes the way heat and "
    "nutrients move through the sea.\n"
    "She opened the letter slowly. It was from her brother, who had moved to the city "
    "three years earlier. He wrote that he was happy, that the work was hard but "
    "interesting, and that he would come home for the summer.\n"
    "Question: What is the capital of France?\nAnswer: The capital of France is Paris.\n"
    "Question: How many days are there in a week?\nAnswer: There are seven days in a week.\n"
    "Question: Why is the sky blue?\nAnswer: Sunlight is scattered by the air, and blue "
    "light is scattered more than red light because its wavelength is shorter.\n"
    "User: Can you help me write a short poem about the sea?\n"
    "Assistant: Of course. Here is a short poem:\nThe sea is wide, the sea is deep,\n"
    "it sings the sailors into sleep.\nThe waves come in, the waves go out,\n"
    "and that is what the sea's about.\n"
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12 42 100 256 1024 2048 4096 65536 3.14159 "
    "2.71828 1e-6 -17 +23 1,000,000 50% $19.99 12:30 2024-05-17 #7 v1.2.3 0x1f 0b1010\n"
    "In 1969, 3 astronauts flew 384,400 km to the Moon; the trip took about 76 hours.\n"
    "Prices rose 4.5% in March, then fell 0.7% in April (see table 2, row 13).\n"
    "Caf\xc3\xa9, na\xc3\xafve, fa\xc3\xa7" "ade, \xc3\xbc" "ber, se\xc3\xb1or, "
    "\xe2\x82\xac" "5, 10\xc2\xb0" "C, \xe2\x80\x9cquoted\xe2\x80\x9d \xe2\x80\x94 "
    "\xe6\x97\xa5\xe6\x9c\xac, \xd0\x9f\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82, "
    "\xf0\x9f\x99\x82.\n"
    "#include <stdio.h>\n#include <stdlib.h>\n\n"
    "/* Returns the sum of the first n elements of values. */\n"
    "static int sum(const int *values, int n) {\n    int total = 0;\n"
    "    for (int i = 0; i < n; i++) {\n        total += values[i];\n    }\n"
    "    return total;\n}\n\n"
    "int main(int argc, char **argv) {\n    int values[4] = {1, 2, 3, 4};\n"
    "    if (argc > 1) {\n        printf(\"%s\\n\", argv[1]);\n    }\n"
    "    printf(\"sum = %d\\n\", sum(values, 4));\n    return 0;\n}\n\n"
    "def fibonacci(n):\n    \"\"\"Return the first n Fibonacci numbers.\"\"\"\n"
    "    result = []\n    a, b = 0, 1\n    for _ in range(n):\n        result.append(a)\n"
    "        a, b = b, a + b\n    return result\n\n"
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n"
    "    def push(self, item):\n        self.items.append(item)\n\n"
    "    def pop(self):\n        if not self.items:\n"
    "            raise IndexError(\"pop from empty stack\")\n        return self.items.pop()\n\n"
    "if __name__ == \"__main__\":\n    print(fibonacci(10))\n    s = Stack()\n"
    "    s.push(1)\n    print(s.pop())\n\n"
    "function greet(name) {\n  const message = `Hello, ${name}!`;\n"
    "  console.log(message);\n  return message.length;\n}\n\n"
    "for (let i = 0; i < 3; i++) { greet(\"world\"); }\n\n"
    "SELECT name, count(*) AS total FROM users WHERE age >= 18 GROUP BY name ORDER BY total DESC;\n"
    "$ cmake -B build -DCMAKE_BUILD_TYPE=Release && cmake --build build -j 8\n"
    "{\"name\": \"minfer\", \"version\": \"0.1.0\", \"layers\": 24, \"ok\": true, \"list\": [1, 2, 3]}\n"
    "<html><body><p class=\"note\">Hello &amp; welcome!</p></body></html>\n"
    "The quick brown fox jumps over the lazy dog. THE QUICK BROWN FOX! the quick brown fox?\n"
    "It's a fine day; isn't it? We'll go, they've gone, I'm here, you're there, she'd know.\n"
    "Remember: the model reads tokens, not words. Tokens are pieces of text that the "
    "tokenizer learned from data, and common words usually become a single token while "
    "rare words are split into several smaller pieces.\n"
    "First, preheat the oven. Second, mix the flour, the sugar and the eggs. Third, bake "
    "the cake for forty minutes, and then let it cool before you cut it.\n"
    "The train left the station at seven o'clock and arrived in the capital just after "
    "noon. Most of the passengers were reading, sleeping, or looking out of the windows "
    "at the hills, the farms and the small villages along the line.\n";

const char *mf_synth_vocab_corpus(void) {
    return corpus;
}

/* ---- training ---------------------------------------------------------------------- */

typedef struct word {
    uint32_t *ids;   /* current symbols */
    uint32_t n;
    uint32_t count;  /* occurrences in the corpus */
    const char *text;
    uint32_t len;
} word;

typedef struct pair_slot {
    uint64_t key;    /* (a << 32) | b */
    uint64_t count;
    uint32_t gen;    /* iteration that last wrote the slot: no clearing needed */
} pair_slot;

#define PAIR_SLOTS (1u << 16)

static bool is_letter(unsigned char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c >= 0x80;
}
static bool is_digit(unsigned char c) {
    return c >= '0' && c <= '9';
}
static bool is_space(unsigned char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* Length of the pre-token at s: a simplified Qwen2/GPT-2 split (letters with
 * one optional leading space, single digits, punctuation runs with an
 * optional leading space, whitespace runs that leave their last space to
 * the next word). Merges never cross these boundaries. */
static size_t pretoken_len(const unsigned char *s, size_t n) {
    size_t i = 0;
    if (is_digit(s[0]))
        return 1;
    if (s[0] == ' ' && n > 1 && !is_space(s[1]) && !is_digit(s[1]))
        i = 1;
    if (i < n && is_letter(s[i])) {
        while (i < n && is_letter(s[i]))
            i++;
        return i;
    }
    if (i < n && !is_space(s[i]) && !is_digit(s[i])) {
        while (i < n && !is_space(s[i]) && !is_letter(s[i]) && !is_digit(s[i]))
            i++;
        return i;
    }
    while (i < n && is_space(s[i]))
        i++;
    if (i < n && i > 1 && s[i - 1] == ' ')
        i--;
    return i;
}

typedef struct trainer {
    word *words;
    uint32_t n_words;
    char **tok;       /* token strings, grown as merges add tokens */
    uint32_t n_tok, cap_tok;
    pair_slot *slots;
} trainer;

static void add_word(trainer *t, const char *text, uint32_t len) {
    for (uint32_t i = 0; i < t->n_words; i++)
        if (t->words[i].len == len && !memcmp(t->words[i].text, text, len)) {
            t->words[i].count++;
            return;
        }
    t->words = mf_realloc(t->words, (t->n_words + 1) * sizeof *t->words);
    word *w = &t->words[t->n_words++];
    w->ids = mf_malloc(len * sizeof *w->ids);
    for (uint32_t i = 0; i < len; i++)
        w->ids[i] = (unsigned char)text[i];
    w->n = len;
    w->count = 1;
    w->text = text;
    w->len = len;
}

static int64_t find_token(const trainer *t, const char *s) {
    for (uint32_t i = 0; i < t->n_tok; i++)
        if (!strcmp(t->tok[i], s))
            return i;
    return -1;
}

static void push_token(trainer *t, char *s) {
    if (t->n_tok == t->cap_tok) {
        t->cap_tok = t->cap_tok ? 2 * t->cap_tok : 512;
        t->tok = mf_realloc(t->tok, t->cap_tok * sizeof *t->tok);
    }
    t->tok[t->n_tok++] = s;
}

static uint32_t hash_pair(uint64_t key) {
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdull;
    key ^= key >> 33;
    return (uint32_t)key & (PAIR_SLOTS - 1);
}

/* The most frequent adjacent pair (ties: smallest key), or false when no
 * pair is left (every pre-token is one token). Pairs seen once are merged
 * too: the corpus is small and the vocabulary should still reach its cap. */
static bool best_pair(trainer *t, uint32_t gen, uint64_t *best) {
    uint64_t best_count = 0;
    for (uint32_t wi = 0; wi < t->n_words; wi++) {
        const word *w = &t->words[wi];
        for (uint32_t i = 0; i + 1 < w->n; i++) {
            uint64_t key = ((uint64_t)w->ids[i] << 32) | w->ids[i + 1];
            uint32_t h = hash_pair(key);
            while (t->slots[h].gen == gen && t->slots[h].key != key)
                h = (h + 1) & (PAIR_SLOTS - 1);
            pair_slot *s = &t->slots[h];
            if (s->gen != gen) {
                s->gen = gen;
                s->key = key;
                s->count = 0;
            }
            s->count += w->count;
            if (s->count > best_count || (s->count == best_count && key < *best)) {
                best_count = s->count;
                *best = key;
            }
        }
    }
    return best_count >= 1;
}

static void apply_merge(trainer *t, uint32_t a, uint32_t b, uint32_t ab) {
    for (uint32_t wi = 0; wi < t->n_words; wi++) {
        word *w = &t->words[wi];
        uint32_t o = 0;
        for (uint32_t i = 0; i < w->n; i++) {
            if (i + 1 < w->n && w->ids[i] == a && w->ids[i + 1] == b) {
                w->ids[o++] = ab;
                i++;
            } else {
                w->ids[o++] = w->ids[i];
            }
        }
        w->n = o;
    }
}

static char *str_printf(const char *fmt, const char *a, const char *b) {
    size_t n = strlen(a) + strlen(b) + 2;
    char *s = mf_malloc(n);
    snprintf(s, n, fmt, a, b);
    return s;
}

int mf_synth_vocab_build(uint32_t n_tokens, mf_synth_vocab *out, mf_error *err) {
    memset(out, 0, sizeof *out);
    if (n_tokens < MF_SYNTH_VOCAB_MIN)
        return mf_errorf(err, "vocabulary of %u tokens is too small (at least %u: 256 bytes + 3 "
                              "special tokens)", n_tokens, MF_SYNTH_VOCAB_MIN);
    if (n_tokens > MF_GGUF_MAX_VOCAB)
        return mf_errorf(err, "vocabulary of %u tokens is too large (at most %llu)", n_tokens,
                         (unsigned long long)MF_GGUF_MAX_VOCAB);
    trainer t = {0};
    for (unsigned b = 0; b < 256; b++) {
        char *s = mf_malloc(3);
        mf_gpt2_byte_symbol((uint8_t)b, s);
        push_token(&t, s);
    }
    const unsigned char *c = (const unsigned char *)corpus;
    size_t n = sizeof corpus - 1;
    for (size_t i = 0; i < n;) {
        size_t len = pretoken_len(c + i, n - i);
        add_word(&t, (const char *)c + i, (uint32_t)len);
        i += len;
    }

    /* room for merges: everything but the bytes and the 3 specials */
    uint32_t max_new = n_tokens - MF_SYNTH_VOCAB_MIN;
    uint32_t max_merges = max_new < MF_SYNTH_MAX_MERGES ? max_new : MF_SYNTH_MAX_MERGES;
    char **merges = mf_malloc((max_merges ? max_merges : 1) * sizeof *merges);
    uint32_t n_merges = 0;
    t.slots = mf_calloc(PAIR_SLOTS, sizeof *t.slots);
    for (uint32_t gen = 1; n_merges < max_merges; gen++) {
        uint64_t key = UINT64_MAX;
        if (!best_pair(&t, gen, &key))
            break;
        uint32_t a = (uint32_t)(key >> 32), b = (uint32_t)key;
        char *joined = str_printf("%s%s", t.tok[a], t.tok[b]);
        int64_t ab = find_token(&t, joined);
        if (ab < 0) {
            ab = t.n_tok;
            push_token(&t, joined);
        } else {
            free(joined);
        }
        merges[n_merges++] = str_printf("%s %s", t.tok[a], t.tok[b]);
        apply_merge(&t, a, b, (uint32_t)ab);
    }
    free(t.slots);
    for (uint32_t i = 0; i < t.n_words; i++)
        free(t.words[i].ids);
    free(t.words);

    /* filler up to the specials, then the specials */
    char name[32];
    while (t.n_tok < n_tokens - 3) {
        snprintf(name, sizeof name, "[PAD%u]", t.n_tok);
        push_token(&t, mf_strdup(name));
    }
    out->id_endoftext = t.n_tok;
    push_token(&t, mf_strdup("<|endoftext|>"));
    out->id_im_start = t.n_tok;
    push_token(&t, mf_strdup("<|im_start|>"));
    out->id_im_end = t.n_tok;
    push_token(&t, mf_strdup("<|im_end|>"));
    MF_ASSERT(t.n_tok == n_tokens);

    out->n_tokens = n_tokens;
    out->tokens = t.tok;
    out->types = mf_malloc(n_tokens * sizeof *out->types);
    for (uint32_t i = 0; i < n_tokens; i++)
        out->types[i] = i >= n_tokens - 3 ? 3 : 1;
    out->n_merges = n_merges;
    out->merges = merges;
    return 0;
}

void mf_synth_vocab_free(mf_synth_vocab *v) {
    for (uint32_t i = 0; i < v->n_tokens; i++)
        free(v->tokens[i]);
    for (uint32_t i = 0; i < v->n_merges; i++)
        free(v->merges[i]);
    free(v->tokens);
    free(v->types);
    free(v->merges);
    memset(v, 0, sizeof *v);
}

static const char chatml_template[] =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}";

void mf_synth_vocab_write(const mf_synth_vocab *v, const char *pre, mf_gguf_writer *w) {
    mf_gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
    mf_gguf_writer_set_str(w, "tokenizer.ggml.pre", pre);
    mf_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)v->tokens, NULL,
                               v->n_tokens);
    mf_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", MF_GGUF_INT32, v->types, v->n_tokens);
    mf_gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", (const char *const *)v->merges, NULL,
                               v->n_merges);
    if (!strcmp(pre, "smollm")) {
        mf_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", v->id_im_start);
        mf_gguf_writer_set_u32(w, "tokenizer.ggml.unknown_token_id", v->id_endoftext);
        mf_gguf_writer_set_u32(w, "tokenizer.ggml.padding_token_id", v->id_im_end);
        mf_gguf_writer_set_bool(w, "tokenizer.ggml.add_space_prefix", false);
    } else {
        mf_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", v->id_endoftext);
        mf_gguf_writer_set_u32(w, "tokenizer.ggml.padding_token_id", v->id_endoftext);
    }
    mf_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", v->id_im_end);
    mf_gguf_writer_set_u32(w, "tokenizer.ggml.eot_token_id", v->id_im_end);
    mf_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", false);
    mf_gguf_writer_set_str(w, "tokenizer.chat_template", chatml_template);
}
