# The step callback: it sees every step, returning False stops the run with a checkpoint that
# resume= continues exactly, and Ctrl-C (SIGINT) saves one and raises KeyboardInterrupt.
import logging
import os
import signal

import pytest

import zof
from conftest import SHAKESPEARE, STORIES, require

OPTS = dict(task="text", batch=2, seq_len=32, lr=1e-3, seed=5, eval_examples=4,
            train_examples=64, threads=2)


@pytest.fixture(autouse=True)
def assets():
    require(STORIES), require(SHAKESPEARE)


def test_on_step_sees_every_step(tmp_path, caplog):
    seen = []
    with caplog.at_level(logging.INFO, logger="zof"):
        s = zof.finetune(model=STORIES, data=SHAKESPEARE, out=tmp_path / "run", steps=6,
                         on_step=lambda m: seen.append(m))
    assert [m["step"] for m in seen] == [1, 2, 3, 4, 5, 6]
    assert all(m["steps"] == 6 and m["record"]["step"] == m["step"] - 1 for m in seen)
    assert s["steps"] == 6 and "interrupted" not in s
    assert any(r.name == "zof" and "step 6/6" in r.getMessage() for r in caplog.records)


def test_false_stops_with_a_checkpoint_and_resume_continues(tmp_path):
    full = zof.finetune(model=STORIES, data=SHAKESPEARE, out=tmp_path / "full", steps=6, **OPTS)
    seen = []

    def stop_at_2(m):
        seen.append(m["step"])
        return m["step"] != 2

    s = zof.finetune(model=STORIES, data=SHAKESPEARE, out=tmp_path / "run", steps=6,
                     on_step=stop_at_2, **OPTS)
    assert s["interrupted"] is True and s["steps"] == 3 and seen == [1, 2, 3]
    assert (tmp_path / "run" / "checkpoint-3").is_dir()
    r = zof.finetune(resume=tmp_path / "run")
    assert r["steps"] == 6 and full["steps"] == 6
    for f in ("model.safetensors", "zo_log.jsonl"):
        assert (tmp_path / "run" / f).read_bytes() == (tmp_path / "full" / f).read_bytes(), f


def test_sigint_saves_a_checkpoint_and_raises(tmp_path):
    def interrupt(m):
        if m["step"] == 2:
            os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(KeyboardInterrupt, match="resume"):
        zof.finetune(model=STORIES, data=SHAKESPEARE, out=tmp_path / "run", steps=50,
                     on_step=interrupt, **OPTS)
    assert (tmp_path / "run" / "latest").exists()


def test_an_exception_in_on_step_stops_the_run_and_is_raised(tmp_path):
    def boom(m):
        raise RuntimeError("boom at %d" % m["step"])

    with pytest.raises(RuntimeError, match="boom at 1"):
        zof.finetune(model=STORIES, data=SHAKESPEARE, out=tmp_path / "run", steps=50,
                     on_step=boom, **OPTS)
