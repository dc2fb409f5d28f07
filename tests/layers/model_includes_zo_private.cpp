// A file of the model layer that includes a private header of zo, a layer above it: it must not
// compile (ctest layers.include_private_up_fails).
#include "zo/zo_engine.h"
