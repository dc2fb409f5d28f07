# The notebook-style example runs as a user would run it and prints the run's summary.
import subprocess
import sys

from conftest import REPO, SHAKESPEARE, STORIES, require


def test_finetune_stories_example(tmp_path):
    require(STORIES), require(SHAKESPEARE)
    r = subprocess.run([sys.executable, str(REPO / "examples" / "finetune_stories.py"),
                        "--steps", "4", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "summary: {" in r.stdout and "'steps': 4" in r.stdout
    assert "losses of the 4 steps:" in r.stdout
    assert "zof: step 4/4" in r.stderr  # progress through logging
    assert (tmp_path / "run" / "model.safetensors").is_file()
