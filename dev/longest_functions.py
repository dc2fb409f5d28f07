#!/usr/bin/env python3
"""Lists the longest C++/CUDA function bodies under the given folders (the restructure's guide:
no function longer than about 80 lines). A heuristic, not a parser: a function is a line ending
in `{` (or a `{` line after a signature) that opens a body at namespace or class depth, whose
text before the brace has a `(` and is not a control statement, lambda or type definition.
    dev/longest_functions.py src tools [--top 10] [--over 80]
"""
import argparse
import pathlib
import re

EXTS = {".cpp", ".cc", ".h", ".hpp", ".cu", ".cuh"}
NOT_FUNC = re.compile(r"^\s*(if|for|while|switch|catch|do|else|namespace|struct|class|enum|union)\b")


def strip(line):
    line = re.sub(r'"(\\.|[^"\\])*"', '""', line)
    line = re.sub(r"'(\\.|[^'\\])*'", "''", line)
    return line.split("//")[0]


def functions(path):
    lines = path.read_text(errors="replace").splitlines()
    out, depth, stack, sig = [], 0, [], []
    in_comment = False
    for no, raw in enumerate(lines, 1):
        line = raw
        if in_comment:
            if "*/" not in line:
                continue
            line, in_comment = line.split("*/", 1)[1], False
        if "/*" in line and "*/" not in line.split("/*", 1)[1]:
            line, in_comment = line.split("/*", 1)[0], True
        line = strip(line)
        if line.strip().startswith("#"):
            continue
        cur = ""
        for ch in line:
            if ch == "{":
                text = (" ".join(sig) + " " + cur).strip()
                is_func = ("(" in text and not NOT_FUNC.search(text) and "=" not in text.split("(")[0]
                           and not text.rstrip().endswith(("]", "->")) and "[" not in text.split("(")[0]
                           and all(kind != "func" for kind, _, _ in stack))
                name = re.findall(r"([~\w:<>]+)\s*\(", text)
                stack.append(("func" if is_func else "block", no, name[0] if name else "?"))
                sig, cur = [], ""
            elif ch == "}":
                if stack:
                    kind, start, name = stack.pop()
                    if kind == "func":
                        out.append((no - start + 1, f"{path}:{start}", name))
                sig, cur = [], ""
            elif ch == ";":
                sig, cur = [], ""
            else:
                cur += ch
        if cur.strip():
            sig.append(cur)
            sig = sig[-6:]
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dirs", nargs="+")
    ap.add_argument("--top", type=int, default=10)
    ap.add_argument("--over", type=int, default=0, help="also count the functions longer than this")
    a = ap.parse_args()
    found = []
    for d in a.dirs:
        for p in sorted(pathlib.Path(d).rglob("*")):
            if p.suffix in EXTS and p.is_file():
                found += functions(p)
    found.sort(reverse=True)
    for n, where, name in found[: a.top]:
        print(f"{n:5d}  {name:40s} {where}")
    if a.over:
        print(f"{sum(1 for n, _, _ in found if n > a.over)} functions over {a.over} lines")


if __name__ == "__main__":
    main()
