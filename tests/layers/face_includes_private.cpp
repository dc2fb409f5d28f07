// A face (the CLI, Python, an embedding program) sees include/zof and nothing of src/: including
// a layer's private header must not compile (ctest layers.face_private_fails).
#include "train/run_dir.h"
