"""Writes the seed corpus fuzz/corpus/<target>/ from a few lines of shared/assets and hand-made
edge cases (python3, standard library only). Rerunning rewrites the seed-* files and leaves the
others (inputs libFuzzer found and scripts/fuzz.sh --merge added) alone.

    python3 fuzz/make_corpus.py ../shared/assets
"""
import json
import pathlib
import struct
import sys

assets = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "../shared/assets")
root = pathlib.Path(__file__).resolve().parent
corpus = root / "corpus"


def put(target, name, data):
    d = corpus / target
    d.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    (d / ("seed-" + name)).write_bytes(data)


def head(path, n):
    with open(assets / path, "rb") as f:
        return b"".join(f.readline() for _ in range(n))


# ---- safetensors -----------------------------------------------------------------------------

def st(tensors, metadata=None, pad=True, raw_header=None):
    """tensors: [(name, dtype, shape, bytes)] laid out in order."""
    header, data = {}, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape, b in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(b)]}
        data += b
    h = raw_header if raw_header is not None else json.dumps(header, separators=(",", ":")).encode()
    if pad:
        h += b" " * ((8 - len(h) % 8) % 8)
    return struct.pack("<Q", len(h)) + h + data


f32 = lambda *v: struct.pack(f"<{len(v)}f", *v)
put("safetensors", "f32", st([("w", "F32", [2, 2], f32(1, 2, 3, 4))]))
put("safetensors", "dtypes", st([("a", "F16", [3], b"\x00\x3c\x00\xc0\x00\x7c"),
                                 ("b", "BF16", [2], b"\x80\x3f\xc0\x7f"), ("c", "F32", [], f32(7))],
                                metadata={"format": "pt"}))
put("safetensors", "empty-tensors", st([("z", "F32", [0, 5], b""), ("y", "F16", [4, 0], b"")]))
put("safetensors", "no-tensors", st([], metadata={}))
put("safetensors", "unpadded", st([("x", "BF16", [1], b"\x80\x3f")], pad=False))
put("safetensors", "i64", st([("i", "I64", [1], b"\x01" + b"\x00" * 7)]))
put("safetensors", "huge-shape", st([("w", "F32", [1000000, 1000000], f32(0))]))
put("safetensors", "overflow-shape", st([("w", "F32", [4294967296, 4294967296, 4294967296], f32(0))]))
put("safetensors", "empty-overflow", st([], raw_header=b'{"w":{"dtype":"F32","shape":[4611686018427387904,4611686018427387904,0],"data_offsets":[0,0]}}'))
put("safetensors", "overlap", st([], raw_header=b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},'
                                               b'"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}') + f32(1, 2, 3))
put("safetensors", "past-end", st([], raw_header=b'{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}') + f32(1))
put("safetensors", "bad-offsets", st([], raw_header=b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}}') + f32(1, 2))
put("safetensors", "negative", st([], raw_header=b'{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}') + f32(1))
put("safetensors", "duplicate", st([], raw_header=b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
                                                 b'"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}') + f32(1))
