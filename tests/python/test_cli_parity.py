# zof from Python against the CLI (build/zof) with the same options: the same fine-tuned bytes,
# step log and summary keys; eval and generate give the CLI's JSON; errors the CLI's message.
import json
import subprocess

import pytest

import zof
from conftest import CLI, SHAKESPEARE, STORIES, require

OPTS = dict(task="text", steps=4, batch=2, seq_len=32, lr=1e-3, eps=1e-3, seed=7,
            eval_examples=4, train_examples=64, threads=2)


def cli(*args):
    return subprocess.run([str(require(CLI)), *map(str, args)], capture_output=True, text=True)


def flags(opts):
    out = []
    for k, v in opts.items():
        out += ["--" + k.replace("_", "-"), str(v)]
    return out


def test_finetune_equals_cli(tmp_path):
    require(STORIES), require(SHAKESPEARE)
    r = cli("finetune", "--model", STORIES, "--data", SHAKESPEARE, "--out", tmp_path / "cli",
            *flags(OPTS), "--json")
    assert r.returncode == 0, r.stderr
    cli_summary = json.loads(r.stdout.strip().splitlines()[-1])
    summary = zof.finetune(model=STORIES, data=SHAKESPEARE, out=tmp_path / "py", **OPTS)
    assert summary.keys() == cli_summary.keys()
    assert summary["steps"] == cli_summary["steps"] == OPTS["steps"]
    assert summary["train_loss"] == cli_summary["train_loss"]
    assert summary["eval"] == cli_summary["eval"]
    for f in ("model.safetensors", "zo_log.jsonl"):
        assert (tmp_path / "py" / f).read_bytes() == (tmp_path / "cli" / f).read_bytes(), f
    # replay from Python rebuilds the CLI run's weights.
    rep = zof.replay(STORIES, tmp_path / "cli", tmp_path / "replayed", threads=2)
    assert isinstance(rep, dict)
    assert ((tmp_path / "replayed" / "model.safetensors").read_bytes() ==
            (tmp_path / "cli" / "model.safetensors").read_bytes())


def test_eval_and_generate_equal_cli():
    require(STORIES)
    text = require(SHAKESPEARE.parent.parent / "tinystories" / "tinystories_sample_cs336.txt")
    r = cli("eval", "--model", STORIES, "--text", text, "--seq-len", 64, "--max-windows", 8,
            "--json")
    assert r.returncode == 0, r.stderr
    want = json.loads(r.stdout.strip().splitlines()[-1])
    m = zof.Model.load(STORIES)
    got = m.eval(text, seq_len=64, max_windows=8)
    assert got.keys() == want.keys()
    for k in ("nll", "ppl", "tokens", "windows", "seq_len"):
        assert got[k] == want[k], k
    r = cli("generate", "--model", STORIES, "--prompt", "Once upon a time", "--max-new-tokens", 20,
            "--temperature", 0.8, "--seed", 3, "--json")
    assert r.returncode == 0, r.stderr
    want = json.loads(r.stdout.strip().splitlines()[-1])
    got = m.generate("Once upon a time", max_new_tokens=20, temperature=0.8, seed=3)
    assert isinstance(got, str) and got == want["completion"]


def test_eval_and_generate_through_the_disk_tier_equal_in_ram(tmp_path):
    # host_mem= as `zof eval --host-mem`: at the model's least, blocks go to a scratch file in
    # offload_dir and each pass reads them back; logits, perplexity and tokens are the model's
    # in RAM, and the file goes with the Model.
    require(STORIES)
    text = require(SHAKESPEARE.parent.parent / "tinystories" / "tinystories_sample_cs336.txt")
    with pytest.raises(zof.Error, match=r"^host_mem 1\.00 KiB is below this model's least of "):
        zof.Model.load(STORIES, host_mem="1KiB", offload_dir=tmp_path)
    with pytest.raises(zof.Error) as e:
        zof.Model.load(STORIES, host_mem="1KiB", offload_dir=tmp_path)
    least = int(str(e.value).split("least of ")[1].split(" ")[0])
    with pytest.raises(TypeError, match="host_mem"):
        zof.Model.load(STORIES, offload_dir=tmp_path)
    (tmp_path / "afile").write_text("x")
    with pytest.raises(zof.Error, match="^offload_dir .*afile is not a directory"):
        zof.Model.load(STORIES, host_mem=least, offload_dir=tmp_path / "afile")
    ram = zof.Model.load(STORIES)
    tier = zof.Model.load(STORIES, host_mem=least, offload_dir=tmp_path)
    assert len(list(tmp_path.glob("zof-blocks-*.bin"))) == 1
    ids = [[1, 5, 9, 200, 7, 3], [1, 42, 17]]
    assert (tier.logits(ids) == ram.logits(ids)).all()
    want, got = ram.eval(text, seq_len=64, max_windows=8), tier.eval(text, seq_len=64, max_windows=8)
    for k in ("nll", "ppl", "tokens", "windows"):
        assert got[k] == want[k], k
    assert "blocks on disk" in got["disk_tier"]["describe"] and got["disk_tier"]["bytes_read"] > 0
    assert (tier.generate("Once upon a time", max_new_tokens=20, temperature=0.8, seed=3) ==
            ram.generate("Once upon a time", max_new_tokens=20, temperature=0.8, seed=3))
    del tier
    import gc
    gc.collect()
    assert list(tmp_path.glob("zof-blocks-*.bin")) == []


