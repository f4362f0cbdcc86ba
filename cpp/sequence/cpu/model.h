// The CPU paths' cost model, for LLTM_TUNING=0: each path's estimate of a
// block's microseconds from what packing W_h costs a call, a cost per step
// and per multiply-add of the steps' GEMMs, and per multiply-add of the
// input's GEMMs. scripts/fit_cpu_paths.py fits the coefficients;
// docs/performance.md ("The CPU's paths") says how well the model picks.
#pragma once

#include "cpp/sequence/path.h"

namespace lltm::sequence::cpu_paths {

struct Cost {
  double per_s2; // per S^2 / 1e6, once a call
  double per_step;
  double per_gmac; // per 1e9 multiply-adds of the steps' GEMMs
  double per_io_gmac; // of the input's GEMMs
};

// A path's costs in each mode of a block.
struct Costs {
  Cost inference;
  Cost forward;
  Cost backward;
};

inline double estimate_us(const Costs& costs, const Block& block) {
  const Cost& cost = block.backward
      ? costs.backward
      : (block.save ? costs.forward : costs.inference);
  const auto [T, B, F, S] = block.sizes;
  const double steps = static_cast<double>(T);
  const double s2 = 1e-6 * static_cast<double>(S) * static_cast<double>(S);
  const double gmacs = 1e-9 * static_cast<double>(B * 3 * S) * S;
  const double io_gmacs = 1e-9 * steps * static_cast<double>(B * 3 * S) * F;
  return cost.per_s2 * s2 + steps * (cost.per_step + cost.per_gmac * gmacs) +
      cost.per_io_gmac * io_gmacs;
}

} // namespace lltm::sequence::cpu_paths
