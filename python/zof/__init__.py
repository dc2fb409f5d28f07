"""zof from Python: the CLI's commands over the same C++ library.

    import zof
    m = zof.Model.load("models/stories260K")
    m.logits([1, 400, 34])                    # numpy float32 (T, V)
    m.eval("tinystories.txt", seq_len=256)    # a file, as `zof eval --text`: its --json keys
    m.eval(text="Once upon a time ...")       # or the text itself
    m.generate("Once upon a time", max_new_tokens=40)
    summary = zof.finetune(model=..., task="text", data=..., out="runs/a", steps=100, lr=1e-4,
                           on_step=lambda metrics: print(metrics["step"], metrics["recent_loss"]))

Every keyword of finetune is a `zof finetune` flag with dashes as underscores, and every value is
read and checked as the CLI reads that flag's text: the same values are accepted, and a refused
one raises zof.Error (a ValueError) whose message is the line the CLI prints after
"zof: error: ". Progress goes to the logger "zof" (INFO); progress=True prints it as the CLI does
instead.
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

# The table of `zof finetune`'s options (the library's, which the CLI's flags come from too):
# finetune() takes each as a keyword, and its docstring lists them.
_TRAIN_OPTIONS = json.loads(_zof.train_options())
_TRAIN_FIELDS = [o["key"] for o in _TRAIN_OPTIONS]


def _text(name, value):
    """A keyword's value as the text the CLI would read for its flag: the library reads it (and
    refuses it) exactly as it reads the flag's."""
    if isinstance(value, (bool, np.bool_)):
        return "true" if value else "false"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        return repr(float(value))  # the shortest text that reads back to the same double
    if isinstance(value, str):
        return value
    if isinstance(value, os.PathLike):
        return os.fsdecode(os.fspath(value))
    raise TypeError("%s takes a number, a string, a path or True/False, not %s"
                    % (name, type(value).__name__))


class Model:
    """A Hugging Face model directory, or a GGUF file, loaded for logits, eval and generate (on
    the CPU)."""

    def __init__(self, impl):
        self._m = impl
        self.path = impl.source()
        self.config = json.loads(impl.config())
        self.num_params = impl.num_params()

    @classmethod
    def load(cls, path, device="cpu", threads=0, host_mem=None, offload_dir=None):
        """Loads PATH/config.json and its safetensors, or the GGUF file PATH (llama architecture;
        F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q6_K tensors dequantized to fp32). threads=0: all
        cores.

        host_mem ("8GiB", "512MiB" or bytes, as `zof eval --host-mem`): the blocks that do not
        fit it are read into a scratch file in offload_dir (default: the current directory) and
        read back as each pass reaches them, so a model larger than RAM is evaluated and sampled
        from; the file goes with the Model."""
        if offload_dir is not None and host_mem is None:
            raise TypeError("offload_dir= holds the blocks that do not fit host_mem=: give "
                            "host_mem= too")
        return cls(_zof.Model(os.fspath(path), device, _text("threads", threads),
                              "" if host_mem is None else _text("host_mem", host_mem),
                              "" if offload_dir is None else _text("offload_dir", offload_dir)))

    def logits(self, ids):
        """Logits at every position: ids (T) gives (T, V); rows of ids (B, T), or a list of
        sequences of different lengths (right-padded; padded positions are 0), give (B, T, V).
        Token ids are whole numbers (ints, or floats with no fraction)."""
        if isinstance(ids, np.ndarray):
            ids = ids.tolist()
        ids = list(ids)
        single = len(ids) > 0 and not hasattr(ids[0], "__len__")
        rows = [ids] if single else [list(r) for r in ids]
        out = self._m.logits([[_token_id(t) for t in r] for r in rows])
        return out[0] if single else out

    def eval(self, path=None, *, text=None, task=None, data=None, eval_examples=None,
             seed=None, seq_len=None, batch=None, max_windows=0, dtype="auto"):
        """Perplexity as `zof eval --json`, of the file at path (as --text: a regular file, else
        zof.Error) or of text=, the text itself. seq_len: the window (default: the context, at
        most 512). dtype: the matrix products, as --dtype (auto: bf16 where it is faster, else
        fp32).

        With task= and data= instead: the task's held-out metric as `zof eval --task --json`
        (what finetune's evaluation scores), of eval_examples examples drawn with seed, with
        finetune's defaults for what is not given."""
        if task is not None:
            if path is not None or text is not None or max_windows != 0:
                raise TypeError("eval(task=) scores a task's examples: give data=, not a file, "
                                "text= or max_windows=")
            opts = [("task", _text("task", task))]
            for k, v in (("data", data), ("eval_examples", eval_examples), ("seed", seed),
                         ("seq_len", seq_len), ("batch", batch)):
                if v is not None:
                    opts.append((k, os.fsdecode(os.fspath(v)) if k == "data" else _text(k, v)))
            return json.loads(self._m.eval_task(opts, dtype))
        if data is not None or eval_examples is not None or seed is not None:
            raise TypeError("data=, eval_examples= and seed= go with task=; a text's perplexity "
                            "takes a file path or text=")
        if batch is None:
            batch = 8
        if (path is None) == (text is None):
            raise TypeError("eval() takes a file path or text=, one of them: m.eval(\"file.txt\") "
                            "or m.eval(text=\"the text\")")
        if text is not None and not isinstance(text, str):
            raise TypeError("text= takes the text itself as a str, not %s (a file goes as "
                            "the first argument)" % type(text).__name__)
        if path is not None:
            if not isinstance(path, (str, os.PathLike)):
                raise TypeError("eval() takes a file path (a str or an os.PathLike), not %s; "
                                "give the text itself as text=" % type(path).__name__)
            path = os.fsdecode(os.fspath(path))
        n = "" if seq_len is None else _text("seq_len", seq_len)
        try:
            r = self._m.eval(path, text or "", n, _text("batch", batch),
                             _text("max_windows", max_windows), dtype)
        except Error as e:
            # The file's own refusal (not a number's or the dtype's, checked first).
            if (path is not None and str(e).startswith("--text " + path)
                    and not os.path.lexists(path)):
                raise Error("%s (to score a string, pass it as text=)" % e) from None
            raise
        return json.loads(r)

    def generate(self, prompt="", max_new_tokens=128, temperature=0.0, top_p=1.0, seed=0,
                 dtype="auto"):
        """The completion of prompt, as `zof generate` (greedy at temperature 0); dtype as in
        eval."""
        r = json.loads(self._m.generate(prompt, _text("max_new_tokens", max_new_tokens),
                                        _text("temperature", temperature),
                                        _text("top_p", top_p), _text("seed", seed), dtype))
        return r["completion"]


