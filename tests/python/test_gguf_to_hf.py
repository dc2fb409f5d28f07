# scripts/gguf_to_hf.py on a tiny LLaMA GGUF written here with the gguf package's writer: q/k rows
# permuted as llama.cpp's converter permutes them come back in Hugging Face's order, every tensor
# and the config survive, and bad input is refused with one "error:" line and no directory.
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from safetensors.numpy import load_file

from conftest import REPO

CONVERTER = REPO / "scripts" / "gguf_to_hf.py"
try:
    import gguf
except ImportError:  # scripts/get_smollm2.sh installs it (setup.sh runs it for the tests)
    gguf = None
    if os.environ.get("CI") == "true":
        raise
pytestmark = pytest.mark.skipif(gguf is None, reason="gguf is not installed: run "
                                "bash scripts/get_smollm2.sh")

H, HEADS, KV_HEADS, FFN, LAYERS = 32, 4, 2, 24, 2
D = H // HEADS  # 8: the pairs swap (2, D/2) <-> (D/2, 2) is its own inverse only at D = 4


def llama_cpp_permute(w, n_head, n_head_kv):
    """convert_hf_to_gguf.py's LlamaModel.permute, as llama.cpp writes q (n_head, n_head) and
    k (n_head, n_head_kv)."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def byte_vocab():
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1))
          + list(range(ord("\xae"), ord("\xff") + 1)))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return ["<|endoftext|>"] + [chr(c) for c in cs] + ["he", "ll", "hell", "hello", "\u0120w"]


def write_gguf(path, arch="llama", extra_tensor=False):
    rng = np.random.default_rng(5)
    tokens = byte_vocab()
    V = len(tokens)
    hf = {"model.embed_tokens.weight": rng.standard_normal((V, H)),
          "model.norm.weight": 1 + 0.1 * rng.standard_normal(H)}
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(LAYERS)
    w.add_context_length(64)
    w.add_embedding_length(H)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_freq_base(5e4)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_dimension_count(D)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types([3] + [1] * (V - 1))
    w.add_token_merges(["h e", "l l", "he ll", "hell o", "\u0120 w"])
    w.add_bos_token_id(0)
    w.add_eos_token_id(0)
    w.add_tensor("token_embd.weight", hf["model.embed_tokens.weight"].astype(np.float32))
    w.add_tensor("output_norm.weight", hf["model.norm.weight"].astype(np.float32))
    for i in range(LAYERS):
        p = "model.layers.%d." % i
        layer = {"attn_norm": ("input_layernorm", (H,)),
                 "ffn_norm": ("post_attention_layernorm", (H,)),
                 "attn_q": ("self_attn.q_proj", (HEADS * D, H)),
                 "attn_k": ("self_attn.k_proj", (KV_HEADS * D, H)),
                 "attn_v": ("self_attn.v_proj", (KV_HEADS * D, H)),
                 "attn_output": ("self_attn.o_proj", (H, HEADS * D)),
                 "ffn_gate": ("mlp.gate_proj", (FFN, H)), "ffn_up": ("mlp.up_proj", (FFN, H)),
                 "ffn_down": ("mlp.down_proj", (H, FFN))}
        for g_name, (hf_name, shape) in layer.items():
            x = rng.standard_normal(shape).astype(np.float32)
            hf[p + hf_name + ".weight"] = x
            if g_name == "attn_q":
                x = llama_cpp_permute(x, HEADS, HEADS)
            elif g_name == "attn_k":
                x = llama_cpp_permute(x, HEADS, KV_HEADS)
            w.add_tensor("blk.%d.%s.weight" % (i, g_name), np.ascontiguousarray(x))
    if extra_tensor:
        w.add_tensor("rope_freqs.weight", np.ones(D // 2, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return {k: np.asarray(v, dtype=np.float32) for k, v in hf.items()}


def convert(src, out, *extra):
    return subprocess.run([sys.executable, str(CONVERTER), str(src), str(out), *extra],
                          capture_output=True, text=True, timeout=120)


def test_round_trip_undoes_llama_cpp_row_order(tmp_path):
    want = write_gguf(tmp_path / "tiny.gguf")
    out = tmp_path / "hf"
    r = convert(tmp_path / "tiny.gguf", out)
    assert r.returncode == 0, r.stderr
    got = load_file(str(out / "model.safetensors"))
    assert sorted(got) == sorted(want)  # tied: no lm_head.weight
    for name, x in want.items():
        np.testing.assert_array_equal(got[name], x, err_msg=name)
    cfg = json.loads((out / "config.json").read_text())
    assert (cfg["model_type"], cfg["hidden_size"], cfg["num_attention_heads"],
            cfg["num_key_value_heads"], cfg["num_hidden_layers"], cfg["intermediate_size"],
            cfg["rms_norm_eps"], cfg["rope_theta"], cfg["tie_word_embeddings"]) == \
        ("llama", H, HEADS, KV_HEADS, LAYERS, FFN, 1e-6, 5e4, True)
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(out / "tokenizer.json"))
    enc = tok.encode("hello world 42<|endoftext|>")
    assert enc.tokens[:3] == ["hello", "\u0120w", "o"]
    assert "4" in enc.tokens and "2" in enc.tokens  # digits one by one (smollm)
    assert enc.ids[-1] == 0 and tok.decode(enc.ids, skip_special_tokens=True) == "hello world 42"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left


@pytest.mark.parametrize("case", ["junk", "truncated", "sha256", "arch", "extra_tensor"])
def test_refuses_bad_input_in_one_line(tmp_path, case):
    src = tmp_path / "in.gguf"
    extra = []
    if case == "junk":
        src.write_bytes(os.urandom(4096))
    elif case == "truncated":
        write_gguf(src)
        src.write_bytes(src.read_bytes()[:3000])
    elif case == "sha256":
        write_gguf(src)
        extra = ["--expect-sha256", "0" * 64]
    elif case == "arch":
        write_gguf(src, arch="gpt2")
    else:
        write_gguf(src, extra_tensor=True)
    out = tmp_path / "hf"
    out.mkdir()
    (out / "keep").write_text("an older conversion")
    r = convert(src, out, *extra)
    assert r.returncode == 1, r.stdout + r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert sorted(p.name for p in out.iterdir()) == ["keep"]  # the old directory is untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "in.gguf"]
