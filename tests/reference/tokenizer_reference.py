#!/usr/bin/env python3
"""Expected token ids for zof's tokenizer test (tests/unit/test_tokenizer.cpp), from Hugging Face
`tokenizers` (Tokenizer.from_file(...).encode / .decode).

Writes into --out (default build/tokref; the test reads $ZOF_TOKREF_DIR, else <build dir>/tokref):
  manifest.json                    the cases: tokenizer directory, files, vocab size
  <case>/<input>.jsonl             one line per input text:
        {"text", "ids" (add_special_tokens=True), "ids_plain" (False),
         "decoded" (decode(ids, skip_special_tokens=True)), "decoded_all" (... False)}
  <case>/decode.jsonl              random id sequences: {"decode_ids", "decoded", "decoded_all"}
  <case>/tokenizer/tokenizer.json  for synthetic cases: variants of the real tokenizers that
                                   exercise the other components zof implements (Split regexes,
                                   NFC/NFKC/NFKD, Lowercase, Metaspace, added-token flags, ...)

Real cases: assets/tokenizers/gpt2 and assets/models/stories260K, on every line of SST-2 dev
(sentence column), Tiny Shakespeare and the TinyStories samples, each file also whole, and edge cases.

Usage (from the repository root):
  python3 tests/reference/tokenizer_reference.py --out build-tok/tokref
"""
import argparse
import copy
import json
import os
import random
import sys
import unicodedata

import tokenizers
from tokenizers import Tokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
ASSETS = os.path.normpath(os.path.join(REPO, "..", "shared", "assets"))

GPT2_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
               r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN_MARKS_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}|"
                    r" ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

EDGE_CASES = [
    "", " ", "   ", "\n", "\t \n  ", "\r\n", "\n\n\n", " \n ", "\t", "\x0b\x0c",
    "  leading spaces", "trailing spaces   ", "multiple   spaces   inside", " a", "a ", " a b  c   d    e ",
    "a\n\nb", "line\r\nbreak\r\n", "tab\tseparated\tvalues", "a \n b \n\n c",
    "Hello, World! How's it going?", "HELLO world", "hello world", " hello world", "hello  world",
    "café naïve résumé Ångström", "Crème brûlée à la mode", "e\u0301 vs \u00e9", "a\u0300\u0301\u0302b",
    "Z\u0351\u0360\u0361a\u0352l\u0353g\u0354o", "\u1e0a\u0323 \u1e0c\u0307 D\u0307\u0323",
    "日本語のテキストです。", "中文分词测试，你好世界！", "안녕하세요 세계", "한국어 \u1100\u1161\u11a8",
    "😀👍🏽🇺🇸 family: 👨\u200d👩\u200d👧", "emoji😀inside", "✓ ✗ ★ ♥ ∑ ∫ √",
    "שלום עולם", "مرحبا بالعالم", "Привет, мир!", "Γειά σου Κόσμε", "ΣΑΣ σας ς",
    "12345 1,000.5", "3.14159", "١٢٣ ٤٥٦", "Ⅻ ½ ² ³ ¼", "2024-01-01T12:00:00Z", "1234567890" * 5,
    "I'm you'll they'd", "IT'S WE'VE THEY'LL I'D", "don't won't can't", "'s 't 're 've 'm 'll 'd",
    "O'Neil's dog", "rock 'n' roll", "'quoted'", "it's", "It'S", "x'ſ 'K",
    "<s>", "</s>", "<unk>", "<|endoftext|>", "a<|endoftext|>b", " <s> hello </s> ", "<s><s>",
    "<|endoftext|><|endoftext|>", "text <|endoftext|> more text", "<|endoftext", "<|endoftext|",
    "<mask>", "a <mask> b", "a   <mask>b", "[SEP] x", "x [SEP]   y", "word words sword word",
    "hello world hello worlds", " hello world", "<mask>[SEP]<mask>",
    "a" * 1000, "supercalifragilisticexpialidocious" * 20, "x" * 5000, " " * 900, "ab " * 300,
    "\u00a0non-breaking\u00a0space", "\u3000ideographic\u3000space", "a\u200bb zero width", "\ufeffBOM",
    "ﬁ ligature ﬀ", "ｆｕｌｌｗｉｄｔｈ ＡＢＣ", "\u212a Kelvin", "ǅ title case", "İstanbul", "ß straße",
    "\u2028line\u2029para", "a\u0085b", "\x00\x01\x7f controls", "\x1c\x1d\x1e\x1f", "a\x1c\nb",
    "https://example.com/a?b=c&d=e#f", "def f(x):\n    return x**2\n", "    indented\n\tcode",
    "email@example.com", "$100.00 (approx.)", "#hashtag @mention", "...", "!!!???", "--- ___ ===",
    "\u0915\u094d\u0937 \u0928\u092e\u0938\u094d\u0924\u0947", "ไทย ภาษา", "\U0001d400\U0001d401 math",
    "\U00010000\U0010fffd", "\ue000 private", "a\u0301\u0327 \u1e08", "\u0f73 \u0344 \u0958",
]