def _token_id(t):
    """A token id as an int; a float with a fraction (1.7) is refused, not truncated."""
    if isinstance(t, (bool, np.bool_)) or not isinstance(t, (int, float, np.integer, np.floating)):
        raise Error("logits: token ids are whole numbers, not %r" % (t,))
    if isinstance(t, (float, np.floating)) and not float(t).is_integer():
        raise Error("logits: token ids are whole numbers, not %r" % (t,))
    return int(t)


def _progress_line(m):
    return "step %d/%d  loss %.4f  %s %.4f  %.0f tok/s" % (
        m["step"], m["steps"], m["recent_loss"], m["metric"], m["metric_value"],
        m["tokens_per_s"])


def finetune(*, on_step=None, progress=False, **options):
    """Runs (or with resume=RUN_DIR continues) `zof finetune` and returns its --json summary.

    options: model, task, data, out, steps, lr, eps, batch, seed, ... (every `zof finetune`
    flag, dashes as underscores). on_step(metrics) is called after every step with the step's
    report (step, steps, recent_loss, metric, metric_value, tokens_per_s, elapsed_s and record,
    its metrics.jsonl line); returning False stops the run after the next step with a
    checkpoint (the summary then has "interrupted": true). Ctrl-C saves a checkpoint and raises
    KeyboardInterrupt.
    """
    given = []
    for key, value in options.items():
        if key not in _TRAIN_FIELDS:
            raise TypeError("finetune() got an unexpected keyword %r; the options are: %s"
                            % (key, ", ".join(_TRAIN_FIELDS)))
        if value is not None:
            given.append((key, _text(key, value)))
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

    summary = json.loads(_zof.finetune(given, message, step, progress))
    if summary.get("interrupted") and not stop_requested:
        raise KeyboardInterrupt("zof.finetune: interrupted at step %d; checkpoint saved, continue "
                                "with zof.finetune(resume=%r)" % (summary["steps"], summary["run"]))
    return summary


def _option_line(o):
    what = o["help"]
    if o["choices"]:
        what += " (one of: %s)" % ", ".join(o["choices"])
    elif "accepts" in o:
        what += " (%s)" % o["accepts"]
    default = "" if o["default"] in ("", None) else ", default %r" % (o["default"],)
    return "    %s (%s%s): %s" % (o["key"], o["flag"], default, what)


finetune.__doc__ = (finetune.__doc__ or "") + "\n    The options (from the library's table, as `zof finetune --help` lists them):\n\n" + \
    "\n".join(_option_line(o) for o in _TRAIN_OPTIONS) + "\n"


def replay(model, log, out, threads=0):
    """Rebuilds a run's fine-tuned weights from the base model and the run's step log (the run
    directory), into out; returns `zof replay --json`'s summary."""
    return json.loads(_zof.replay(os.fspath(model), os.fspath(log), os.fspath(out),
                                  _text("threads", threads)))