put("safetensors", "not-object", st([], raw_header=b"[1,2,3]"))
put("safetensors", "length-huge", b"\xff" * 8 + b"{}")
put("safetensors", "length-past-end", struct.pack("<Q", 64) + b"{}")
put("safetensors", "short", b"\x02\x00\x00")
# stories260K's real header (names, shapes, offsets) over a cut data section, and its tensor
# names with tiny shapes over a data section that fits.
with open(assets / "models/stories260K/model.safetensors", "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    real_header = f.read(n)
    first_data = f.read(64)
put("safetensors", "stories-header-cut", struct.pack("<Q", n) + real_header + first_data)
names = [k for k in json.loads(real_header) if k != "__metadata__"]
put("safetensors", "stories-names-small", st([(k, "F32", [1], f32(0.5)) for k in sorted(names)], metadata={"format": "pt"}))

# ---- safetensors index: index.json, then optionally NUL + the first shard's bytes -----------------
S1, S2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
idx = lambda wm, **kw: json.dumps({"metadata": {"total_size": 16}, "weight_map": wm, **kw}).encode()
put("safetensors_index", "valid", idx({"a.weight": S1, "b.weight": S2}))
put("safetensors_index", "valid-own-shard", idx({"c": S1, "b.weight": S2}) + b"\0" + st([("c", "BF16", [2, 1], b"\x80\x3f\x00\x40")]))
put("safetensors_index", "wrong-shard", idx({"a.weight": S2, "b.weight": S1}))
put("safetensors_index", "missing-tensor", idx({"a.weight": S1, "b.weight": S2, "c.weight": S2}))
put("safetensors_index", "missing-shard", idx({"a.weight": "model-00003-of-00003.safetensors"}))
put("safetensors_index", "outside", idx({"a.weight": "../model.safetensors", "b.weight": "/etc/passwd"}))
put("safetensors_index", "in-two-shards", idx({"b.weight": S2}) + b"\0" + st([("b.weight", "F32", [1], f32(1))]))
put("safetensors_index", "empty", idx({}))
put("safetensors_index", "not-string", idx({"a.weight": 3}))
put("safetensors_index", "no-weight-map", b'{"metadata": {}}')
put("safetensors_index", "dir-as-shard", idx({"a.weight": ".", "b.weight": S2}))
put("safetensors_index", "bad-shard", idx({"a.weight": S1}) + b"\0" + b"\x10\x00\x00\x00\x00\x00\x00\x00{\"a.weight\":1}  ")

# ---- config.json ------------------------------------------------------------------------------
stories = json.loads((assets / "models/stories260K/config.json").read_text())
put("config", "stories260K", json.dumps(stories, indent=1))
gpt2 = {"model_type": "gpt2", "vocab_size": 50257, "n_embd": 768, "n_layer": 12, "n_head": 12, "n_positions": 1024,
        "n_inner": None, "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5, "bos_token_id": 50256,
        "eos_token_id": 50256, "scale_attn_weights": True, "tie_word_embeddings": True, "torch_dtype": "float32"}
put("config", "gpt2", json.dumps(gpt2))
opt = {"model_type": "opt", "vocab_size": 50272, "hidden_size": 768, "ffn_dim": 3072, "num_hidden_layers": 12,
       "num_attention_heads": 12, "max_position_embeddings": 2048, "word_embed_proj_dim": 768,
       "do_layer_norm_before": True, "activation_function": "relu", "enable_bias": True, "pad_token_id": 1,
       "bos_token_id": 2, "eos_token_id": 2, "torch_dtype": "float16"}
put("config", "opt", json.dumps(opt))
put("config", "opt-350m", json.dumps({**opt, "hidden_size": 1024, "word_embed_proj_dim": 512, "do_layer_norm_before": False}))
mistral = {"model_type": "mistral", "vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336,
           "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "sliding_window": None,
           "max_position_embeddings": 32768, "rope_theta": 1e6, "torch_dtype": "bfloat16", "eos_token_id": [2, 3]}
put("config", "mistral", json.dumps(mistral))
qwen = {"model_type": "qwen2", "vocab_size": 151936, "hidden_size": 896, "intermediate_size": 4864,
        "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2, "use_sliding_window": False,
        "sliding_window": 32768, "max_window_layers": 21, "rope_theta": 1e6, "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True, "dtype": "bfloat16", "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}
put("config", "qwen2", json.dumps(qwen))
put("config", "rope-scaling", json.dumps({**stories, "rope_scaling": {"type": "linear", "factor": 2.0}}))
put("config", "huge", json.dumps({**stories, "hidden_size": 10**12, "num_hidden_layers": 10**9, "vocab_size": 2**63 - 1}))
put("config", "gpt2-huge", json.dumps({**gpt2, "n_embd": 2**62, "n_head": 1, "n_inner": None}))
put("config", "negative", json.dumps({**stories, "num_attention_heads": -8, "bos_token_id": -1, "eos_token_id": 2**40}))
put("config", "wrong-types", json.dumps({**stories, "hidden_size": 64.5, "rms_norm_eps": "small", "tie_word_embeddings": 1}))
put("config", "indivisible", json.dumps({k: v for k, v in {**stories, "num_key_value_heads": 3}.items() if k != "head_dim"}))
put("config", "unknown-type", '{"model_type": "bert", "vocab_size": 1}')
put("config", "not-object", "[]")
put("config", "truncated", json.dumps(stories)[:100])

# ---- tokenizer.json, then optionally NUL + text, NUL + tokenizer_config.json ----------------------
text = "Once upon a time,  there was a caf\u00e9 \u2603 \ud55c\uad6d \u65e5\u672c <s> 123 <|endoftext|>\n\tend  "


def shrink(path, merges=40):
    """The tokenizer at path with its vocabulary cut to the first merges and a few characters: the
    same pipeline in 2-3 KB, so that the fuzzer runs thousands of loads a second, not hundreds."""
    j = json.loads(pathlib.Path(path).read_text())
    m = j["model"]
    pairs = [x.split(" ") if isinstance(x, str) else x for x in m["merges"][:merges]]
    keep = {t for a, b in pairs for t in (a, b, a + b)}
    keep |= {t for t, i in m["vocab"].items() if i < 8 or (len(t) == 1 and (t.isascii() or i < 120))}
    keep |= {"<0x41>", "<0xC3>", "<0xA9>", "<0xE2>", "<0x98>", "<0x83>", "<0x0A>", "<unk>", "\u2581", "\u0120"}
    m["vocab"] = {t: i for t, i in m["vocab"].items() if t in keep}
    m["merges"] = [x for x, (a, b) in zip(m["merges"], pairs) if a in keep and b in keep and a + b in keep]
    j["added_tokens"] = [a for a in j.get("added_tokens", []) if a["content"] in keep or a["id"] < 8]
    return json.dumps(j, ensure_ascii=False, separators=(",", ":")).encode()


stories_tok = shrink(assets / "models/stories260K/tokenizer.json")
stories_cfg = (assets / "models/stories260K/tokenizer_config.json").read_bytes()
put("tokenizer", "stories260K", stories_tok + b"\0" + text.encode() + b"\0" + stories_cfg)
put("tokenizer", "stories260K-no-text", stories_tok)
for name in ("bytelevel", "llama3", "sentencepiece"):
    d = root / "tokenizers" / name
    put("tokenizer", name, shrink(d / "tokenizer.json") + b"\0" + text.encode() + b"\0" +
        (d / "tokenizer_config.json").read_bytes())
mini = {"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "<unk>": 3}, "merges": ["a b"], "unk_token": "<unk>",
                  "continuing_subword_prefix": "##", "end_of_word_suffix": "</w>"},
        "added_tokens": [{"id": 4, "content": "<x>", "special": True, "lstrip": True, "rstrip": True, "single_word": True}],
        "normalizer": {"type": "Sequence", "normalizers": [{"type": "NFKD"}, {"type": "Lowercase"},
                                                          {"type": "Replace", "pattern": {"Regex": "\\+"}, "content": "a"}]},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "WhitespaceSplit"},
                          {"type": "Split", "pattern": {"String": "b"}, "behavior": "MergedWithPrevious", "invert": True}]},
        "post_processor": {"type": "BertProcessing", "cls": ["<x>", 4], "sep": ["<x>", 4]},
        "decoder": {"type": "BPEDecoder", "suffix": "</w>"}}
