// Zeroth-order parameter passes on host memory: the pending update and the next perturbation in
// one read of theta, with z regenerated from Philox (never stored).
#include <algorithm>

#include "zof/backend.h"

namespace zof {

void zo_pass_host(float* theta, int64_t n, uint32_t tensor, const ZOUpdateTerm* upd, int n_update,
                  float lr_wd, const ZKey* cur, float eps, float* plus, float* minus) {
  const int64_t groups = (n + 3) / 4;
#pragma omp parallel for schedule(static)
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t i0 = g * 4, m = std::min<int64_t>(4, n - i0);
    float th[4];
    for (int64_t l = 0; l < m; ++l) th[l] = theta[i0 + l];
    if (n_update > 0) {
      float acc[4];
      for (int64_t l = 0; l < m; ++l) acc[l] = lr_wd * th[l];
      for (int j = 0; j < n_update; ++j) {
        float z[4];
        z_group(upd[j].key, tensor, (uint32_t)g, z);
        for (int64_t l = 0; l < m; ++l) acc[l] = fmaf(upd[j].coef, z[l], acc[l]);
      }
      for (int64_t l = 0; l < m; ++l) theta[i0 + l] = th[l] = th[l] - acc[l];
    }
    if (cur) {
      float z[4];
      z_group(*cur, tensor, (uint32_t)g, z);
      for (int64_t l = 0; l < m; ++l) {
        if (plus) plus[i0 + l] = zo_perturbed(th[l], z[l], eps);
        if (minus) minus[i0 + l] = zo_perturbed(th[l], z[l], -eps);
      }
    }
  }
}

void Backend::zo_pass(float* theta, int64_t n, uint32_t tensor, const ZOUpdateTerm* upd,
                      int n_update, float lr_wd, const ZKey* cur, float eps, float* plus,
                      float* minus, Stream*) {
  zo_pass_host(theta, n, tensor, upd, n_update, lr_wd, cur, eps, plus, minus);
}

}  // namespace zof
