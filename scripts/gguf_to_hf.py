#!/usr/bin/env python3
"""Converts a LLaMA-architecture GGUF file (llama.cpp's format) into a Hugging Face model
directory that transformers and zof load: config.json, model.safetensors (fp32), tokenizer.json,
tokenizer_config.json, generation_config.json, and zof_source.json (where it came from).

The weights are read and dequantized by the field's own reader (PyPI `gguf`: GGUFReader,
gguf.quants.dequantize), so a quantized file becomes the fp32 model its blocks encode, exactly.
llama.cpp's converter permutes the rows of q_proj and k_proj (convert_hf_to_gguf.py,
LlamaModel.permute: each head's rotary pairs interleaved for its RoPE kernel); they are permuted
back here. tokenizer.json is a byte-level BPE built from tokenizer.ggml.tokens / .merges, with
the pre-tokenizer llama.cpp names in tokenizer.ggml.pre and the control tokens as special added
tokens.

Usage: python3 scripts/gguf_to_hf.py FILE.gguf OUT_DIR [--expect-sha256 HEX]
Writes into a temporary directory beside OUT_DIR and renames it into place: OUT_DIR is whole or
absent. Refuses what it cannot convert exactly with one line "error: ..." and exit status 1.
"""
import argparse
import hashlib
import json
import os
import shutil
import signal
import sys
import tempfile

import numpy as np

CONVERTER = os.path.abspath(__file__)


class Refused(Exception):
    """What the input is that this script will not convert; the message names the fix."""


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# llama.cpp's tokenizer.ggml.pre -> the Hugging Face pre-tokenizers that split text the same way
# (llama-vocab.cpp's regex_exprs per pre type). "smollm" is StarCoder's: each digit alone, then
# GPT-2's regex, which ByteLevel(use_regex) applies.
BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
              "use_regex": True}
PRE_TOKENIZERS = {
    "gpt2": BYTE_LEVEL,
    "smollm": {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True}, BYTE_LEVEL]},
}

# GGUF tensor names (llama.cpp's LLM_TENSOR_NAMES for LLM_ARCH_LLAMA) -> Hugging Face's.
GLOBAL_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
BLOCK_TENSORS = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}

# GGUF token types (gguf.TokenType): 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused,
# 6 byte.
TOKEN_NORMAL, TOKEN_CONTROL, TOKEN_USER_DEFINED = 1, 3, 4


def unpermute_rows(w, n_head):
    """The inverse of convert_hf_to_gguf.py's LlamaModel.permute(w, n_head, n_head): that one
    reshapes each head's rows (2, d/2) and swaps to (d/2, 2); this swaps them back."""
    rows = w.shape[0]
    if rows % (2 * n_head):
        raise Refused("cannot undo the q/k row order: %d rows are not %d heads of an even size"
                      % (rows, n_head))
    return np.ascontiguousarray(
        w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape))


