# Logits from Python against transformers' on the golden models (tests/golden, written by
# tests/reference/make_golden.py): the tolerance of tests/model/test_golden.cpp.
import json

import numpy as np
import pytest
from safetensors.numpy import load_file

import zof
from conftest import ASSETS, REPO, require

GOLDEN = sorted(p.parent.name for p in (REPO / "tests" / "golden").glob("*/golden.json"))


@pytest.mark.parametrize("name", GOLDEN)
def test_logits_match_transformers(name):
    d = REPO / "tests" / "golden" / name
    meta = json.loads((d / "golden.json").read_text())
    md = meta["model_dir"]
    model_dir = require(ASSETS / md[len("assets:"):] if md.startswith("assets:") else d)
    ref = load_file(str(d / "golden.safetensors"))["logits_f64"]  # (B, T, V)
    rows = [ids[:n] for ids, n in zip(meta["input_ids"], meta["lengths"])]
    m = zof.Model.load(model_dir)
    out = m.logits(rows)
    assert out.dtype == np.float32 and out.shape == (len(rows), max(meta["lengths"]), ref.shape[2])
    for b, n in enumerate(meta["lengths"]):
        ours, want = out[b, :n].astype(np.float64), ref[b, :n].astype(np.float64)
        scale = np.maximum(np.abs(want).max(axis=1, keepdims=True), 1e-6)
        assert (np.abs(ours - want) / scale).max() < 2e-5, name
        assert not out[b, n:].any()  # padding is zeroed
    # One sequence gives (T, V), the same numbers as its row of the batch.
    single = m.logits(np.array(rows[0]))
    assert single.shape == (meta["lengths"][0], ref.shape[2])
    np.testing.assert_array_equal(single, out[0])
