"""zof from Python: the CLI's commands over the same C++ library.

    import zof
    m = zof.Model.load("models/stories260K")
    m.logits([1, 400, 34])                    # numpy float32 (T, V)
    m.eval("tinystories.txt", seq_len=256)    # the keys of `zof eval --json`
    m.generate("Once upon a time", max_new_tokens=40)
    summary = zof.finetune(model=..., task="text", data=..., out="runs/a", steps=100, lr=1e-4,
                           on_step=lambda metrics: print(metrics["step"], metrics["recent_loss"]))

Every keyword of finetune is a `zof finetune` flag with dashes as underscores. Errors raise
zof.Error (a ValueError) whose message is the line the CLI prints after "zof: error: ".
Progress goes to the logger "zof" (INFO); progress=True prints it as the CLI does instead.
"""
import json
import logging
import os

import numpy as np

from . import _zof

__all__ = ["Error", "Model", "finetune", "replay", "__version__"]

Error = _zof.Error
Error.__module__ = "zof"
__version__ = _zof.version()

_log = logging.getLogger("zof")

# The flags of `zof finetune` (TrainOptions' fields) that finetune() takes as keywords.
_TRAIN_FIELDS = sorted(k for k in dir(_zof.TrainOptions) if not k.startswith("_"))


class Model:
    """A Hugging Face model directory loaded for logits, eval and generate (on the CPU)."""

    def __init__(self, impl):
        self._m = impl
        self.path = impl.source()
        self.config = json.loads(impl.config())
        self.num_params = impl.num_params()

    @classmethod
    def load(cls, path, device="cpu", threads=0):
        """Loads PATH/config.json and its safetensors. threads=0: all cores."""
        return cls(_zof.Model(os.fspath(path), device, threads))

    def logits(self, ids):
        """Logits at every position: ids (T) gives (T, V); rows of ids (B, T), or a list of
        sequences of different lengths (right-padded; padded positions are 0), give (B, T, V)."""
        if isinstance(ids, np.ndarray):
            ids = ids.tolist()
        ids = list(ids)
        single = len(ids) > 0 and not hasattr(ids[0], "__len__")
        rows = [ids] if single else [list(r) for r in ids]
        out = self._m.logits([[int(t) for t in r] for r in rows])
        return out[0] if single else out

    def eval(self, text_or_path, seq_len=0, batch=8, max_windows=0, dtype="auto"):
        """Perplexity as `zof eval --json`: text_or_path is a file (an os.PathLike, or a str
        naming an existing file) or the text itself. seq_len=0: the context, at most 512.
        dtype: the matrix products, as --dtype (auto: bf16 where it is faster, else fp32)."""
        if isinstance(text_or_path, os.PathLike) or (
                isinstance(text_or_path, str) and "\n" not in text_or_path
                and os.path.isfile(text_or_path)):
            path = os.fspath(text_or_path)
            source = "--text " + path
            try:
                with open(path, "rb") as f:
                    text = f.read().decode("utf-8", errors="replace")
            except OSError:
                raise Error(source + ": cannot be read (check its permissions)") from None
        else:
            text, source = text_or_path, "the text"
        return json.loads(self._m.eval(text, source, seq_len, batch, max_windows, dtype))

    def generate(self, prompt="", max_new_tokens=128, temperature=0.0, top_p=1.0, seed=0,
                 dtype="auto"):
        """The completion of prompt, as `zof generate` (greedy at temperature 0); dtype as in
        eval."""
        r = json.loads(self._m.generate(prompt, max_new_tokens, temperature, top_p, seed, dtype))
        return r["completion"]


def _progress_line(m):
    return "step %d/%d  loss %.4f  %s %.4f  %.0f tok/s" % (
        m["step"], m["steps"], m["recent_loss"], m["metric"], m["metric_value"],
        m["tokens_per_s"])


# Options that say where and how a run runs, not what it computes: a resumed run may change them.
_LAYOUT_FIELDS = {"resume", "threads", "json", "no_report", "pipeline_stages", "dist_timeout",
                  "gpu_mem", "sim_device", "device"}


