// A file of the data layer that includes the trainer's header, against the arrows (data builds
// on util hf options backends model): it must not compile (ctest layers.include_up_fails).
#include "zof/trainer.h"
