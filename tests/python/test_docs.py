# The README and docs/ stay true to the tree and the CLI: every relative link reaches a file
# (and its #anchor a heading there, by GitHub's anchor rules), and every `zof <command> --flag`
# they show, in a code block or an inline code span, is a flag `zof <command> --help` lists;
# `zof.finetune(...)` keywords in Python blocks must be finetune flags too.
import ast
import functools
import re
import subprocess
import sys

import pytest

from conftest import CLI, REPO, require

COMMANDS = ("finetune", "eval", "generate", "replay", "report")
PYTHON_ONLY_KEYWORDS = {"on_step", "progress"}  # zof.finetune's own, not flags


def pages():
    return [REPO / "README.md"] + sorted((REPO / "docs").glob("*.md"))


# --- Markdown, as much of it as the checks need -------------------------------------------------

FENCE = re.compile(r"^\s*(```|~~~)\s*([\w+-]*)")


def split_blocks(text):
    """(prose, code blocks): prose is the text with every fenced block's lines blanked (so offsets
    keep their line numbers), each block (info string, first line number, lines)."""
    prose, blocks, block = [], [], None
    for n, line in enumerate(text.split("\n"), 1):
        m = FENCE.match(line)
        if block is None and m:
            block = (m.group(2), n + 1, [], m.group(1))
            line = ""
        elif block is not None and line.strip().startswith(block[3]):
            blocks.append(block[:3])
            block, line = None, ""
        elif block is not None:
            block[2].append(line)
            line = ""
        prose.append(line)
    assert block is None, "an unclosed code fence"
    return "\n".join(prose), blocks


def line_of(text, offset):
    return text.count("\n", 0, offset) + 1


# A code span may run over lines, never over a blank one (a paragraph's end).
CODE_SPAN = re.compile(r"(`+)((?:(?!\n[ \t]*\n).)+?)\1", re.S)
LINK = re.compile(r"!?\[(?:[^\[\]\n]|\n(?![ \t]*\n)|\[[^\]]*\])*\]"  # text, maybe over lines
                  r"\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")  # (target "title")
REF_DEF = re.compile(r"^[ ]{0,3}\[[^\]]+\]:[ \t]*<?(\S+?)>?(?:\s|$)", re.M)


def code_spans(prose):
    """(line number, content on one line) of every inline code span."""
    return [(line_of(prose, m.start()), " ".join(m.group(2).split()))
            for m in CODE_SPAN.finditer(prose)]


def links(text):
    """(line number, target) of every inline link, image and reference definition outside code
    (a link's text may run over lines)."""
    prose, _ = split_blocks(text)
    bare = CODE_SPAN.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), prose)
    found = sorted([*LINK.finditer(bare), *REF_DEF.finditer(bare)], key=lambda m: m.start())
    return [(line_of(bare, m.start()), m.group(1)) for m in found]


