// A range in torch.profiler that names the path running an op's work
// ("lltm::sequence_path::fused/held", "lltm::cell_path::small"): how
// lltm.paths_that_ran sees which path ran, on any device.
#pragma once

#include <ATen/record_function.h>

#include <string>

namespace lltm {

class PathRange {
 public:
  // name() gives the path's name; it is called only while a profiler
  // listens.
  template <typename Name>
  PathRange(const char* prefix, Name name)
      : guard_(at::RecordScope::USER_SCOPE) {
    if (guard_.isActive()) {
      guard_.before(std::string(prefix) + name());
    }
  }

 private:
  at::RecordFunction guard_;
};

} // namespace lltm
