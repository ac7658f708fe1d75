"""Writes tiny random llama/qwen2/qwen3 GGUF models with gguf.GGUFWriter.

Independent of `minfer synth`: used to check the reference on its own
(tests/py/test_forward_refcheck.py) and to feed the engine a model whose
bytes minfer did not write. Carries a minimal gpt2-style vocabulary (the
256 byte symbols, a few merges, fillers, ChatML specials) so a loader that
wants tokenizer metadata accepts it.
"""

import numpy as np
import gguf


def _byte_symbols():
    # GPT-2 byte-to-unicode map: printable bytes map to themselves, the rest
    # to U+0100 upwards, in byte order.
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    out, n = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + n)
            n += 1
    return [out[b] for b in range(256)]


def _vocab(n_vocab):
    toks = _byte_symbols()
    merges = []
    for a, b in (("t", "h"), ("th", "e"), ("i", "n"), ("\u0120", "t")):
        merges.append(f"{a} {b}")
        toks.append(a + b)
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    n_fill = n_vocab - len(toks) - len(specials)
    if n_fill < 0:
        raise ValueError(f"make_gguf: vocab {n_vocab} too small (min {len(toks) + 3})")
    toks += [f"<filler_{i}>" for i in range(n_fill)]
    types = [1] * (len(toks)) + [3] * len(specials)
    toks += specials
    return toks, types, merges


def write(path, arch, dim=64, layers=2, ff=128, heads=4, kv_heads=2, head_dim=None,
          vocab=300, tied=True, seed=0, theta=10000.0, eps=1e-5, qtype=None,
          rope_scale=None, n_rot=None):
    """Writes a random model; qtype (a GGMLQuantizationType) quantizes 2-D weights."""
    rng = np.random.default_rng(seed)
    hd = head_dim or dim // heads
    w = gguf.GGUFWriter(path, arch)
    w.add_context_length(256)
    w.add_embedding_length(dim)
    w.add_block_count(layers)
    w.add_feed_forward_length(ff)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    if head_dim is not None:
        w.add_key_length(hd)
        w.add_value_length(hd)
    w.add_rope_freq_base(theta)
    if n_rot is not None:
        w.add_rope_dimension_count(n_rot)
    if rope_scale is not None:
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(rope_scale)
    w.add_layer_norm_rms_eps(eps)
    w.add_file_type(0)
    toks, types, merges = _vocab(vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(toks)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(vocab - 3)
    w.add_eos_token_id(vocab - 1)

    def mat(n_out, n_in, scale=1.0):
        return (rng.standard_normal((n_out, n_in)) * scale / np.sqrt(n_in)).astype(np.float32)

    def vec(n, mean, sd):
        return (mean + sd * rng.standard_normal(n)).astype(np.float32)

    def add(name, a):
        if qtype is not None and a.ndim == 2:
            w.add_tensor(name, gguf.quants.quantize(a, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(name, a)

    add("token_embd.weight", rng.standard_normal((vocab, dim)).astype(np.float32))
    add("output_norm.weight", vec(dim, 1.0, 0.1))
    if not tied:
        add("output.weight", mat(vocab, dim))
    down = 1.0 / np.sqrt(2 * layers)
    for il in range(layers):
        b = f"blk.{il}."
        add(b + "attn_norm.weight", vec(dim, 1.0, 0.1))
        add(b + "attn_q.weight", mat(heads * hd, dim))
        add(b + "attn_k.weight", mat(kv_heads * hd, dim))
        add(b + "attn_v.weight", mat(kv_heads * hd, dim))
        if arch == "qwen2":
            add(b + "attn_q.bias", vec(heads * hd, 0.0, 0.1))
            add(b + "attn_k.bias", vec(kv_heads * hd, 0.0, 0.1))
            add(b + "attn_v.bias", vec(kv_heads * hd, 0.0, 0.1))
        if arch == "qwen3":
            add(b + "attn_q_norm.weight", vec(hd, 1.0, 0.1))
            add(b + "attn_k_norm.weight", vec(hd, 1.0, 0.1))
        add(b + "attn_output.weight", mat(dim, heads * hd, down))
        add(b + "ffn_norm.weight", vec(dim, 1.0, 0.1))
        add(b + "ffn_gate.weight", mat(ff, dim))
        add(b + "ffn_up.weight", mat(ff, dim))
        add(b + "ffn_down.weight", mat(dim, ff, down))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
