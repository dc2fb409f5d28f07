// zof's version string.
#include "zof/version.h"
namespace zof {
const char* version() { return "0.1.0"; }
}