class Gguf:
    """The metadata and tensors of one GGUF file, each read checked."""

    def __init__(self, path):
        import gguf  # the field's reader (PyPI gguf)
        self.gguf = gguf
        self.path = path
        try:
            self.reader = gguf.GGUFReader(path, "r")
        except Exception as e:  # the reader raises ValueError, struct.error, IndexError, ...
            raise Refused("%s is not a readable GGUF file (%s: %s)"
                          % (path, type(e).__name__, e)) from None
        self.tensors = {t.name: t for t in self.reader.tensors}

    def field(self, key, default=KeyError):
        f = self.reader.fields.get(key)
        if f is None:
            if default is KeyError:
                raise Refused("%s: metadata key %s is missing" % (self.path, key))
            return default
        try:
            return f.contents()
        except Exception as e:
            raise Refused("%s: metadata key %s is unreadable (%s)" % (self.path, key, e)) from None

    def whole(self, key, default=KeyError):
        v = self.field(key, default)
        if v is default:
            return v
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
            raise Refused("%s: %s is %r, expected a whole number" % (self.path, key, v))
        return int(v)

    def real(self, key, default=KeyError):
        v = self.field(key, default)
        if v is default:
            return v
        if isinstance(v, bool) or not isinstance(v, (int, float, np.number)) or not np.isfinite(v):
            raise Refused("%s: %s is %r, expected a number" % (self.path, key, v))
        # GGUF stores float32: the shortest decimal that reads back to that float32 (1e-05, not
        # 9.999999747378752e-06), as the Hugging Face config had it.
        return float(str(np.float32(v)))

    def tensor(self, name, shape):
        """The tensor NAME dequantized to float32, in Hugging Face's (out, in) layout."""
        t = self.tensors.get(name)
        if t is None:
            raise Refused("%s: tensor %s is missing" % (self.path, name))
        want = tuple(reversed(shape))  # GGUF lists dimensions innermost first
        if tuple(int(d) for d in t.shape) != want:
            raise Refused("%s: tensor %s has shape %s, the metadata says %s"
                          % (self.path, name, list(t.shape), list(want)))
        try:
            w = self.gguf.quants.dequantize(t.data, t.tensor_type)
        except NotImplementedError:
            raise Refused("%s: tensor %s is %s, which gguf %s cannot dequantize"
                          % (self.path, name, t.tensor_type.name, self.gguf_version())) from None
        w = np.asarray(w, dtype=np.float32).reshape(shape)
        if not np.isfinite(w).all():
            raise Refused("%s: tensor %s holds non-finite values" % (self.path, name))
        return np.ascontiguousarray(w)

    def gguf_version(self):
        from importlib.metadata import version
        return version("gguf")


