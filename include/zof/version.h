// zof's version, reported by `zof --version` and written into saved checkpoints.
#pragma once
namespace zof {
const char* version();
}