put("tokenizer", "mini", json.dumps(mini) + "\0ab ba  AB <x>ab\0" + '{"bos_token": {"content": "<x>"}, "pad_token": "a"}')
put("tokenizer", "mini-merged-next", json.dumps({**mini, "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "a{1,2}"},
                                                                       "behavior": "MergedWithNext"},
                                                  "decoder": {"type": "Strip", "content": "a", "start": 2, "stop": 1}}))
put("tokenizer", "mini-contiguous", json.dumps({**mini, "pre_tokenizer": {"type": "Split", "pattern": {"Regex": " +"},
                                                                      "behavior": "Contiguous"}, "normalizer": None,
                                                 "post_processor": {"type": "RobertaProcessing", "cls": ["a", 0], "sep": ["b", 1]}}))
put("tokenizer", "huge-id", '{"model": {"type": "BPE", "vocab": {"a": 2147483646}, "merges": []}}')
put("tokenizer", "bad-merge", '{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a c"]}}')
put("tokenizer", "unigram", '{"model": {"type": "Unigram", "vocab": [["a", 0.0]]}}')
put("tokenizer", "regex", '{"model": {"vocab": {}, "merges": []}, "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "[a-z]+"}, "behavior": "Removed"}}')

# ---- tokenizer_text: a byte choosing tokenizer and flags, then the text ----------------------------
samples = [
    head("data/tinystories/tinystories_sample_cs336.txt", 3),
    head("data/tinyshakespeare/input.txt", 12),
    "Caf\u00e9 cafe\u0301 \uac00\u1100\u1161\u11a8 \ufb01 \u2460 \u00bd \u2163 \u0130 \u1e9e \u03a3\u03c3 \U0001f642\u200d".encode(),
    b"invalid \xff\xfe \xc3 \xe2\x82 \xf0\x9f\x98 \xed\xa0\x80 \xc0\xaf \xf4\x90\x80\x80 end",
    "\u3000\u2028\u00a0 \t\r\n\x0b\x0c\u0085  lots   of    space\n\n\r\n".encode(),
    b"<s></s><unk><|endoftext|><|begin_of_text|> <mask> <mask>x <0x41><0xff>",
    b"it's I'LL we'Ve 1234567890 \xd9\xa3\xd9\xa4 x2\xc2\xb2 --__!!??",
    b"\x00\x01\x02\x1f\x7f",
    "a\u0301\u0327\u0308 \u0915\u094d\u0937 \u0e01\u0e34 \ud55c\uae00".encode(),
]
for i, s in enumerate(samples):
    for sel in (0, 1, 2, 3):
        put("tokenizer_text", f"{i}-{sel}", bytes([sel + (4 if i % 2 else 0)]) + s)

