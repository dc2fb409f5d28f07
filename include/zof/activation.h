// The MLP's activation functions: named by a model's config (config.h) and computed by the
// backends' pointwise ops, so below both.
#pragma once

namespace zof {

enum class Activation { SiLU, ReLU, GeluTanh, GeluErf };

}  // namespace zof