def read_config(g):
    arch = g.field("general.architecture")
    if arch != "llama":
        raise Refused("%s: general.architecture is %r; this converter reads llama only"
                      % (g.path, arch))
    hidden = g.whole("llama.embedding_length")
    heads = g.whole("llama.attention.head_count")
    kv_heads = g.whole("llama.attention.head_count_kv", heads)
    if not heads or hidden % heads or not kv_heads or heads % kv_heads:
        raise Refused("%s: %d heads / %d KV heads do not divide the width %d"
                      % (g.path, heads, kv_heads, hidden))
    head_dim = g.whole("llama.attention.key_length", hidden // heads)
    if head_dim != g.whole("llama.attention.value_length", head_dim):
        raise Refused("%s: key and value head sizes differ" % g.path)
    if g.whole("llama.rope.dimension_count", head_dim) != head_dim:
        raise Refused("%s: llama.rope.dimension_count %d is not the head size %d (partial "
                      "rotary is not converted)"
                      % (g.path, g.whole("llama.rope.dimension_count"), head_dim))
    for key in ("llama.rope.scaling.type", "llama.expert_count"):
        if key in g.reader.fields and g.field(key) not in ("none", 0):
            raise Refused("%s: %s is %r; this converter writes plain llama only"
                          % (g.path, key, g.field(key)))
    tokens = g.field("tokenizer.ggml.tokens")
    vocab = g.whole("llama.vocab_size", len(tokens))
    if vocab != len(tokens):
        raise Refused("%s: llama.vocab_size %d, but tokenizer.ggml.tokens has %d"
                      % (g.path, vocab, len(tokens)))
    tied = "output.weight" not in g.tensors
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": g.whole("llama.feed_forward_length"),
        "num_hidden_layers": g.whole("llama.block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "max_position_embeddings": g.whole("llama.context_length"),
        "rms_norm_eps": g.real("llama.attention.layer_norm_rms_epsilon"),
        "rope_theta": g.real("llama.rope.freq_base", 10000.0),
        "rope_scaling": None,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": tied,
        "torch_dtype": "float32",
    }
    for key, gguf_key in (("bos", "bos_token_id"), ("eos", "eos_token_id"),
                          ("pad", "padding_token_id")):
        tid = g.whole("tokenizer.ggml." + gguf_key, None)
        if tid is not None:
            if tid >= vocab:
                raise Refused("%s: tokenizer.ggml.%s %d is outside the vocabulary"
                              % (g.path, gguf_key, tid))
            cfg["%s_token_id" % key] = tid
    return cfg


def read_weights(g, cfg):
    """Every tensor the config implies, dequantized; refuses a file with more or fewer."""
    H, F, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    D, nh, nkv = cfg["head_dim"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    shapes = {"token_embd.weight": (V, H), "output_norm.weight": (H,)}
    if not cfg["tie_word_embeddings"]:
        shapes["output.weight"] = (V, H)
    block = {"attn_norm.weight": (H,), "attn_q.weight": (nh * D, H),
             "attn_k.weight": (nkv * D, H), "attn_v.weight": (nkv * D, H),
             "attn_output.weight": (H, nh * D), "ffn_norm.weight": (H,),
             "ffn_gate.weight": (F, H), "ffn_up.weight": (F, H), "ffn_down.weight": (H, F)}
    names = {}
    for name in shapes:
        names[name] = GLOBAL_TENSORS[name]
    for i in range(cfg["num_hidden_layers"]):
        for suffix, shape in block.items():
            shapes["blk.%d.%s" % (i, suffix)] = shape
            names["blk.%d.%s" % (i, suffix)] = "model.layers.%d.%s" % (i, BLOCK_TENSORS[suffix])
    extra = sorted(set(g.tensors) - set(shapes))
    if extra:
        raise Refused("%s: tensors this converter does not know: %s"
                      % (g.path, ", ".join(extra[:5]) + (" ..." if len(extra) > 5 else "")))
    out = {}
    for name, shape in shapes.items():
        w = g.tensor(name, shape)
        if name.endswith("attn_q.weight"):
            w = unpermute_rows(w, nh)
        elif name.endswith("attn_k.weight"):
            w = unpermute_rows(w, nkv)
        out[names[name]] = w
    return out


def read_tokenizer(g, cfg):
    """tokenizer.json, tokenizer_config.json and generation_config.json from the GGUF vocabulary."""
    model = g.field("tokenizer.ggml.model")
    if model != "gpt2":
        raise Refused("%s: tokenizer.ggml.model is %r; this converter builds byte-level BPE "
                      "(\"gpt2\") tokenizers only" % (g.path, model))
    pre = g.field("tokenizer.ggml.pre", "gpt2")
    if pre not in PRE_TOKENIZERS:
        raise Refused("%s: tokenizer.ggml.pre is %r; known: %s"
                      % (g.path, pre, ", ".join(sorted(PRE_TOKENIZERS))))
    tokens = g.field("tokenizer.ggml.tokens")
    types = g.field("tokenizer.ggml.token_type", [TOKEN_NORMAL] * len(tokens))
    merges = g.field("tokenizer.ggml.merges")
    if len(types) != len(tokens) or len(set(tokens)) != len(tokens):
        raise Refused("%s: tokenizer.ggml.tokens has duplicates or token_type another length"
                      % g.path)
    vocab = {t: i for i, t in enumerate(tokens)}
    pairs = []
    for k, m in enumerate(merges):
        parts = m.split(" ")
        if len(parts) != 2 or parts[0] not in vocab or parts[1] not in vocab \
                or parts[0] + parts[1] not in vocab:
            raise Refused("%s: tokenizer.ggml.merges[%d] %r is not two tokens whose join is a "
                          "token" % (g.path, k, m))
        pairs.append(parts)
    added = []
    for i, (t, ty) in enumerate(zip(tokens, types)):
        if ty in (TOKEN_CONTROL, TOKEN_USER_DEFINED):
            special = ty == TOKEN_CONTROL
            added.append({"id": i, "content": t, "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": not special, "special": special})
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": PRE_TOKENIZERS[pre],
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False,
                           "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        # unk_token null: a character whose bytes are not all in the vocabulary is dropped, as
        # Hugging Face's byte-level BPE tokenizers (GPT-2's, SmolLM's) do.
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": pairs},
    }

    def name(key):
        tid = cfg.get("%s_token_id" % key)
        return None if tid is None else tokens[tid]

    unk = g.whole("tokenizer.ggml.unknown_token_id", None)
    tok_cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": bool(g.field("tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": bool(g.field("tokenizer.ggml.add_eos_token", False)),
        "bos_token": name("bos"),
        "eos_token": name("eos"),
        "pad_token": name("pad"),
        "unk_token": tokens[unk] if unk is not None and unk < len(tokens) else None,
        "model_max_length": cfg["max_position_embeddings"],
        "clean_up_tokenization_spaces": False,
        "additional_special_tokens": [a["content"] for a in added if a["special"]],
        "added_tokens_decoder": {str(a["id"]): {k: v for k, v in a.items() if k != "id"}
                                 for a in added},
    }
    template = g.field("tokenizer.chat_template", None)
    if template is not None:
        tok_cfg["chat_template"] = template
    gen_cfg = {k: cfg[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k in cfg}
    return tokenizer, tok_cfg, gen_cfg


def write_json(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, ensure_ascii=False)
        f.write("\n")


def convert(src, out, expect_sha256=None):
    if not os.path.isfile(src):
        raise Refused("%s: no such file" % src)
    digest = sha256_file(src)
    if expect_sha256 and digest != expect_sha256.lower():
        raise Refused("%s has sha256 %s, expected %s: a different or damaged file"
                      % (src, digest, expect_sha256))
    g = Gguf(src)
    cfg = read_config(g)
    tokenizer, tok_cfg, gen_cfg = read_tokenizer(g, cfg)
    weights = read_weights(g, cfg)

    from safetensors.numpy import save_file
    parent = os.path.dirname(os.path.abspath(out))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".%s.tmp-" % os.path.basename(os.path.abspath(out)), dir=parent)
    try:
        save_file(weights, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
        write_json(os.path.join(tmp, "config.json"), cfg)
        write_json(os.path.join(tmp, "generation_config.json"), gen_cfg)
        write_json(os.path.join(tmp, "tokenizer_config.json"), tok_cfg)
        with open(os.path.join(tmp, "tokenizer.json"), "w", encoding="utf-8") as f:
            json.dump(tokenizer, f, ensure_ascii=False)  # one line: 2 MB of vocabulary
        with open(CONVERTER, "rb") as f:
            converter_sha = hashlib.sha256(f.read()).hexdigest()
        write_json(os.path.join(tmp, "zof_source.json"), {
            "gguf": os.path.basename(src),
            "gguf_sha256": digest,
            "gguf_package": g.gguf_version(),
            "converter_sha256": converter_sha,
            "model_safetensors_sha256": sha256_file(os.path.join(tmp, "model.safetensors")),
            "general.name": g.field("general.name", None),
            "tensor_types": sorted({t.tensor_type.name for t in g.reader.tensors}),
        })
        os.chmod(tmp, 0o755)
        for name in os.listdir(tmp):
            os.chmod(os.path.join(tmp, name), 0o644)
        # Swap in whole: an older directory moves aside first and goes only after the rename.
        old = None
        if os.path.lexists(out):
            old = tempfile.mkdtemp(prefix=".%s.old-" % os.path.basename(os.path.abspath(out)),
                                   dir=parent)
            os.rename(out, os.path.join(old, "d"))
        os.rename(tmp, out)
        tmp = None
        if old:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    return cfg


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gguf", help="the GGUF file")
    ap.add_argument("out", help="the Hugging Face model directory to write (replaced whole)")
    ap.add_argument("--expect-sha256", help="refuse the file unless its sha256 is this")
    a = ap.parse_args(argv)
    # SIGTERM unwinds as Ctrl-C does, so the temporary directory goes too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        cfg = convert(a.gguf, a.out, a.expect_sha256)
    except Refused as e:
        print("error: %s" % e, file=sys.stderr)
        return 1
    except ImportError as e:
        print("error: %s (install the gguf and safetensors packages)" % e, file=sys.stderr)
        return 1
    except OSError as e:
        print("error: %s" % e, file=sys.stderr)
        return 1
    print("wrote %s: %d layers, width %d, %d/%d heads, vocabulary %d%s"
          % (a.out, cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_attention_heads"],
             cfg["num_key_value_heads"], cfg["vocab_size"],
             ", tied embeddings" if cfg["tie_word_embeddings"] else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
