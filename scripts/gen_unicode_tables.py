#!/usr/bin/env python3
r"""Generates src/hf/unicode_tables.inc: the Unicode data zof's tokenizer needs (general
categories for the pre-tokenizer regexes, \w as Rust's regex crate defines it for added tokens'
single_word, Rust's char::is_numeric for the Digits pre-tokenizer, lowercase mappings, canonical
combining classes, decompositions and compositions for NFC/NFD/NFKC/NFKD).

Source: Python's unicodedata. Where Hugging Face `tokenizers` (if installed) runs another Unicode
version, its behaviour wins, character by character, so that zof tokenizes as it does: the
general categories of its regex engine (Oniguruma: \p{L}, \p{N}, \p{M}, \s), its NFD/NFKD
decompositions, compositions, combining classes and lowercase (Rust's char::to_lowercase).
\w and is_numeric come from the `regex` package (a recent Unicode, as Rust's), \w limited to the
characters Oniguruma knows; without it, from unicodedata, letters and letter-numbers standing for
Alphabetic. The header of the output records what was used.

Usage: python3 scripts/gen_unicode_tables.py [--out src/hf/unicode_tables.inc]
The output is committed; rerun it after moving to another tokenizers or Python version.
"""
import argparse
import os
import sys
import unicodedata

MAX_CP = 0x110000
HANGUL_FIRST, HANGUL_LAST = 0xAC00, 0xD7A3

LETTER, NUMBER, WORD, MARK, NUMERIC = 1, 2, 4, 8, 16


def word_predicate():
    """\\w as Rust's regex crate defines it, from the regex package (a recent Unicode)."""
    try:
        import regex  # type: ignore
    except ImportError:
        return None, "\\w from unicodedata, Alphabetic approximated (regex package not installed)"
    pat = regex.compile(r"[\p{Alphabetic}\p{M}\p{Pc}\p{Nd}\p{Join_Control}]")
    return (lambda ch: pat.match(ch) is not None), "\\w from regex %s" % regex.__version__


def numeric_predicate():
    """Rust's char::is_numeric (N*), from the regex package: Rust's std follows Unicode closely."""
    try:
        import regex  # type: ignore
    except ImportError:
        return None
    pat = regex.compile(r"\p{N}")
    return lambda ch: pat.match(ch) is not None


def category_flags(is_word, hf_sets):
    is_numeric = numeric_predicate()
    flags = [0] * MAX_CP
    for cp in range(MAX_CP):
        cat = unicodedata.category(chr(cp))
        f = 0
        if hf_sets is not None:
            f |= (LETTER if cp in hf_sets["L"] else 0) | (NUMBER if cp in hf_sets["N"] else 0)
            f |= MARK if cp in hf_sets["M"] else 0
        else:
            f |= (LETTER if cat[0] == "L" else 0) | (NUMBER if cat[0] == "N" else 0)
            f |= MARK if cat[0] == "M" else 0
        if is_numeric is not None:
            f |= NUMERIC if is_numeric(chr(cp)) else 0
        else:
            f |= NUMERIC if cat[0] == "N" else 0
        # \w of Rust's regex crate: Alphabetic, M*, Pc, Nd, Join_Control.
        if is_word is not None:
            known = hf_sets is None or cp not in hf_sets["Cn"]
            f |= WORD if known and is_word(chr(cp)) else 0
        elif cat[0] in "LM" or cat in ("Nl", "Pc", "Nd") or cp in (0x200C, 0x200D):
            f |= WORD
        flags[cp] = f
    return flags


def ranges(values):
    """(first, last, value) for runs of equal non-zero values."""
    out = []
    start = None
    for cp in range(MAX_CP + 1):
        v = values[cp] if cp < MAX_CP else 0
        if start is not None and v != values[start]:
            out.append((start, cp - 1, values[start]))
            start = None
        if start is None and v != 0:
            start = cp
    return out


def full_decompositions(form):
    table = []
    for cp in range(MAX_CP):
        if HANGUL_FIRST <= cp <= HANGUL_LAST or 0xD800 <= cp <= 0xDFFF:
            continue
        s = chr(cp)
        d = unicodedata.normalize(form, s)
        if d != s:
            table.append((cp, [ord(c) for c in d]))
    return table