# ---- task data: the task's name on the first line, then the file -------------------------------------
put("task_data", "sst2-train", b"sst2\n" + head("data/sst2/train.tsv", 12))
put("task_data", "sst2-dev", b"sst2\n" + head("data/sst2/dev.tsv", 6))
put("task_data", "sst2-test", b"sst2 unlabelled\n" + head("data/sst2/test_unlabeled.tsv", 6))
for task in ("rte", "cb", "copa"):
    put("task_data", f"{task}-train", task.encode() + b"\n" + head(f"data/{task}/train.jsonl", 3))
    put("task_data", f"{task}-val", task.encode() + b"\n" + head(f"data/{task}/val.jsonl", 2))
    put("task_data", f"{task}-test", task.encode() + b" unlabelled\n" + head(f"data/{task}/test.jsonl", 2))
put("task_data", "jsonl", b'jsonl\n{"prompt": "Q: 2+2?\\nA:", "completion": " 4"}\n\n{"prompt": "", "completion": "x"}\n')
put("task_data", "sst2-edge", b"sst2\n\n  \r\nlabel\tsentence\textra\r\n1\tgood\t\n0\t  bad  \t\n\n2\tugly\tx\n")
put("task_data", "sst2-no-header", b"sst2\nfine movie\t1\n")
put("task_data", "rte-int-labels", b'rte\n{"premise": "a", "hypothesis": "b", "label": 1}\n{"premise": "a", "hypothesis": "b", "label": -1}\n')
put("task_data", "cb-bad", b'cb\n{"premise": "a", "hypothesis": 3, "label": "neutral"}\n')
put("task_data", "copa-bad", b'copa\n{"premise": "x.", "choice1": "I", "choice2": "A B", "question": "why", "label": 0}\n')
put("task_data", "copa-unlabelled", b'copa unlabelled\n{"premise": "It rained.  ", "choice1": "We", "choice2": "I ran", "question": "effect"}\n')
put("task_data", "jsonl-bad", b'jsonl\n{"prompt": "p", "completion": "  "}\n[1]\n{"prompt"\n')
put("task_data", "empty", b"rte\n\n\n")

