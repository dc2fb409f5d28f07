# LOZO's low-rank directions (--low-rank, low_rank=) seen from outside, in numpy: after one ZO-SGD
# step each weight matrix moved by -lr g z, and z is U V^T / sqrt(r), so the saved model's change
# of every matrix has rank r (its singular values past the r-th are fp32 rounding of the update);
# a dense run's change has full rank. Vectors (the norms) move densely in both.
import numpy as np
import pytest
from safetensors.numpy import load_file

import zof
from conftest import SHAKESPEARE, STORIES, require

OPTS = dict(task="text", steps=1, batch=4, seq_len=32, lr=1e-2, eps=1e-3, seed=3,
            eval_examples=4, train_examples=64, threads=2, save_dtype="fp32")


def changes(tmp_path, name, **extra):
    require(STORIES), require(SHAKESPEARE)
    zof.finetune(model=STORIES, data=SHAKESPEARE, out=tmp_path / name, **OPTS, **extra)
    base = load_file(str(STORIES / "model.safetensors"))
    tuned = load_file(str(tmp_path / name / "model.safetensors"))
    return {k: tuned[k].astype(np.float64) - base[k].astype(np.float64) for k in base}


@pytest.mark.parametrize("rank", [1, 3])
def test_one_step_moves_each_matrix_by_rank_r(tmp_path, rank):
    low = changes(tmp_path, "low", low_rank=rank)
    dense = changes(tmp_path, "dense")
    matrices = [k for k, d in low.items() if d.ndim == 2 and min(d.shape) > rank + 1]
    assert len(matrices) >= 7, sorted(low)
    for k in matrices:
        s = np.linalg.svd(low[k], compute_uv=False)
        sd = np.linalg.svd(dense[k], compute_uv=False)
        assert s[0] > 0, k
        # fp32 rounding of theta - lr g z leaves ~1e-7 of theta; the update is ~1e-2 here.
        assert s[rank] < 1e-4 * s[0], (k, s[:rank + 2] / s[0])
        assert s[rank - 1] > 1e-2 * s[0], (k, s[:rank + 2] / s[0])
        assert sd[rank] > 0.1 * sd[0], (k, sd[:rank + 2] / sd[0])
    vectors = [k for k, d in low.items() if d.ndim == 1]
    assert vectors and all(np.count_nonzero(low[k]) > 0.9 * low[k].size for k in vectors)