def test_eval_task_equals_cli():
    # A task's held-out metric from Python (eval(task=, data=)) is the CLI's eval --task.
    require(STORIES)
    data = require(SHAKESPEARE.parent.parent / "sst2")
    r = cli("eval", "--model", STORIES, "--task", "sst2", "--data", data, "--eval-examples", 16,
            "--seed", 5, "--json")
    assert r.returncode == 0, r.stderr
    want = json.loads(r.stdout.strip().splitlines()[-1])
    m = zof.Model.load(STORIES)
    got = m.eval(task="sst2", data=data, eval_examples=16, seed=5)
    assert got.keys() == want.keys()
    for k in ("task", "metric", "value", "data"):
        assert got[k] == want[k], k
    with pytest.raises(zof.Error, match="needs data="):
        m.eval(task="sst2")
    with pytest.raises(zof.Error, match="--eval-examples"):
        m.eval(task="sst2", data=data, eval_examples=0)
    with pytest.raises(TypeError, match="go with task="):
        m.eval(text="some text", data=data)


def cli_error(*args):
    r = cli(*args)
    assert r.returncode == 1
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith("zof: error: ")
    return line[len("zof: error: "):]


def test_errors_are_the_cli_message(tmp_path):
    require(STORIES), require(SHAKESPEARE)
    # A bad option value, found by the library's validation.
    want = cli_error("finetune", "--model", STORIES, "--data", SHAKESPEARE, "--out",
                     tmp_path / "a", "--estimator", "adagrad")
    with pytest.raises(zof.Error) as e:
        zof.finetune(model=STORIES, data=SHAKESPEARE, out=tmp_path / "b", estimator="adagrad")
    assert str(e.value) == want and isinstance(e.value, ValueError)
    # A check the CLI makes before the library is called.
    want = cli_error("finetune", "--model", STORIES, "--out", tmp_path / "c")
    with pytest.raises(zof.Error, match="^finetune needs --data") as e:
        zof.finetune(model=STORIES, out=tmp_path / "d")
    assert str(e.value) == want
    # A model directory that does not exist.
    want = cli_error("eval", "--model", tmp_path / "none", "--text", SHAKESPEARE)
    with pytest.raises(zof.Error) as e:
        zof.Model.load(tmp_path / "none")
    assert str(e.value) == want
    with pytest.raises(TypeError, match="unexpected keyword 'stepz'"):
        zof.finetune(model=STORIES, data=SHAKESPEARE, out=tmp_path / "e", stepz=3)


def test_resume_refuses_options_it_would_ignore(tmp_path):
    require(STORIES), require(SHAKESPEARE)
    run = tmp_path / "run"
    zof.finetune(model=STORIES, data=SHAKESPEARE, out=run, steps=2, batch=2, seq_len=32,
                 eval_examples=2, lr=1e-6)
    # The rule is the library's: the CLI's words, flags and all.
    with pytest.raises(zof.Error, match=r"so --steps 320 and --lr 0\.5 would be ignored") as e:
        zof.finetune(resume=run, steps=320, lr=0.5)
    assert "drop them" in str(e.value)
    # The saved values themselves (lr as the run stores it, a float32) and layout options pass
    # that check, and reach the next: the run finished, so there is nothing to resume.
    with pytest.raises(zof.Error, match=r"the run finished at step 2 of its --steps 2"):
        zof.finetune(resume=run, lr=1e-6, steps=2, threads=1)



def test_options_round_trip_cli_run_json_python_run_json(tmp_path):
    """Every saved option as the CLI wrote it into run.json, given back to Python as keywords,
    is written into the new run's run.json unchanged: one table reads and writes both."""
    require(STORIES), require(SHAKESPEARE)
    flags = ["--task", "text", "--objective", "lm", "--dtype", "fp32", "--save-dtype", "bf16",
             "--master", "bf16", "--steps", 2, "--lr", 3e-4, "--eps", 2e-3, "--weight-decay",
             0.01, "--batch", 2, "--micro-batches", 2, "--queries", 2, "--seed", 5,
             "--schedule", "cosine", "--z", "rademacher", "--one-sided", "--warmup", 1,
             "--eval-every", 1, "--save-every", 1, "--train-examples", 64, "--eval-examples", 2,
             "--seq-len", 32, "--max-bad-steps", 3, "--round-every", 2, "--threads", 1,
             "--no-report"]
    r = cli("finetune", "--model", STORIES, "--data", SHAKESPEARE, "--out", tmp_path / "cli",
            *flags)
    assert r.returncode == 0, r.stderr
    saved = json.loads((tmp_path / "cli" / "run.json").read_text())["options"]
    keys = {o["key"] for o in zof._TRAIN_OPTIONS if o["saved"]}
    assert set(saved) == keys
    given = dict(saved, out=tmp_path / "py")
    zof.finetune(threads=1, no_report=True, **given)
    again = json.loads((tmp_path / "py" / "run.json").read_text())["options"]
    assert again == dict(saved, out=str(tmp_path / "py"))
    for f in ("model.safetensors", "zo_log.jsonl"):
        assert (tmp_path / "py" / f).read_bytes() == (tmp_path / "cli" / f).read_bytes(), f