# ---- JSON nested past zof's limit (hf/json_depth.h: 256 levels), in every JSON a user gives ----------
deep = "[" * 300 + "]" * 300
put("config", "deep", json.dumps(stories)[:-1] + ', "x": ' + deep + "}")
put("safetensors", "deep", st([], raw_header=('{"w":{"dtype":"F32","shape":' + deep + ',"data_offsets":[0,0]}}').encode()))
put("safetensors_index", "deep", ('{"weight_map":{"a.weight":' + deep + "}}").encode())
put("tokenizer", "deep", '{"model": {"type": "BPE", "vocab": {}, "merges": ' + deep + "}}")
put("tokenizer", "deep-config", json.dumps(mini) + "\0ab\0" + '{"bos_token": ' + deep + "}")
put("task_data", "deep", b'rte\n{"premise": ' + deep.encode() + b', "hypothesis": "h", "label": 0}\n')

# ---- GGUF: llama.cpp's model file (hf/gguf.h), built field by field --------------------------------
GGUF_TYPES = {"u8": (0, "<B"), "i8": (1, "<b"), "u16": (2, "<H"), "i16": (3, "<h"), "u32": (4, "<I"),
              "i32": (5, "<i"), "f32": (6, "<f"), "bool": (7, "<?"), "u64": (10, "<Q"),
              "i64": (11, "<q"), "f64": (12, "<d")}


def gstr(s):
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def gvalue(kind, v):
    """kind: a GGUF_TYPES name, "str", or ("arr", element kind)."""
    if kind == "str":
        return gstr(v)
    if isinstance(kind, tuple):
        ek = kind[1]
        code = 8 if ek == "str" else 9 if isinstance(ek, tuple) else GGUF_TYPES[ek][0]
        return struct.pack("<IQ", code, len(v)) + b"".join(gvalue(ek, x) for x in v)
    return struct.pack(GGUF_TYPES[kind][1], v)