def compositions():
    out = []
    for cp in range(MAX_CP):
        if HANGUL_FIRST <= cp <= HANGUL_LAST or 0xD800 <= cp <= 0xDFFF:
            continue
        dec = unicodedata.decomposition(chr(cp))
        if not dec or dec.startswith("<"):
            continue
        parts = [int(p, 16) for p in dec.split()]
        if len(parts) != 2:
            continue
        # Primary composites only: excluded and non-starter decompositions do not survive NFC.
        if unicodedata.normalize("NFC", chr(cp)) != chr(cp):
            continue
        if unicodedata.combining(chr(parts[0])) != 0:
            continue
        out.append((parts[0], parts[1], cp))
    out.sort()
    return out


def lowercase():
    table = []
    for cp in range(MAX_CP):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        s = chr(cp)
        lo = s.lower()
        if lo != s:
            table.append((cp, [ord(c) for c in lo]))
    return table


ALL_CHARS = "".join(chr(cp) for cp in range(MAX_CP) if not 0xD800 <= cp <= 0xDFFF)


def hf_tokenizers():
    try:
        import tokenizers  # type: ignore
        return tokenizers
    except ImportError:
        return None


def hf_class_members(tk, regex):
    """Code points the tokenizers regex engine matches with a one-character class."""
    from tokenizers import pre_tokenizers, Regex  # type: ignore
    kept = pre_tokenizers.Split(Regex(regex), "removed").pre_tokenize_str(ALL_CHARS)
    out, prev = set(), 0
    for _, (a, b) in kept:
        out.update(ord(ALL_CHARS[k]) for k in range(prev, a))
        prev = b
    out.update(ord(ALL_CHARS[k]) for k in range(prev, len(ALL_CHARS)))
    return out


def hf_per_char(normalizer):
    """normalizer applied to every code point (U+0000 separates them: a starter that neither
    decomposes, composes nor changes case)."""
    chars = ALL_CHARS[1:]
    out = normalizer.normalize_str("\x00".join(chars)).split("\x00")
    assert len(out) == len(chars)
    return {ord(c): r for c, r in zip(chars, out)}


def hf_batch(normalizer, strings):
    out = normalizer.normalize_str("\x00".join(strings)).split("\x00")
    assert len(out) == len(strings)
    return out


def tuple_entry(e):
    return (e[0], tuple(e[1]))


def emit_rows(f, rows, per_line):
    for i in range(0, len(rows), per_line):
        f.write("    " + " ".join(rows[i:i + per_line]) + "\n")


def emit_mapping(f, name, table):
    data = []
    rows = []
    for cp, seq in table:
        rows.append("{0x%X, %d, %d}," % (cp, len(data), len(seq)))
        data.extend(seq)
    f.write("inline constexpr Mapping k%s[] = {\n" % name)
    emit_rows(f, rows, 5)
    f.write("};\n")
    f.write("inline constexpr char32_t k%sData[] = {\n" % name)
    emit_rows(f, ["0x%X," % c for c in data], 10)
    f.write("};\n\n")


