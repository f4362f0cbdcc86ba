// The choice of a sequence path (path_choice.h states the rules).
#include "cpp/sequence/choice.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>

namespace lltm::sequence::choice {
namespace {

// Every path of every device: a name that no device has is a typo.
constexpr std::array<const char*, 6>
    kPaths{"steps", "onednn", "fused", "persistent", "cluster", "auto"};

// Blocks of up to this many steps are timed as they are; longer ones share
// a choice per power of two, extrapolated from this many steps and a
// quarter of them: far enough apart that a call's own costs, which vary
// from run to run (packing W_h into fresh memory), cancel out.
constexpr int64_t kStepsTimed = 32;

int64_t power_of_two_at_least(int64_t n) {
  int64_t p = 1;
  while (p < n) {
    p *= 2;
  }
  return p;
}

struct Table {
  std::mutex mutex;
  std::unordered_map<std::string, Choice> choices;
};

Table& table() {
  static Table t;
  return t;
}

thread_local const StepLoops* forced_loops[2] = {nullptr, nullptr};

} // namespace

std::string Key::str() const {
  return std::string(c10::DeviceTypeName(device, /*lower_case=*/true)) + "|" +
      c10::toString(dtype) + "|" +
      (backward ? "backward" : (save ? "forward" : "inference")) +
      "|threads=" + std::to_string(threads) +
      "|T=" + std::to_string(sizes.steps) +
      "|B=" + std::to_string(sizes.batch) +
      "|F=" + std::to_string(sizes.input_features) +
      "|S=" + std::to_string(sizes.state_size);
}

Key key_of(
    c10::DeviceType device,
    at::ScalarType dtype,
    bool backward,
    bool save,
    int64_t threads,
    const Sizes& sizes) {
  Sizes bucket = sizes;
  if (sizes.steps > kStepsTimed) {
    bucket.steps = power_of_two_at_least(sizes.steps);
  }
  bucket.batch = power_of_two_at_least(sizes.batch);
  return Key{device, dtype, backward, save && !backward, threads, bucket};
}

double time_steps(int64_t steps, c10::function_ref<double(int64_t)> time) {
  if (steps <= kStepsTimed) {
    return time(steps);
  }
  constexpr int64_t kFew = kStepsTimed / 4;
  const double few = time(kFew);
  const double many = time(kStepsTimed);
  const double per_step =
      std::max(0.0, (many - few) / static_cast<double>(kStepsTimed - kFew));
  return few + per_step * static_cast<double>(steps - kFew);
}

std::string requested_path() {
  const char* value = std::getenv("LLTM_SEQUENCE_PATH");
  if (value == nullptr || *value == '\0' || std::strcmp(value, "auto") == 0) {
    return "";
  }
  const bool known = std::any_of(kPaths.begin(), kPaths.end(), [&](auto p) {
    return std::strcmp(p, value) == 0;
  });
  TORCH_CHECK_VALUE(
      known,
      "LLTM_SEQUENCE_PATH=",
      std::string(value),
      ": expected auto, steps, onednn or fused (the CPU's), or persistent, "
      "cluster, fused or steps (CUDA's), or unset, which is auto");
  return value;
}

bool tuning_enabled() {
  const char* value = std::getenv("LLTM_TUNING");
  if (value == nullptr || *value == '\0') {
    return true;
  }
  TORCH_CHECK_VALUE(
      std::strcmp(value, "0") == 0 || std::strcmp(value, "1") == 0,
      "LLTM_TUNING=",
      std::string(value),
      ": expected 1 (measure the paths at a block's first run) or 0 (choose "
      "by the model)");
  return value[0] == '1';
}

const StepLoops& choose(
    const Key& key,
    c10::ArrayRef<const StepLoops*> candidates,
    c10::function_ref<double(const StepLoops&)> measure,
    c10::function_ref<std::vector<double>()> model) {
  const auto named = [&](const std::string& name) -> const StepLoops* {
    if (name.empty()) {
      return nullptr;
    }
    for (const StepLoops* c : candidates) {
      if (name == c->name) {
        return c;
      }
    }
    return nullptr;
  };
  // A requested path of another device, or one that cannot run these sizes
  // and type, leaves the block to the usual choice.
  if (const StepLoops* loops = named(requested_path())) {
    return *loops;
  }
  if (candidates.size() == 1) {
    return *candidates.front();
  }
  const std::string k = key.str();
  Table& t = table();
  const std::lock_guard<std::mutex> lock(t.mutex);
  const auto found = t.choices.find(k);
  if (found != t.choices.end()) {
    const StepLoops* loops = named(found->second.path);
    if (loops != nullptr) {
      return *loops;
    }
  }
  Choice choice;
  std::vector<double> times;
  if (tuning_enabled()) {
    choice.source = "measured";
    for (const StepLoops* c : candidates) {
      times.push_back(measure(*c));
    }
  } else {
    choice.source = "model";
    times = model();
  }
  size_t best = 0;
  for (size_t i = 0; i < candidates.size(); ++i) {
    choice.times.emplace_back(candidates[i]->name, times[i]);
    if (times[i] < times[best]) {
      best = i;
    }
  }
  choice.path = candidates[best]->name;
  t.choices[k] = std::move(choice);
  return *candidates[best];
}

std::vector<std::pair<std::string, Choice>> choices() {
  Table& t = table();
  const std::lock_guard<std::mutex> lock(t.mutex);
  std::vector<std::pair<std::string, Choice>> out(
      t.choices.begin(), t.choices.end());
  std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    return a.first < b.first;
  });
  return out;
}

void load(const std::vector<std::pair<std::string, std::string>>& entries) {
  Table& t = table();
  const std::lock_guard<std::mutex> lock(t.mutex);
  for (const auto& [key, path] : entries) {
    t.choices.emplace(key, Choice{path, "cache", {}});
  }
}

void clear() {
  Table& t = table();
  const std::lock_guard<std::mutex> lock(t.mutex);
  t.choices.clear();
}

Forced::Forced(const StepLoops* forward, const StepLoops* backward)
    : previous_{forced_loops[0], forced_loops[1]} {
  forced_loops[0] = forward;
  forced_loops[1] = backward;
}

Forced::~Forced() {
  forced_loops[0] = previous_[0];
  forced_loops[1] = previous_[1];
}

const StepLoops* Forced::get(bool backward) {
  return forced_loops[backward ? 1 : 0];
}

bool Forced::active() {
  return forced_loops[0] != nullptr || forced_loops[1] != nullptr;
}

} // namespace lltm::sequence::choice