def _check_resume_options(options):
    """resume=RUN_DIR continues with the run's saved options, as `zof finetune --resume`: an
    option that would change one of them would be ignored, so it is refused (one with the saved
    value changes nothing and passes)."""
    run = options.get("resume")
    if not run:
        return
    try:
        with open(os.path.join(os.fspath(run), "run.json")) as f:
            saved = json.load(f)["options"]
    except (OSError, ValueError, KeyError, TypeError):
        return  # the library says what the directory is
    # What runs from before an option recorded (TrainOptions::from_json's defaults for them).
    saved = {"dtype": "fp32", "save_dtype": "input", "master": "fp32", "round_every": 1, **saved}
    given, kept = [], []
    for key, value in options.items():
        if key in _LAYOUT_FIELDS or value is None or key not in saved:
            continue
        probe = _zof.TrainOptions()  # the value as the run stores it (a float32 for lr, eps, ...)
        setattr(probe, key, os.fspath(value) if isinstance(value, os.PathLike) else value)
        now, was = getattr(probe, key), saved[key]
        if key in ("model", "data", "out") and os.path.realpath(now) == os.path.realpath(was):
            continue
        if key == "save_dtype" and now == "auto" and was == saved["master"]:
            continue  # auto is the master's dtype
        if key == "round_every" and now == 0:
            continue  # auto: the run's recorded window
        if now != was:
            given.append("%s=%r" % (key, value))
            kept.append("%s=%r" % (key, was))
    if given:
        raise Error("resume=%r continues the run with the options it was started with, so %s "
                    "would be ignored (the run has %s); drop %s, or start a new run with out=DIR"
                    % (os.fspath(run), " and ".join(given), " and ".join(kept),
                       "it" if len(given) == 1 else "them"))


def finetune(*, on_step=None, progress=False, **options):
    """Runs (or with resume=RUN_DIR continues) `zof finetune` and returns its --json summary.

    options: model, task, data, out, steps, lr, eps, batch, seed, ... (every `zof finetune`
    flag, dashes as underscores). on_step(metrics) is called after every step with the step's
    report (step, steps, recent_loss, metric, metric_value, tokens_per_s, elapsed_s and record,
    its metrics.jsonl line); returning False stops the run after the next step with a
    checkpoint (the summary then has "interrupted": true). Ctrl-C saves a checkpoint and raises
    KeyboardInterrupt.
    """
    opt = _zof.TrainOptions()
    for key, value in options.items():
        if key not in _TRAIN_FIELDS:
            raise TypeError("finetune() got an unexpected keyword %r; the options are: %s"
                            % (key, ", ".join(_TRAIN_FIELDS)))
        if value is None:
            continue
        setattr(opt, key, os.fspath(value) if isinstance(value, os.PathLike) else value)

    _check_resume_options(options)
    stop_requested = False

    def message(line):
        if not progress:  # progress=True: the terminal already shows it
            _log.info("%s", line)

    def step(text):
        nonlocal stop_requested
        m = json.loads(text)
        # As the terminal: a line every 2% of the steps, at the last one and at evaluations.
        every = max(1, m["steps"] // 50)
        if not progress and (m["step"] % every == 0 or m["step"] == m["steps"] or m["evaluated"]):
            _log.info("%s", _progress_line(m))
        if on_step is not None and on_step(m) is False:
            stop_requested = True
        return stop_requested

    summary = json.loads(_zof.finetune(opt, message, step, progress))
    if summary.get("interrupted") and not stop_requested:
        raise KeyboardInterrupt("zof.finetune: interrupted at step %d; checkpoint saved, continue "
                                "with zof.finetune(resume=%r)" % (summary["steps"], summary["run"]))
    return summary


def replay(model, log, out, threads=0):
    """Rebuilds a run's fine-tuned weights from the base model and the run's step log (the run
    directory), into out; returns `zof replay --json`'s summary."""
    return json.loads(_zof.replay(os.fspath(model), os.fspath(log), os.fspath(out), threads))
