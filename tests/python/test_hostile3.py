# The Python face as strict as the CLI (the third hostile pass): every keyword read and refused as
# the CLI reads its flag, with the CLI's message; files checked by the library (a FIFO never
# opened); a path that is not a readable file raises instead of being scored as text.
import json
import math
import os
import subprocess
import sys

import pytest

import zof
from conftest import CLI, SHAKESPEARE, STORIES, require

SHORT = dict(task="text", steps=2, batch=2, seq_len=32, eval_examples=2, threads=1,
             no_report=True)


def cli_error(*args):
    r = subprocess.run([str(require(CLI)), *map(str, args)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 1, r.stderr
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith("zof: error: ")
    return line[len("zof: error: "):]


def py_error(fn):
    with pytest.raises(zof.Error) as e:
        fn()
    return str(e.value)


@pytest.fixture(scope="module")
def model():
    require(STORIES)
    return zof.Model.load(STORIES, threads=1)


# ---- eval: a path is a file, else an error; text goes as text= ------------------------------

def test_eval_on_a_fifo_raises_without_opening_it(tmp_path):
    require(STORIES)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    # In a child process: a regression would block for ever on the open.
    code = ("import pathlib, zof\n"
            "m = zof.Model.load(%r, threads=1)\n"
            "try:\n"
            "    m.eval(pathlib.Path(%r))\n"
            "except zof.Error as e:\n"
            "    print(e)\n" % (str(STORIES), str(fifo)))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == cli_error("eval", "--model", STORIES, "--text", fifo)
    assert "is a FIFO (named pipe), not a file" in r.stdout


@pytest.mark.parametrize("what", ["missing", "device", "directory"])
def test_eval_of_a_path_that_is_no_file_raises_the_cli_message(model, tmp_path, what):
    path = {"missing": str(tmp_path / "nonexistent.txt"), "device": "/dev/zero",
            "directory": str(tmp_path)}[what]
    want = cli_error("eval", "--model", STORIES, "--text", path)
    got = py_error(lambda: model.eval(path))
    assert got.startswith(want), (got, want)
    # It is never scored as text (the string was: ppl 578.9 over 28 tokens).
    assert "ppl" not in got


def test_eval_takes_text_as_text_and_files_as_paths(model, tmp_path):
    text = "Once upon a time there was a little girl. She liked to play outside."
    f = tmp_path / "story.txt"
    f.write_text(text)
    by_text = model.eval(text=text, seq_len=16)
    by_path = model.eval(f, seq_len=16)
    by_str = model.eval(str(f), seq_len=16)
    assert by_text["tokens"] == by_path["tokens"] == by_str["tokens"] > 0
    assert by_text["nll"] == by_path["nll"] == by_str["nll"]
    # A string that names no file says how to score it as text.
    assert "pass it as text=" in py_error(lambda: model.eval(text[:20]))
    with pytest.raises(TypeError):
        model.eval()
    with pytest.raises(TypeError):
        model.eval(f, text=text)


# ---- every number read as the CLI reads it ------------------------------------------------------

@pytest.mark.parametrize("flag,value,call", [
    ("--seq-len", -5, lambda m, v: m.eval(text="a b c", seq_len=v)),
    ("--seq-len", 0, lambda m, v: m.eval(text="a b c", seq_len=v)),
    ("--batch", 0, lambda m, v: m.eval(text="a b c", batch=v)),
    ("--max-windows", -1, lambda m, v: m.eval(text="a b c", max_windows=v)),
    ("--max-windows", 1.5, lambda m, v: m.eval(text="a b c", max_windows=v)),
])
def test_eval_numbers_refused_as_the_cli(model, tmp_path, flag, value, call):
    f = tmp_path / "t.txt"
    f.write_text("a b c")
    want = cli_error("eval", "--model", STORIES, "--text", f, flag, value)
    assert py_error(lambda: call(model, value)) == want


@pytest.mark.parametrize("flag,value", [
    ("--temperature", 1e-45), ("--temperature", -1.0), ("--temperature", math.inf),
    ("--top-p", 0.0), ("--top-p", 1e39), ("--max-new-tokens", 0), ("--max-new-tokens", 2.5),
    ("--seed", -1),
])
def test_generate_numbers_refused_as_the_cli(model, flag, value):
    want = cli_error("generate", "--model", STORIES, flag, repr(value) if isinstance(value, float)
                     else value)
    key = flag[2:].replace("-", "_")
    assert py_error(lambda: model.generate("Once", **{key: value})) == want


def test_threads_refused_as_the_cli(tmp_path):
    require(STORIES), require(SHAKESPEARE)
    want = cli_error("eval", "--model", STORIES, "--text", SHAKESPEARE, "--threads", -1)
    assert py_error(lambda: zof.Model.load(STORIES, threads=-1)) == want
    run = tmp_path / "run"
    zof.finetune(model=STORIES, data=SHAKESPEARE, out=run, **SHORT)
    want = cli_error("replay", "--model", STORIES, "--log", run, "--out", tmp_path / "a",
                     "--threads", -1)
    assert py_error(lambda: zof.replay(STORIES, run, tmp_path / "b", threads=-1)) == want
    assert not (tmp_path / "b").exists()


def test_logits_refuse_fractional_and_out_of_range_ids(model):
    assert "whole numbers, not 1.7" in py_error(lambda: model.logits([1.7, 2.2]))
    assert (model.logits([1.0, 2.0]) == model.logits([1, 2])).all()
    vocab = model.config["vocab_size"]
    assert "outside the model's vocabulary" in py_error(lambda: model.logits([1, vocab]))
    assert "outside the model's vocabulary" in py_error(lambda: model.logits([-1]))


def test_every_cli_flag_is_a_keyword(tmp_path):
    require(STORIES), require(SHAKESPEARE)
    s = zof.finetune(model=STORIES, data=SHAKESPEARE, out=tmp_path / "r", **SHORT)
    assert s["steps"] == 2
    assert not (tmp_path / "r" / "report.html").exists()  # no_report=True was honoured


# ---- the option table through both faces --------------------------------------------------------

def bad_values(option):
    """Values the CLI refuses for an option, from the library's table: a number that is none or
    beyond any range, a switch given a word, a word no option takes (a path under a file)."""
    if option["kind"] == "number":
        return ["x1", "-1e999", "1e999"]
    if option["kind"] == "switch":
        return ["maybe"]
    return [str(STORIES / "config.json" / "x")]


@pytest.mark.parametrize("option", zof._TRAIN_OPTIONS, ids=lambda o: o["key"])
def test_every_option_refuses_what_the_cli_refuses(tmp_path, option):
    require(STORIES), require(SHAKESPEARE)
    key = option["key"]
    base = dict(model=STORIES, data=SHAKESPEARE, out=tmp_path / "out", steps=1, batch=1,
                seq_len=8, eval_examples=1, threads=1)
    for value in bad_values(option):
        opts = {k: v for k, v in base.items() if k != key}
        flags = []
        for k, v in opts.items():
            flags += ["--" + k.replace("_", "-"), str(v)]
        want = cli_error("finetune", *flags, "--" + key.replace("_", "-") + "=" + value)
        got = py_error(lambda: zof.finetune(**opts, **{key: value}))
        assert got == want, (key, value)
        assert not (tmp_path / "out").exists(), (key, value)


# ---- --resume's rule, one for both faces ---------------------------------------------------------

def test_resume_rule_is_the_clis(tmp_path):
    require(STORIES), require(SHAKESPEARE)
    run = tmp_path / "run"
    zof.finetune(model=STORIES, data=SHAKESPEARE, out=run, master="bf16", **SHORT)
    # Restating the run's own values passes the rule (the run has finished: that is the refusal).
    for extra in (dict(round_every=8), dict(round_every=8, master="bf16"), dict(dtype="auto"),
                  dict(round_every=0, save_dtype="auto")):
        msg = py_error(lambda: zof.finetune(resume=run, **extra))
        assert "the run finished at step 2" in msg, (extra, msg)
    # A change is refused in the CLI's words.
    want = cli_error("finetune", "--resume", run, "--steps", 320, "--lr", 0.5)
    assert py_error(lambda: zof.finetune(resume=run, steps=320, lr=0.5)) == want
    assert "so --steps 320 and --lr 0.5 would be ignored" in want
    # A run.json from before --objective and --z: the legacy values come from the library for
    # both faces (Python once had no entry for them and let a change pass).
    with open(run / "run.json") as f:
        saved = json.load(f)
    for k in ("objective", "z"):
        saved["options"].pop(k)
    for k in ("seal", "format"):
        saved.pop(k, None)
    with open(run / "run.json", "w") as f:
        json.dump(saved, f)
    # An older zof's checkpoints recorded no seal of run.json either.
    for state in run.glob("checkpoint-*/state.json"):
        st = json.loads(state.read_text())
        st.pop("run_seal", None)
        state.write_text(json.dumps(st))
    want = cli_error("finetune", "--resume", run, "--z", "rademacher")
    assert "--z rademacher would be ignored (the run has --z gaussian)" in want
    assert py_error(lambda: zof.finetune(resume=run, z="rademacher")) == want


def test_import_under_python_oo():
    # -OO strips docstrings; finetune's is built from the option table at import.
    r = subprocess.run([sys.executable, "-OO", "-c", "import zof; print(len(zof._TRAIN_FIELDS))"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert int(r.stdout) == len(zof._TRAIN_FIELDS)


def test_eval_hint_is_only_for_a_missing_file(model, tmp_path):
    # A number refused before the file is looked at gets the CLI's message, no hint about text=.
    missing = str(tmp_path / "missing.txt")
    want = cli_error("eval", "--model", STORIES, "--text", missing, "--seq-len", 1)
    assert py_error(lambda: model.eval(missing, seq_len=1)) == want


def test_switches_take_the_clis_words(tmp_path):
    require(STORIES), require(SHAKESPEARE)
    # --no-report=yes on the command line; no_report="yes" (and numpy's bool) in Python.
    import numpy as np
    zof.finetune(model=STORIES, data=SHAKESPEARE, out=tmp_path / "a",
                 **dict(SHORT, no_report="yes"))
    zof.finetune(model=STORIES, data=SHAKESPEARE, out=tmp_path / "b",
                 **dict(SHORT, no_report=np.bool_(True)))
    assert not (tmp_path / "a" / "report.html").exists()
    assert not (tmp_path / "b" / "report.html").exists()


def test_resume_with_objective_auto_restates_the_runs_choice(tmp_path):
    require(STORIES), require(SHAKESPEARE)
    run = tmp_path / "run"
    zof.finetune(model=STORIES, data=SHAKESPEARE, out=run, **SHORT)  # text: auto is lm
    assert "the run finished at step 2" in py_error(
        lambda: zof.finetune(resume=run, objective="auto"))
    want = cli_error("finetune", "--resume", run, "--objective", "classification")
    assert "--objective classification would be ignored (the run has --objective lm)" in want
