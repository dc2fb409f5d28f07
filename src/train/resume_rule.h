// --resume's rule (GivenOptions in zof/options.h): what a resumed run refuses of the options its
// caller set, the same for the CLI and Python since finetune() applies it.
#pragma once
#include "zof/trainer.h"

namespace zof::train {

// zof::Error when an option in `given` would change one that the run in opt.resume saved in its
// run.json, naming each such option with its value and the run's. A directory without a
// readable run.json passes: the run directory's own checks (RunDir) say what it is.
void check_resume_request(const TrainOptions& opt, const GivenOptions& given);

}  // namespace zof::train