# Characters to draw random strings from: each class the regexes and normalizers distinguish.
FUZZ_POOL = (list(" \t\n\r'sStTmdlvreLV") + list("abcXYZ019") + list(".,!?-_()[]{}<>/|\\\"") +
             ["\u00a0", "\u3000", "\u2003", "\u200b", "\u0301", "\u0327", "\u0308", "é", "ß", "İ", "Σ",
              "日", "本", "한", "\u1100", "\u1161", "\u11a8", "😀", "🏽", "\u200d", "١", "½", "Ⅻ", "ﬁ",
              "Ａ", "▁", "Ġ", "<s>", "</s>", "<|endoftext|>", "<mask>", "[SEP]", "word", " hello world"])


def fuzz_strings(n, seed):
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(1, 30)):
            if rng.random() < 0.1:
                cp = rng.randint(0x20, 0x2FFFF)
                while unicodedata.category(chr(cp)) == "Cs":
                    cp = rng.randint(0x20, 0x2FFFF)
                parts.append(chr(cp))
            else:
                parts.append(rng.choice(FUZZ_POOL))
        out.append("".join(parts))
    return out


def read_lines(path):
    with open(path, encoding="utf-8", newline="") as f:
        text = f.read()
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return text, lines


def sst2_sentences(path):
    _, lines = read_lines(path)
    return [line.split("\t")[0] for line in lines[1:]]


def write_jsonl(path, records):
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=True) + "\n")


def encode_records(tok, texts):
    with_special = tok.encode_batch(texts, add_special_tokens=True)
    plain = tok.encode_batch(texts, add_special_tokens=False)
    ids = [e.ids for e in with_special]
    decoded = tok.decode_batch(ids, skip_special_tokens=True)
    decoded_all = tok.decode_batch(ids, skip_special_tokens=False)
    return [{"text": t, "ids": i, "ids_plain": p.ids, "decoded": d, "decoded_all": da}
            for t, i, p, d, da in zip(texts, ids, plain, decoded, decoded_all)]


def decode_records(tok, seed, n=300):
    rng = random.Random(seed)
    size = tok.get_vocab_size(with_added_tokens=True)
    special = [tok.token_to_id(t) for t in ("<s>", "</s>", "<unk>", "<|endoftext|>", "<mask>", "[SEP]")]
    special = [i for i in special if i is not None]
    byte_ids = [tok.token_to_id("<0x%02X>" % b) for b in range(256)]
    byte_ids = [i for i in byte_ids if i is not None]
    out = []
    for _ in range(n):
        ids = []
        for _ in range(rng.randint(0, 12)):
            r = rng.random()
            if r < 0.15 and special:
                ids.append(rng.choice(special))
            elif r < 0.4 and byte_ids:
                ids.append(rng.choice(byte_ids))
            elif r < 0.42:
                ids.append(size + rng.randint(0, 5))  # unknown ids are dropped
            else:
                ids.append(rng.randrange(size))
        out.append({"decode_ids": ids, "decoded": tok.decode(ids, skip_special_tokens=True),
                    "decoded_all": tok.decode(ids, skip_special_tokens=False)})
    return out