def slug(heading):
    """GitHub's anchor of a heading: the rendered text lowercased, every character but letters,
    digits, spaces, '-' and '_' removed, each space a '-'."""
    text = CODE_SPAN.sub(lambda m: m.group(2), heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link's text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(path):
    prose, _ = split_blocks(path.read_text(encoding="utf-8"))
    seen, out = {}, set()
    for line in prose.split("\n"):
        m = re.match(r"^\s{0,3}#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            base = slug(m.group(1))
            k = seen.get(base, 0)
            seen[base] = k + 1
            out.add(base if k == 0 else "%s-%d" % (base, k))
        out |= set(re.findall(r"<a\s+(?:name|id)=\"([^\"]+)\"", line))
    return out


def link_errors(page):
    errors = []
    for n, target in links(page.read_text(encoding="utf-8")):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        where = "%s:%d: %s" % (page.relative_to(REPO), n, target)
        if not dest.exists():
            errors.append(where + ": no such file")
        elif anchor:
            if dest.suffix != ".md":
                errors.append(where + ": an #anchor into a file that is not markdown")
            elif anchor not in anchors(dest):
                errors.append(where + ": no heading with this anchor in " + dest.name)
    return errors


# --- The commands the pages show -----------------------------------------------------------------

ZOF_CALL = re.compile(r"(?:^|(?<=[\s/(\"'`]))zof\s+(%s|--[\w-]+)\b" % "|".join(COMMANDS))
FLAG = re.compile(r"(?<![\w-])--[a-z0-9][a-z0-9-]*")
SHELL_END = re.compile(r"\s(?:\||;|&&|\|\|)\s|;\s*$")


def command_lines(text):
    """(line number, logical line) for each code-block command (continued by a trailing backslash
    or by indented lines after it), then each inline code span."""
    prose, blocks = split_blocks(text)
    out = []
    for info, first, lines in blocks:
        if info.lower() in ("python", "py"):
            continue
        current = None
        for i, line in enumerate(lines):
            if current is not None and (current[1].endswith("\\") or re.match(r"^\s+\S", line)):
                current = (current[0], current[1].rstrip("\\") + " " + line.strip())
                continue
            if current is not None:
                out.append(current)
            current = (first + i, line.rstrip())
        if current is not None:
            out.append(current)
    return out + code_spans(prose)


def zof_calls(text):
    """(line number, command or top-level flag, flags named) for every zof call the text shows."""
    calls = []
    for n, line in command_lines(text):
        found = list(ZOF_CALL.finditer(line))
        for k, m in enumerate(found):
            end = found[k + 1].start() if k + 1 < len(found) else len(line)
            rest = line[m.end():end]
            stop = SHELL_END.search(rest)
            rest = rest[:stop.start()] if stop else rest
            if m.group(1).startswith("--"):
                calls.append((n, None, [m.group(1)] + FLAG.findall(rest)))
            else:
                calls.append((n, m.group(1), FLAG.findall(rest)))
    return calls


def finetune_keywords(text):
    """(line number, keyword) of every keyword of a zof.finetune(...) call in a Python block."""
    _, blocks = split_blocks(text)
    out = []
    for info, first, lines in blocks:
        if info.lower() not in ("python", "py"):
            continue
        for node in ast.walk(ast.parse("\n".join(lines))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "finetune" and isinstance(node.func.value, ast.Name)
                    and node.func.value.id == "zof"):
                out += [(first + node.lineno - 1, k.arg) for k in node.keywords if k.arg]
    return out


@functools.lru_cache(maxsize=None)
def help_flags(command):
    """The flags `zof [command] --help` lists in its options column."""
    args = [str(CLI)] + ([command] if command else []) + ["--help"]
    r = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, "%s: %s" % (" ".join(args), r.stderr)
    flags = set(re.findall(r"^\s+(?:-\w,)?(--[a-z0-9][a-z0-9-]*)", r.stdout, re.M))
    assert "--help" in flags, r.stdout
    return frozenset(flags)


def flag_errors(page):
    text = page.read_text(encoding="utf-8")
    errors = []
    for n, command, flags in zof_calls(text):
        known = help_flags(command)
        errors += ["%s:%d: zof %s has no %s" % (page.relative_to(REPO), n, command or "", f)
                   for f in flags if f not in known]
    for n, keyword in finetune_keywords(text):
        flag = "--" + keyword.replace("_", "-")
        if keyword not in PYTHON_ONLY_KEYWORDS and flag not in help_flags("finetune"):
            errors.append("%s:%d: zof.finetune has no keyword %s (no finetune flag %s)"
                          % (page.relative_to(REPO), n, keyword, flag))
    return errors


# --- Tests ---------------------------------------------------------------------------------------

def test_the_docs_are_there():
    names = {p.name for p in pages()}
    assert "README.md" in names and len(names) > 1, "docs/*.md is missing"
    assert len(links((REPO / "README.md").read_text(encoding="utf-8"))) > 5


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(REPO)))
def test_links_reach_a_file_and_heading(page):
    errors = link_errors(page)
    assert not errors, "\n".join(errors)


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(REPO)))
def test_commands_use_flags_the_cli_has(page):
    require(CLI)
    errors = flag_errors(page)
    assert not errors, "\n".join(errors)


def test_the_readme_shows_zof_commands():
    require(CLI)
    calls = zof_calls((REPO / "README.md").read_text(encoding="utf-8"))
    assert any(c == "finetune" and flags for _, c, flags in calls), calls


def test_the_checks_catch_a_broken_link_and_an_unknown_flag(tmp_path, monkeypatch):
    # The checkers themselves: a page with one good and one bad of each must give exactly the bad.
    require(CLI)
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A title: `x`, y (z)\n\n## Twice\n\n## Twice\n")
    page = tmp_path / "README.md"
    page.write_text(
        "See [a](docs/a.md#a-title-x-y-z), [b](docs/a.md#twice-1), [c](docs/missing.md), "
        "[d](docs/a.md#nothing), [e](https://example.com/x), `[not a link](nowhere.md)`,\n"
        "[a link over\ntwo lines](docs/a.md#twice-2), `zof eval --model M\n--steps 1`.\n\n"
        "```sh\nbuild/zof finetune --model M --steps 3 \\\n  --no-such-flag 1\n"
        "build/zof eval --model M --text F\n  --seq-len 8 --steps 3\n```\n\n"
        "Inline: `zof report RUN --out x.html --bogus` and `zof --version`.\n\n"
        "```python\nzof.finetune(model='m', seq_len=8, on_step=print, sequence_len=8)\n```\n")
    assert [e.split(": ", 1)[1] for e in link_errors(page)] == [
        "docs/missing.md: no such file", "docs/a.md#nothing: no heading with this anchor in a.md",
        "docs/a.md#twice-2: no heading with this anchor in a.md"]
    errors = flag_errors(page)
    assert [e.split(": ", 1)[1] for e in errors] == [
        "zof finetune has no --no-such-flag", "zof eval has no --steps", "zof eval has no --steps",
        "zof report has no --bogus",
        "zof.finetune has no keyword sequence_len (no finetune flag --sequence-len)"], errors