def gguf(kvs, tensors, alignment=32, version=3):
    """kvs: [(key, kind, value)]; tensors: [(name, ggml type id, dims (contiguous first), bytes)]."""
    out = struct.pack("<IIQQ", 0x46554747, version, len(tensors), len(kvs))
    for key, kind, v in kvs:
        code = 8 if kind == "str" else 9 if isinstance(kind, tuple) else GGUF_TYPES[kind][0]
        out += gstr(key) + struct.pack("<I", code) + gvalue(kind, v)
    data, offsets = b"", []
    for name, t, dims, b in tensors:
        offsets.append(len(data))
        data += b + b"\0" * ((-len(b)) % alignment)
    for (name, t, dims, b), off in zip(tensors, offsets):
        out += gstr(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", t, off)
    return out + b"\0" * ((-len(out)) % alignment) + data


def f16(x):
    return struct.pack("<e", x)


# One block of each type zof reads (F32 0, F16 1, Q4_0 2, Q4_1 3, Q8_0 8, Q4_K 12, Q6_K 14,
# BF16 30), from fixed bytes with small fp16 scales.
BLOCKS = {
    0: (1, struct.pack("<f", 0.25)), 1: (1, f16(-0.5)), 30: (1, b"\x80\x3e"),
    2: (32, f16(0.01) + bytes(range(16))), 3: (32, f16(0.01) + f16(-0.05) + bytes(range(16, 32))),
    8: (32, f16(0.002) + bytes((i * 7) % 256 for i in range(32))),
    12: (256, f16(0.003) + f16(0.001) + bytes(range(40, 52)) + bytes((i * 13) % 256 for i in range(128))),
    14: (256, bytes((i * 11) % 256 for i in range(128)) + bytes((i * 5) % 256 for i in range(64)) +
         bytes((i * 9) % 256 for i in range(16)) + f16(0.004)),
}


def tensor(name, t, dims):
    block, b = BLOCKS[t]
    n = 1
    for d in dims:
        n *= d
    return (name, t, dims, b * (n // block))


# A tiny llama: width 32, 2 heads of 16 (1 KV head), one layer, a byte-level vocabulary of 10 with
# SmolLM's pre-tokenizer; every tensor type zof reads among its tensors.
toks = ["<|endoftext|>", "a", "b", "c", "\u0120", "ab", "\u0120a", "1", "2", "!"]
llama_kvs = [
    ("general.architecture", "str", "llama"), ("general.name", "str", "tiny"),
    ("llama.block_count", "u32", 1), ("llama.context_length", "u32", 64),
    ("llama.embedding_length", "u32", 32), ("llama.feed_forward_length", "u32", 32),
    ("llama.attention.head_count", "u32", 2), ("llama.attention.head_count_kv", "u32", 1),
    ("llama.rope.freq_base", "f32", 10000.0), ("llama.attention.layer_norm_rms_epsilon", "f32", 1e-5),
    ("llama.rope.dimension_count", "u32", 16), ("llama.vocab_size", "u32", len(toks)),
    ("general.file_type", "u32", 7), ("tokenizer.ggml.model", "str", "gpt2"),
    ("tokenizer.ggml.pre", "str", "smollm"), ("tokenizer.ggml.tokens", ("arr", "str"), toks),
    ("tokenizer.ggml.token_type", ("arr", "i32"), [3] + [1] * (len(toks) - 1)),
    ("tokenizer.ggml.merges", ("arr", "str"), ["a b", "\u0120 a"]),
    ("tokenizer.ggml.bos_token_id", "u32", 0), ("tokenizer.ggml.eos_token_id", "u32", 0),
    ("tokenizer.ggml.add_bos_token", "bool", False),
]
llama_tensors = [
    tensor("token_embd.weight", 8, [32, 10]), tensor("blk.0.attn_norm.weight", 0, [32]),
    tensor("blk.0.attn_q.weight", 2, [32, 32]), tensor("blk.0.attn_k.weight", 3, [32, 16]),
    tensor("blk.0.attn_v.weight", 1, [32, 16]), tensor("blk.0.attn_output.weight", 30, [32, 32]),
    tensor("blk.0.ffn_norm.weight", 0, [32]), tensor("blk.0.ffn_gate.weight", 8, [32, 32]),
    tensor("blk.0.ffn_up.weight", 8, [32, 32]), tensor("blk.0.ffn_down.weight", 2, [32, 32]),
    tensor("output_norm.weight", 0, [32]),
]
put("gguf", "llama-tiny", gguf(llama_kvs, llama_tensors))
put("gguf", "llama-tiny-untied", gguf(llama_kvs, llama_tensors + [tensor("output.weight", 3, [32, 10])]))
put("gguf", "llama-tiny-v2-align64", gguf(llama_kvs + [("general.alignment", "u32", 64)],
                                          llama_tensors, alignment=64, version=2))
# Every tensor type (K-quants' blocks of 256 too), an unread one (Q5_0, id 6), an empty tensor,
# and every metadata type, arrays of arrays included.
put("gguf", "types", gguf(
    [("u8", "u8", 200), ("i8", "i8", -3), ("u16", "u16", 60000), ("i16", "i16", -300), ("u32", "u32", 7),
     ("i32", "i32", -7), ("f32", "f32", 0.5), ("bool", "bool", True), ("u64", "u64", 1 << 40),
     ("i64", "i64", -(1 << 40)), ("f64", "f64", 0.1), ("s", "str", "h\u00e9"),
     ("nested", ("arr", ("arr", "i32")), [[1, 2], [], [3]])],
    [tensor("q4_k", 12, [256, 2]), tensor("q6_k", 14, [256]), tensor("bf16", 30, [3, 2]),
     ("q5_0", 6, [32], f16(0.5) + bytes(20)), ("empty", 0, [0, 4], b"")]))
put("gguf", "header-only", gguf([("general.architecture", "str", "llama")], []))