def load_json(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def synthetic_tokenizers():
    """Variants of the two real tokenizers, as tokenizer.json dicts."""
    gpt2 = load_json(os.path.join(ASSETS, "tokenizers", "gpt2", "tokenizer.json"))
    stories = load_json(os.path.join(ASSETS, "models", "stories260K", "tokenizer.json"))
    extra = [
        {"id": 50257, "content": "<mask>", "single_word": False, "lstrip": True, "rstrip": False,
         "normalized": False, "special": True},
        {"id": 50258, "content": "[SEP]", "single_word": False, "lstrip": False, "rstrip": True,
         "normalized": False, "special": True},
        {"id": 50259, "content": " hello world", "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": True, "special": False},
        {"id": 50260, "content": "word", "single_word": True, "lstrip": False, "rstrip": False,
         "normalized": False, "special": False},
    ]
    out = {}

    # LLaMA-3 style: Split + ByteLevel without regex, NFC, BOS template, merges as pairs.
    t = copy.deepcopy(gpt2)
    t["added_tokens"] += copy.deepcopy(extra)
    t["normalizer"] = {"type": "NFC"}
    t["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": LLAMA3_REGEX}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
    t["post_processor"] = {"type": "Sequence", "processors": [
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        {"type": "TemplateProcessing",
         "single": [{"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
         "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
         "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [50256], "tokens": ["<|endoftext|>"]}}}]}
    t["model"]["merges"] = [m.split(" ") for m in t["model"]["merges"]]
    out["gpt2_llama3_split"] = t

    # Qwen2 style: single digits, NFKC + Lowercase, prefix space, ignore_merges.
    t = copy.deepcopy(gpt2)
    t["added_tokens"] += copy.deepcopy(extra)
    t["normalizer"] = {"type": "Sequence", "normalizers": [{"type": "NFKC"}, {"type": "Lowercase"}]}
    t["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": QWEN2_REGEX}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": False}]}
    t["model"]["ignore_merges"] = True
    out["gpt2_qwen2_split"] = t

    # Qwen regex with marks as letters, NFD, Digits, RobertaProcessing.
    t = copy.deepcopy(gpt2)
    t["normalizer"] = {"type": "NFD"}
    t["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": False},
        {"type": "Split", "pattern": {"Regex": QWEN_MARKS_REGEX}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]}
    t["post_processor"] = {"type": "RobertaProcessing", "sep": ["<|endoftext|>", 50256], "cls": ["<|endoftext|>", 50256],
                           "trim_offsets": True, "add_prefix_space": False}
    out["gpt2_qwen_marks_nfd"] = t

    # GPT-2 with NFKD, individual digits, ByteLevel's own regex and prefix space.
    t = copy.deepcopy(gpt2)
    t["normalizer"] = {"type": "NFKD"}
    t["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True},
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}]}
    out["gpt2_nfkd_digits"] = t

    # Split behaviours and a non-byte-level model with no decoder (tokens joined by spaces).
    for behavior in ("Removed", "MergedWithPrevious", "MergedWithNext", "Contiguous"):
        t = copy.deepcopy(gpt2)
        t["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"String": " "}, "behavior": behavior, "invert": behavior == "Contiguous"},
            {"type": "Split", "pattern": {"Regex": GPT2_REGEX}, "behavior": behavior, "invert": False}]}
        t["decoder"] = None
        t["post_processor"] = None
        out["gpt2_split_" + behavior.lower()] = t

    # stories260K with a Metaspace pre-tokenizer (prepend first) and its decoder, BOS and EOS.
    t = copy.deepcopy(stories)
    t["normalizer"] = None
    t["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": True}
    t["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "ByteFallback"}, {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": True},
        {"type": "Fuse"}]}
    t["post_processor"] = {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                                      {"SpecialToken": {"id": "</s>", "type_id": 0}}],
                           "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                           "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]},
                                              "</s>": {"id": "</s>", "ids": [2], "tokens": ["</s>"]}}}
    out["stories_metaspace_first"] = t

    # Metaspace always, no split, unk without byte fallback, Lowercase + Strip(left) + Replace regex run.
    t = copy.deepcopy(stories)
    t["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "Lowercase"}, {"type": "Strip", "strip_left": True, "strip_right": False},
        {"type": "Replace", "pattern": {"Regex": "e{2,3}"}, "content": "E"}]}
    t["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": False}
    t["decoder"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "always", "split": False}
    t["model"]["byte_fallback"] = False
    t["model"]["fuse_unk"] = True
    t["added_tokens"][1]["normalized"] = True
    out["stories_metaspace_unk"] = t

    # Same without fuse_unk, Metaspace never, Strip decoder (tokenizers panics on stop > 0 when
    # a token is all strip characters, so only start is exercised).
    t = copy.deepcopy(out["stories_metaspace_unk"])
    t["model"]["fuse_unk"] = False
    t["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "never", "split": True}
    t["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "never", "split": True},
        {"type": "Fuse"}, {"type": "Strip", "content": "a", "start": 2, "stop": 0}]}
    out["stories_metaspace_nofuse"] = t
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(REPO, "build", "tokref"))
    ap.add_argument("--quick", action="store_true", help="skip the large files (for a fast look)")
    ap.add_argument("--fuzz", type=int, default=400, help="number of random strings")
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)

    data = os.path.join(ASSETS, "data")
    files = {}
    files["sst2_dev"] = sst2_sentences(os.path.join(data, "sst2", "dev.tsv"))
    for name, rel in [("tinystories_cs336", "tinystories/tinystories_sample_cs336.txt"),
                      ("tinyshakespeare", "tinyshakespeare/input.txt"),
                      ("tinystories_2MiB", "tinystories/tinystories_train_sample_2MiB.txt")]:
        if args.quick and name != "tinystories_cs336":
            continue
        whole, lines = read_lines(os.path.join(data, rel))
        files[name] = lines
        files[name + "_whole"] = [whole]
    files["edge"] = EDGE_CASES
    files["fuzz"] = fuzz_strings(args.fuzz, seed=args.seed)

    small = ["sst2_dev", "edge", "fuzz", "tinystories_cs336", "tinystories_cs336_whole"]
    cases = [("gpt2", "assets/tokenizers/gpt2", None, list(files)),
             ("stories260K", "assets/models/stories260K", None, list(files))]
    for name, tj in synthetic_tokenizers().items():
        cases.append((name, name + "/tokenizer", tj, small))

    manifest = {"tokenizers_version": tokenizers.__version__, "cases": []}
    for name, tok_dir, tok_json, inputs in cases:
        case_dir = os.path.join(args.out, name)
        os.makedirs(case_dir, exist_ok=True)
        if tok_json is None:
            tok = Tokenizer.from_file(os.path.join(ASSETS, tok_dir[len("assets/"):], "tokenizer.json"))
        else:
            os.makedirs(os.path.join(args.out, tok_dir), exist_ok=True)
            with open(os.path.join(args.out, tok_dir, "tokenizer.json"), "w", encoding="utf-8") as f:
                json.dump(tok_json, f, ensure_ascii=False)
            tok = Tokenizer.from_file(os.path.join(args.out, tok_dir, "tokenizer.json"))
        written = []
        for inp in inputs:
            if inp not in files:
                continue
            write_jsonl(os.path.join(case_dir, inp + ".jsonl"), encode_records(tok, files[inp]))
            written.append(inp + ".jsonl")
        write_jsonl(os.path.join(case_dir, "decode.jsonl"), decode_records(tok, seed=len(name)))
        written.append("decode.jsonl")
        manifest["cases"].append({"name": name, "tokenizer_dir": tok_dir, "files": written,
                                  "vocab_size": tok.get_vocab_size(with_added_tokens=True)})
        print("%-28s %s" % (name, ", ".join(written)), file=sys.stderr)
    with open(os.path.join(args.out, "manifest.json"), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1)


if __name__ == "__main__":
    main()
