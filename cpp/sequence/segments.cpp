// How a call's steps lie in the buffers (segments.h).
#include "cpp/sequence/segments.h"

#include <ATen/ops/index_select.h>
#include <ATen/ops/zeros.h>
#include <c10/util/Exception.h>

#include <cstdlib>
#include <string>

namespace lltm::sequence {

Steps::Steps(const std::vector<int64_t>& batch_sizes, int64_t min_steps)
    : batch_sizes_(batch_sizes) {
  const auto T = static_cast<int64_t>(batch_sizes.size());
  offset_.assign(T + 1, 0);
  for (int64_t t = 0; t < T; ++t) {
    offset_[t + 1] = offset_[t] + batch_sizes[t];
  }
  const int64_t B = T > 0 ? batch_sizes[0] : 0;
  length_.assign(B, 0);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t r = 0; r < batch_sizes[t]; ++r) {
      length_[r] = t + 1;
    }
  }
  work_offset_.assign(T, 0);
  int64_t row = 0;
  for (int64_t t = 0; t < T;) {
    const int64_t b = batch_sizes[t];
    int64_t end = t + 1;
    while (end < T && (batch_sizes[end] == b || end - t < min_steps)) {
      ++end;
    }
    segments_.push_back({t, end - t, b, row});
    for (int64_t s = t; s < end; ++s) {
      work_offset_[s] = row + (s - t) * b;
      identity_ = identity_ && batch_sizes[s] == b;
    }
    row += (end - t) * b;
    t = end;
  }
  work_rows_ = row;
}

std::vector<Segment> Steps::backward_segments(bool split) const {
  if (!split || batch_sizes_.empty()) { // dense: one segment
    return segments_;
  }
  std::vector<Segment> out;
  for (const Segment& s : segments_) {
    int64_t start = s.first_step;
    for (int64_t t = s.first_step + 1; t <= s.first_step + s.steps; ++t) {
      const bool last = t == s.first_step + s.steps;
      if (last || batch_sizes_[t] < batch_sizes_[t - 1]) {
        out.push_back(
            {start,
             t - start,
             s.batch,
             s.row + (start - s.first_step) * s.batch});
        start = t;
      }
    }
  }
  return out;
}

std::vector<int64_t> Steps::work_of_packed(int64_t d) const {
  std::vector<int64_t> out(offset_.back());
  for (size_t t = 0; t < batch_sizes_.size(); ++t) {
    for (int64_t r = 0; r < batch_sizes_[t]; ++r) {
      const int64_t step =
          d == 0 ? static_cast<int64_t>(t) : length_[r] - 1 - t;
      out[offset_[t] + r] = work_offset_[step] + r;
    }
  }
  return out;
}

std::vector<int64_t> Steps::last_work() const {
  std::vector<int64_t> out(length_.size());
  for (size_t r = 0; r < length_.size(); ++r) {
    out[r] = work_offset_[length_[r] - 1] + r;
  }
  return out;
}

std::vector<int64_t> Steps::previous_of_packed(int64_t d) const {
  const auto B = static_cast<int64_t>(length_.size());
  std::vector<int64_t> out(offset_.back());
  for (size_t t = 0; t < batch_sizes_.size(); ++t) {
    for (int64_t r = 0; r < batch_sizes_[t]; ++r) {
      const auto step = static_cast<int64_t>(t);
      const bool first = d == 0 ? step == 0 : step == length_[r] - 1;
      out[offset_[t] + r] =
          first ? r : B + offset_[d == 0 ? step - 1 : step + 1] + r;
    }
  }
  return out;
}

Indices::Indices(
    const Steps& steps,
    int64_t directions,
    const Engine& engine,
    c10::Device device,
    bool previous) {
  for (int64_t d = 0; d < directions; ++d) {
    if (d > 0 || !steps.identity()) {
      work_of_packed[d] = engine.indices(steps.work_of_packed(d), device);
    }
    if (previous) {
      previous_of_packed[d] =
          engine.indices(steps.previous_of_packed(d), device);
    }
  }
  last_work = engine.indices(steps.last_work(), device);
}

std::vector<int64_t> directed(
    bool stacked,
    int64_t directions,
    std::initializer_list<int64_t> shape) {
  std::vector<int64_t> out;
  if (stacked) {
    out.push_back(directions);
  }
  out.insert(out.end(), shape);
  return out;
}

at::Tensor direction_of(const at::Tensor& t, int64_t d, bool stacked) {
  return stacked ? t.select(0, d) : t;
}

at::Tensor block(const at::Tensor& work, const Segment& s) {
  return work.narrow(0, s.row, s.steps * s.batch)
      .view({s.steps, s.batch, work.size(-1)});
}

at::Tensor state_before(
    const at::Tensor& work,
    const Segment& previous,
    int64_t rows) {
  return work.narrow(
      0, previous.row + (previous.steps - 1) * previous.batch, rows);
}

at::Tensor to_work(
    const at::Tensor& packed,
    const Steps& steps,
    const Indices& idx,
    int64_t d) {
  if (d == 0 && steps.identity()) {
    return packed;
  }
  return at::zeros({steps.work_rows(), packed.size(1)}, packed.options())
      .index_copy_(0, idx.work_of_packed[d], packed);
}

at::Tensor from_work(
    const at::Tensor& work,
    const Steps& steps,
    const Indices& idx,
    int64_t d) {
  if (d == 0 && steps.identity()) {
    return work;
  }
  return work.index_select(0, idx.work_of_packed[d]);
}

at::Tensor padded(const at::Tensor& first, int64_t rows) {
  if (first.size(0) == rows) {
    return first;
  }
  at::Tensor out = at::zeros({rows, first.size(1)}, first.options());
  out.narrow(0, 0, first.size(0)).copy_(first);
  return out;
}

at::Tensor output_of(const at::Tensor& output, int64_t d, int64_t S) {
  return output.narrow(-1, d * S, S);
}

int64_t min_segment_steps(const Engine& engine, int64_t steps) {
  const char* value = std::getenv("LLTM_SEGMENT_STEPS");
  if (value == nullptr || *value == '\0') {
    return engine.min_segment_steps(steps);
  }
  char* end = nullptr;
  const long long parsed = std::strtoll(value, &end, 10);
  TORCH_CHECK_VALUE(
      *end == '\0' && parsed >= 1,
      "LLTM_SEGMENT_STEPS=",
      std::string(value),
      ": expected a whole number >= 1 (or unset: the backend's)");
  return parsed;
}

} // namespace lltm::sequence
