"""Writes the small tokenizers of fuzz/tokenizers/ (run with the venv of scripts/setup.sh, which has
Hugging Face tokenizers): BPE models trained on a few KB of shared/assets text, each with a
different pipeline that zof implements, so fuzz_tokenizer_text and the fuzz_tokenizer corpus
cover byte-level, LLaMA-3-style and SentencePiece-style tokenizers without a large file.

    build/venv/bin/python fuzz/make_tokenizers.py ../shared/assets
"""
import json
import pathlib
import sys

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

assets = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "../shared/assets")
out = pathlib.Path(__file__).resolve().parent / "tokenizers"
text = (assets / "data/tinystories/tinystories_sample_cs336.txt").read_text()
text += "\nCafé déjà vu: naïve coöperation. Straße 123 456789 ½ ﬁ ㈱ 한국어 日本語 Ελληνικά ✓ 🙂\r\n\t"
lines = [l for l in text.splitlines() if l.strip()]
LLAMA3 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"


def save(tok, name, config=None):
    d = out / name
    d.mkdir(parents=True, exist_ok=True)
    tok.save(str(d / "tokenizer.json"), pretty=False)
    if config:
        (d / "tokenizer_config.json").write_text(json.dumps(config))


# GPT-2 style: byte-level BPE, <|endoftext|>, a non-special added token with lstrip/rstrip.
t = Tokenizer(models.BPE())
t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
t.decoder = decoders.ByteLevel()
t.post_processor = processors.ByteLevel(trim_offsets=False)
t.train_from_iterator(lines, trainers.BpeTrainer(vocab_size=400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                 special_tokens=["<|endoftext|>"], show_progress=False))
from tokenizers import AddedToken
t.add_tokens([AddedToken(" <mask>", lstrip=True, rstrip=True, single_word=True, normalized=False)])
save(t, "bytelevel", {"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"})

# LLaMA-3 style: Split on its regex then byte-level without a regex, NFC, a BOS template.
t = Tokenizer(models.BPE(ignore_merges=True))
t.normalizer = normalizers.NFC()
t.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(LLAMA3), behavior="isolated"),
                                           pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
t.decoder = decoders.ByteLevel()
t.train_from_iterator(lines, trainers.BpeTrainer(vocab_size=420, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                 special_tokens=["<|begin_of_text|>", "<|end_of_text|>"],
                                                 show_progress=False))
t.post_processor = processors.TemplateProcessing(single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", 0)])
save(t, "llama3", {"bos_token": "<|begin_of_text|>", "eos_token": {"content": "<|end_of_text|>"}})

# SentencePiece style: NFKC + lowercase + runs of spaces collapsed, Metaspace, digits split,
# byte fallback, <unk>, and the decoder chain LLaMA-2 uses.
t = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
t.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase(),
                                     normalizers.Replace(Regex(" {2,}"), " "), normalizers.Strip()])
t.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                           pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first")])
t.decoder = decoders.Sequence([decoders.Metaspace(replacement="\u2581", prepend_scheme="first"),
                               decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(content=" ", left=1, right=0)])
t.train_from_iterator(lines, trainers.BpeTrainer(vocab_size=450, special_tokens=["<unk>", "<s>", "</s>"] +
                                                 [f"<0x{b:02X}>" for b in range(256)], show_progress=False))
t.post_processor = processors.TemplateProcessing(single="<s> $A </s>", special_tokens=[("<s>", 1), ("</s>", 2)])
save(t, "sentencepiece", {"bos_token": "<s>", "eos_token": "</s>", "pad_token": None})
