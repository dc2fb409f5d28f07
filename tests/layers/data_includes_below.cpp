// A file of the data layer that includes what it builds on: its own header, model's public one
// and a private header of model (ctest layers.include_down_builds).
#include "model/block_graph.h"
#include "zof/data.h"
#include "zof/error.h"
#include "zof/model.h"

int zof_layer_probe_data() { return sizeof(zof::Model) > 0 ? 0 : 1; }