def main():
    ap = argparse.ArgumentParser()
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.join(here, "..", "src", "core", "unicode_tables.inc"))
    args = ap.parse_args()

    is_word, word_src = word_predicate()
    tk = hf_tokenizers()
    hf_sets = None
    ccc_values = [unicodedata.combining(chr(cp)) if not 0xD800 <= cp <= 0xDFFF else 0 for cp in range(MAX_CP)]
    nfd = full_decompositions("NFD")
    nfkd = full_decompositions("NFKD")
    comp = compositions()
    lower = lowercase()
    aligned = "not aligned (tokenizers not installed)"
    if tk is not None:
        from tokenizers import normalizers  # type: ignore
        hf_sets = {k: hf_class_members(tk, r"\p{%s}" % k) for k in ("L", "N", "M", "Cn")}
        ws = hf_class_members(tk, r"\s")
        assert ws == {0x9, 0xA, 0xB, 0xC, 0xD, 0x20, 0x85, 0xA0, 0x1680, 0x2028, 0x2029, 0x202F, 0x205F,
                      0x3000} | set(range(0x2000, 0x200B)), "\\s differs from unicode.h's is_whitespace"
        changed = 0
        for form, table in (("NFD", nfd), ("NFKD", nfkd)):
            hf = hf_per_char(getattr(normalizers, form)())
            new = [(cp, [ord(c) for c in hf[cp]]) for cp in sorted(hf)
                   if hf[cp] != chr(cp) and not HANGUL_FIRST <= cp <= HANGUL_LAST]
            changed += len(set(map(tuple_entry, new)) ^ set(map(tuple_entry, table)))
            table[:] = new
        hf_nfc = hf_batch(normalizers.NFC(), [chr(a) + chr(b) for a, b, _ in comp])
        kept = [c for c, r in zip(comp, hf_nfc) if r == chr(c[2])]
        changed += len(comp) - len(kept)
        comp = kept
        # Combining classes: a mark with class k moves before U+0301 (230) when 0 < k < 230, and
        # U+0316 (220) moves before it when k > 220; where tokenizers does neither, it has class 0.
        marks = [cp for cp in range(MAX_CP) if ccc_values[cp]]
        p1 = hf_batch(normalizers.NFD(), ["a\u0301" + chr(cp) for cp in marks])
        p2 = hf_batch(normalizers.NFD(), ["a" + chr(cp) + "\u0316" for cp in marks])
        for cp, r1, r2 in zip(marks, p1, p2):
            k = ccc_values[cp]
            moved1 = r1 == "a" + chr(cp) + "\u0301"
            moved2 = r2 == "a\u0316" + chr(cp)
            if (0 < k < 230 and not moved1) or (k > 220 and not moved2):
                ccc_values[cp] = 0
                changed += 1
        hf = hf_per_char(normalizers.Lowercase())
        new = [(cp, [ord(c) for c in hf[cp]]) for cp in sorted(hf) if hf[cp] != chr(cp)]
        changed += len(set(map(tuple_entry, new)) ^ set(map(tuple_entry, lower)))
        lower = new
        aligned = "aligned with tokenizers %s (%d normalization entries changed)" % (tk.__version__, changed)
    cats = ranges(category_flags(is_word, hf_sets))
    ccc = ranges(ccc_values)

    with open(args.out, "w", encoding="utf-8") as f:
        f.write("// Generated by scripts/gen_unicode_tables.py from Python %s unicodedata (Unicode %s);\n"
                % (sys.version.split()[0], unicodedata.unidata_version))
        f.write("// %s; %s.\n// Do not edit; rerun the script.\n" % (word_src, aligned))
        f.write("// Included by src/hf/unicode.cpp only, inside namespace zof::unicode::tables.\n\n")
        f.write("inline constexpr char kUnicodeVersion[] = \"%s\";\n\n" % unicodedata.unidata_version)
        f.write("// flags: 1 letter (L*), 2 number (N*), 4 \\w (Alphabetic, M*, Pc, Nd, Join_Control), 8 mark (M*),\n"
                "// 16 Rust's char::is_numeric (N*; Rust's std may know newer characters than Oniguruma).\n")
        f.write("inline constexpr Range kCategories[] = {\n")
        emit_rows(f, ["{0x%X, 0x%X, %d}," % r for r in cats], 4)
        f.write("};\n\n")
        f.write("// Canonical combining class, non-zero runs.\n")
        f.write("inline constexpr Range kCombiningClass[] = {\n")
        emit_rows(f, ["{0x%X, 0x%X, %d}," % r for r in ccc], 4)
        f.write("};\n\n")
        f.write("// Full (recursive) decompositions, Hangul syllables excluded (done by formula).\n")
        emit_mapping(f, "CanonicalDecomposition", nfd)
        emit_mapping(f, "CompatDecomposition", nfkd)
        f.write("// Lowercase, one code point at a time (as Rust's char::to_lowercase).\n")
        emit_mapping(f, "Lowercase", lower)
        f.write("// Primary composites (first, second) -> composite, sorted; Hangul excluded.\n")
        f.write("inline constexpr Composition kCompositions[] = {\n")
        emit_rows(f, ["{0x%X, 0x%X, 0x%X}," % c for c in comp], 4)
        f.write("};\n")
    print("wrote %s: %d category ranges, %d ccc ranges, %d NFD, %d NFKD, %d compositions, %d lowercase"
          % (args.out, len(cats), len(ccc), len(nfd), len(nfkd), len(comp), len(lower)))


if __name__ == "__main__":
    main()
