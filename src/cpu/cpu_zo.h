// The zeroth-order passes on host memory (cpu_zo.cpp): what the host backends' zo_pass, zo_rows
// and zo_update_state run (backend.h says what each computes), and the oracle that tests hold
// the device passes to. OpenMP's default team; the bits do not depend on it.
#pragma once
#include <cstdint>

#include "zof/backend.h"

namespace zof::cpu {

// Backend::zo_pass on host memory (OpenMP over chunks of 64 elements); copies of type copy_t.
// round: a bf16 master's stochastic rounding of the update (null: none).
void zo_pass(Theta theta, int64_t n, uint32_t tensor, int64_t first, const ZOUpdateTerm* upd,
             int n_update, float lr_wd, const ZKey* cur, float eps, void* plus, void* minus,
             DType copy_t = DType::F32, const ZKey* round = nullptr);
// Backend::zo_rows on host memory: zo_pass over each row.
void zo_rows(Theta theta, int64_t width, const int32_t* rows, int64_t n_rows,
             uint32_t tensor, const ZKey& cur, float eps, float* plus, float* minus);
// Backend::zo_update_state on host memory.
void zo_update_state(Theta theta, float* m, float* v, int64_t n, uint32_t tensor, int64_t first,
                     const ZOUpdateTerm* upd, int n_update, const ZOOptimizer& o,
                     const ZKey* round = nullptr);

// The z of 16 Philox blocks given their words (block l's words c0[l] .. c3[l]; out[4l + i] as
// philox.h's box_muller16 / rademacher16 by key.dist) through the host pass's own code: the
// vector paths' math, which tests sweep over every input against the scalar z_group.
// Which path runs here: "avx512", "avx2" or "portable".
void z_from_words16(const ZKey& key, const uint32_t* c0, const uint32_t* c1, const uint32_t* c2,
                    const uint32_t* c3, float* out);
const char* zo_pass_isa();
// The AVX2 path's math on any x86 CPU with AVX2 and FMA, whatever path this build's pass takes
// (an AVX-512 machine tests it too): z_from_words16's z, and z64_avx2's z of key for the 64
// elements from 4 * g0 with their stochastic-rounding words (key's seed and step). false, and
// nothing written, where the CPU or the build has no such path.
bool z_from_words16_avx2(const ZKey& key, const uint32_t* c0, const uint32_t* c1,
                         const uint32_t* c2, const uint32_t* c3, float* out);
bool z64_avx2(const ZKey& key, uint32_t tensor, uint32_t g0, float* z, uint32_t* round_words);

}  // namespace zof::cpu
