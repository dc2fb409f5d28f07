# Fine-tune stories260K on Tiny Shakespeare for a few steps from Python, notebook style: load,
# look at the model, train with a step callback, and sample from the result.
#   build/venv/bin/python examples/finetune_stories.py [--steps N] [--out DIR]
import argparse
import logging
import pathlib
import tempfile

import zof

assets = pathlib.Path(__file__).resolve().parents[1].parent / "shared" / "assets"
p = argparse.ArgumentParser()
p.add_argument("--model", default=assets / "models" / "stories260K")
p.add_argument("--data", default=assets / "data" / "tinyshakespeare" / "input.txt")
p.add_argument("--steps", type=int, default=20)
p.add_argument("--out", default=None, help="run directory (default: a temporary one)")
args = p.parse_args()
out = pathlib.Path(args.out or tempfile.mkdtemp(prefix="zof-stories-")) / "run"

# zof's progress lines go to the logger "zof".
logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")

m = zof.Model.load(args.model)
print(f"{m.num_params} parameters; before: {m.generate('Once upon a time', max_new_tokens=16)!r}")

losses = []
summary = zof.finetune(model=args.model, task="text", data=args.data, out=out,
                       steps=args.steps, batch=4, seq_len=64, lr=1e-4, eps=1e-3,
                       eval_examples=16, seed=1,
                       on_step=lambda metrics: losses.append(metrics["record"]["loss"]))
print(f"losses of the {len(losses)} steps:", " ".join("skipped" if x is None else f"{x:.3f}" for x in losses))

tuned = zof.Model.load(summary["out"])
print(f"after: {tuned.generate('Once upon a time', max_new_tokens=16)!r}")
print("summary:", summary)
