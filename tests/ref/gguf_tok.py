"""A HF `tokenizers` byte-level BPE built from a GGUF's tokenizer.ggml.* arrays.

Only for the reference checks (turning a prompt into ids independently of
minfer's tokenizer): gpt2-style vocabularies (tokenizer.ggml.model "gpt2").
The pre-tokenizer is the GPT-2 byte-level split; that is exact for plain
ASCII English prompts, which is all the checks use.
"""

import gguf
from tokenizers import Tokenizer, decoders, models, pre_tokenizers


def from_gguf(path):
    r = gguf.GGUFReader(path)
    kind = r.fields["tokenizer.ggml.model"].contents()
    if kind != "gpt2":
        raise ValueError(f"gguf_tok: tokenizer model {kind!r} not supported")
    toks = r.fields["tokenizer.ggml.tokens"].contents()
    merges = [tuple(s.split(" ", 1)) for s in r.fields["tokenizer.ggml.merges"].contents()]
    vocab = {t: i for i, t in enumerate(toks)}
    tk = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    return tk
