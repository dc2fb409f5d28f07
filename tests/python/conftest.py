# Paths the Python tests share: the repository, the assets beside it, and the CLI they compare
# against (build/zof, which scripts/test.sh builds before running them).
import os
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
ASSETS = pathlib.Path(os.environ.get("ZOF_ASSETS_DIR", REPO.parent / "shared" / "assets"))
CLI = pathlib.Path(os.environ.get("ZOF_CLI", REPO / "build" / "zof"))
STORIES = ASSETS / "models" / "stories260K"
SHAKESPEARE = ASSETS / "data" / "tinyshakespeare" / "input.txt"


def require(path):
    if not pathlib.Path(path).exists():
        pytest.skip("%s is missing" % path)
    return pathlib.Path(path)
