// The choice of a path and its plan for each block (choice.h states the
// rules).
#include "cpp/sequence/choice.h"

#include <ATen/ops/arange.h>
#include <ATen/record_function.h>
#include <c10/util/Exception.h>
#include <c10/util/irange.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <tuple>
#include <unordered_map>

namespace lltm::sequence::choice {
namespace {

// Blocks of up to engine.steps_timed steps are timed as they are; longer
// ones share a choice per power of two, extrapolated from that many steps
// and a quarter of them: far enough apart that a call's own costs, which
// vary from run to run (packing W_h into fresh memory, the host's launches),
// cancel out.

// A kind of block, as a string: "cpu|Float|inference|threads=2|T=64|B=16|
// F=32|S=128" (the disk cache's key, lltm/tuning.py).
std::string key_of(const Engine& engine, const Block& block) {
  Sizes sizes = block.sizes;
  if (sizes.steps > engine.steps_timed) {
    sizes.steps = power_of_two_at_least(sizes.steps);
  }
  sizes.batch = power_of_two_at_least(sizes.batch);
  const char* mode =
      block.backward ? "backward" : (block.save ? "forward" : "inference");
  return std::string(c10::DeviceTypeName(engine.device, /*lower_case=*/true)) +
      "|" + c10::toString(block.dtype) + "|" + mode + "|" + engine.context() +
      "|T=" + std::to_string(sizes.steps) +
      "|B=" + std::to_string(sizes.batch) +
      "|F=" + std::to_string(sizes.input_features) +
      "|S=" + std::to_string(sizes.state_size);
}

std::string path_names(c10::DeviceType device) {
  std::string names;
  for (const Path* path : paths(device)) {
    names += (names.empty() ? "" : ", ") + std::string(path->name);
  }
  return names;
}

// LLTM_SEQUENCE_PATH's path for `device`, or nullptr for unset or auto; a
// value that names no path of the device raises, naming the ones it has.
const Path* requested_path(c10::DeviceType device) {
  const char* value = std::getenv("LLTM_SEQUENCE_PATH");
  if (value == nullptr || *value == '\0' || std::strcmp(value, "auto") == 0) {
    return nullptr;
  }
  const Path* path = find_path(device, value);
  TORCH_CHECK_VALUE(
      path != nullptr,
      "LLTM_SEQUENCE_PATH=",
      std::string(value),
      ": expected auto or a sequence path of the ",
      c10::DeviceTypeName(device),
      ": ",
      path_names(device),
      " (unset is auto)");
  return path;
}

std::string describe(const Block& block) {
  const auto [T, B, F, S] = block.sizes;
  return std::string(block.backward ? "a backward" : "a forward") +
      " of steps = " + std::to_string(T) + ", batch = " + std::to_string(B) +
      ", input_features = " + std::to_string(F) +
      ", state_size = " + std::to_string(S) + " in " +
      std::string(c10::getDtypeNames(block.dtype).first);
}

struct Table {
  std::mutex mutex;
  std::unordered_map<std::string, Choice> choices;
};

Table& table() {
  static Table t;
  return t;
}

thread_local const Path* forced_paths[2] = {nullptr, nullptr};

// path.plan(), with the plan's path set.
std::optional<Plan> plan_of(
    const Path& path,
    const Block& block,
    std::string* why_not) {
  std::optional<Plan> plan = path.plan(block, why_not);
  if (plan) {
    plan->path = &path;
  }
  return plan;
}

// Whether any path of the device has a model (Path::estimate_us).
bool has_model(c10::DeviceType device) {
  const auto all = paths(device);
  return std::any_of(all.begin(), all.end(), [](const Path* path) {
    return path->estimate_us != nullptr;
  });
}

// The first of `plans` (one per path that can run the block, by rank) whose
// path's window holds: the device's rules.
size_t by_rule(const Block& block, const std::vector<Plan>& plans) {
  for (const auto i : c10::irange(plans.size())) {
    const Path& path = *plans[i].path;
    if (path.window == nullptr || path.window(block)) {
      return i;
    }
  }
  TORCH_INTERNAL_ASSERT(
      false, "no sequence path's window holds ", describe(block));
}

// The choice kept for `key` (not the rules', which are decided again for
// each block), if any.
std::optional<Choice> kept_choice(const std::string& key) {
  Table& t = table();
  const std::lock_guard<std::mutex> lock(t.mutex);
  const auto found = t.choices.find(key);
  if (found == t.choices.end() || found->second.source == "rules" ||
      found->second.source == "capture") {
    return std::nullopt;
  }
  return found->second;
}

// Keeps `choice` for `key`, unless a choice other than the rules' is kept
// already; returns the one kept.
Choice keep(const std::string& key, Choice&& choice) {
  Table& t = table();
  const std::lock_guard<std::mutex> lock(t.mutex);
  auto [it, inserted] = t.choices.try_emplace(key, std::move(choice));
  if (!inserted &&
      (it->second.source == "rules" || it->second.source == "capture")) {
    it->second = std::move(choice);
  }
  return it->second;
}

// Drops the choice kept for `key`: one that names none of the candidates (a
// stale line of the disk's cache) gives way to the one measured now.
void forget(const std::string& key) {
  Table& t = table();
  const std::lock_guard<std::mutex> lock(t.mutex);
  t.choices.erase(key);
}

void set_plan(const std::string& key, const std::string& plan) {
  Table& t = table();
  const std::lock_guard<std::mutex> lock(t.mutex);
  t.choices[key].plan = plan;
}

// The plan for a block that `plans` (one per path that can run it) offer:
// the one kept for the block's kind, else the fastest measured, or by the
// model, kept for the kind; else (inside a CUDA graph's capture, or where
// measuring is off and the device has no model) by the rules, decided again
// for each block.
Plan chosen(
    const Engine& engine,
    const Block& block,
    std::vector<Plan>& plans) {
  const std::string key = key_of(engine, block);
  const auto plan_of_path = [&](const std::string& name) -> Plan* {
    for (Plan& plan : plans) {
      if (name == plan.path->name) {
        return &plan;
      }
    }
    return nullptr;
  };
  if (std::optional<Choice> kept = kept_choice(key)) {
    if (Plan* plan = plan_of_path(kept->path)) {
      set_plan(key, plan->name());
      return std::move(*plan);
    }
    forget(key);
  }
  const bool capturing = engine.capturing != nullptr && engine.capturing();
  const bool measuring = tuning_enabled();
  if (capturing || (!measuring && !has_model(engine.device))) {
    // A graph's capture can neither time nor wait: the next block of the
    // kind outside a capture measures.
    Plan& plan = plans[by_rule(block, plans)];
    keep(
        key,
        Choice{
            plan.path->name, plan.name(), capturing ? "capture" : "rules", {}});
    return std::move(plan);
  }
  // Measured without the table's lock: the GEMMs around a measured block
  // keep choices of their own (choose_library).
  Choice choice;
  std::vector<double> times;
  if (measuring) {
    choice.source = "measured";
    std::vector<const Path*> candidates;
    for (const Plan& plan : plans) {
      candidates.push_back(plan.path);
    }
    times =
        time_steps(block.sizes.steps, engine.steps_timed, [&](int64_t steps) {
          Block timed = block;
          timed.sizes.steps = steps;
          return time_paths(engine, candidates, timed);
        });
  } else {
    choice.source = "model";
    for (const Plan& plan : plans) {
      times.push_back(
          plan.path->estimate_us != nullptr
              ? plan.path->estimate_us(block)
              : std::numeric_limits<double>::infinity());
    }
  }
  size_t best = 0;
  for (const auto i : c10::irange(plans.size())) {
    choice.times.emplace_back(plans[i].path->name, times[i]);
    if (times[i] < times[best]) {
      best = i;
    }
  }
  choice.path = plans[best].path->name;
  choice.plan = plans[best].name();
  // Another thread may have measured the kind meanwhile: the first choice
  // kept stands.
  Plan* plan = plan_of_path(keep(key, std::move(choice)).path);
  return std::move(plan != nullptr ? *plan : plans[best]);
}

} // namespace

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
      "by the model, or by the rules where the device has none)");
  return value[0] == '1';
}

Plan plan_block(const Engine& engine, const Block& block, const char* op) {
  std::string why_not;
  if (const Path* forced = Forced::get(block.backward)) {
    std::optional<Plan> plan = plan_of(*forced, block, &why_not);
    TORCH_INTERNAL_ASSERT(plan, "a measured path cannot run: ", why_not);
    return std::move(*plan);
  }
  if (const Path* path = requested_path(engine.device)) {
    std::optional<Plan> plan = plan_of(*path, block, &why_not);
    TORCH_CHECK(
        plan,
        op,
        ": LLTM_SEQUENCE_PATH=",
        path->name,
        ", but the ",
        path->name,
        " path cannot run ",
        describe(block),
        " here: ",
        why_not,
        ". Unset it, or set it to auto or to another path of the ",
        c10::DeviceTypeName(engine.device),
        ": ",
        path_names(engine.device));
    return std::move(*plan);
  }
  std::vector<Plan> plans;
  for (const Path* path : paths(engine.device)) {
    // Paths that share a backward (fused_input runs fused's) are one
    // candidate there, the first by rank.
    if (block.backward &&
        std::any_of(plans.begin(), plans.end(), [&](const Plan& other) {
          return other.path->backward == path->backward;
        })) {
      continue;
    }
    if (std::optional<Plan> plan = plan_of(*path, block, &why_not)) {
      plans.push_back(std::move(*plan));
    }
  }
  TORCH_INTERNAL_ASSERT(
      !plans.empty(),
      "no sequence path of the ",
      engine.device,
      " runs ",
      describe(block));
  if (plans.size() == 1) {
    return std::move(plans.front());
  }
  return chosen(engine, block, plans);
}

std::optional<Plan> plan_for(
    const Engine& engine,
    const std::string& name,
    const Block& block,
    std::string* why_not) {
  if (name.empty() || name == "auto") {
    return plan_block(engine, block, "lltm.paths.plan");
  }
  const Path* path = find_path(engine.device, name);
  TORCH_CHECK_VALUE(
      path != nullptr,
      "lltm.paths.plan: expected auto or a sequence path of the ",
      c10::DeviceTypeName(engine.device),
      ": ",
      path_names(engine.device),
      ", but got ",
      name);
  return plan_of(*path, block, why_not);
}

std::vector<double> time_steps(
    int64_t steps,
    int64_t timed,
    c10::function_ref<std::vector<double>(int64_t)> time) {
  if (steps <= timed) {
    return time(steps);
  }
  const int64_t few = timed / 4;
  const std::vector<double> at_few = time(few);
  const std::vector<double> at_timed = time(timed);
  std::vector<double> out;
  for (const auto i : c10::irange(at_few.size())) {
    const double per_step = std::max(
        0.0, (at_timed[i] - at_few[i]) / static_cast<double>(timed - few));
    out.push_back(at_few[i] + per_step * static_cast<double>(steps - few));
  }
  return out;
}

namespace {

// Values of the cell's usual range, from no generator.
at::Tensor made_up(
    at::IntArrayRef sizes,
    double scale,
    const at::TensorOptions& options) {
  return at::arange(
             c10::multiply_integers(sizes),
             options.dtype(at::kFloat).device(at::kCPU))
      .mul_(0.37)
      .sin_()
      .mul_(scale)
      .view(sizes)
      .to(options);
}

// Each of `n` candidates' best microseconds on the engine's clock. Each
// runs once untimed (its allocations, packed weights and the output's first
// pages); then they take turns over rounds, each round starting one
// candidate further on, so that the machine's drift reaches all of them
// alike. A turn of a run under kShortUs is an untimed run and a timed one:
// the timed run then finds the caches as a loop of its own calls leaves
// them, not as another path's run does. Rounds go on past `fewest` until
// they have taken kRoundsUs, since a block of a few steps takes about as
// long as the noise between two runs (docs/performance.md, "Timing the
// candidates").
constexpr int kMostRounds = 15;
constexpr double kRoundsUs = 20'000;
constexpr double kShortUs = 2'000;

std::vector<double> best_interleaved(
    const Engine& engine,
    size_t n,
    int fewest,
    c10::function_ref<void(size_t)> run) {
  std::vector<bool> short_run(n);
  for (const auto i : c10::irange(n)) {
    short_run[i] = engine.time_us([&] { run(i); }) < kShortUs;
  }
  std::vector<double> best(n, std::numeric_limits<double>::infinity());
  double spent = 0;
  for (int round = 0;
       round < fewest || (round < kMostRounds && spent < kRoundsUs);
       ++round) {
    for (const auto k : c10::irange(n)) {
      const size_t i = (k + static_cast<size_t>(round)) % n;
      if (short_run[i]) {
        run(i);
      }
      const double took = engine.time_us([&] { run(i); });
      best[i] = std::min(best[i], took);
      spent += took;
    }
  }
  return best;
}

// A block of made-up values that the candidates run over, made once; a
// backward's saved values come from one forward, since any path's forward
// saves what any path's backward reads.
class Trial {
 public:
  Trial(const Engine& engine, const Block& block, const Path& first)
      : engine_(engine), block_(block) {
    const auto [T, B, F, S] = block.sizes;
    const auto options =
        at::TensorOptions().dtype(block.dtype).device(engine.device);
    input_ = made_up({T, B, F}, 1.0, options);
    weights_ = made_up({3 * S, S + F}, 1.0 / std::sqrt(double(S + F)), options);
    bias_ = made_up({3 * S}, 0.1, options);
    h0_ = made_up({B, S}, 0.5, options);
    c0_ = made_up({B, S}, 0.5, options);
    if (block.backward) {
      const Forced forced(&first, &first);
      const at::DisableRecordFunctionGuard unrecorded;
      std::tie(output_, std::ignore, std::ignore, cells_, gates_) = run_forward(
          Problem{block.sizes}, input_, inputs(), engine, /*save=*/true, kOp);
      grad_output_ = made_up({T, B, S}, 1.0, options);
    }
  }

  // One run of `path` over the block, the op's work around it included.
  void run(const Path& path) const {
    const Forced forced(&path, &path);
    const Problem p{block_.sizes};
    if (!block_.backward) {
      run_forward(p, input_, inputs(), engine_, block_.save, kOp);
      return;
    }
    const BackwardInputs back{
        grad_output_, std::nullopt, std::nullopt, weights_, cells_, gates_};
    run_backward(
        p, input_, h0_, output_, back, {true, true, true, true, true}, engine_);
  }

 private:
  static constexpr const char* kOp = "lltm::sequence (measuring a path)";

  ForwardInputs inputs() const {
    return ForwardInputs{weights_, bias_, h0_, c0_};
  }

  const Engine& engine_;
  const Block& block_;
  at::Tensor input_, weights_, bias_, h0_, c0_, output_, cells_, gates_;
  std::optional<at::Tensor> grad_output_;
};

} // namespace

std::vector<double> time_paths(
    const Engine& engine,
    c10::ArrayRef<const Path*> paths,
    const Block& block) {
  TORCH_INTERNAL_ASSERT(!paths.empty());
  // The runs are the choice's, not the caller's: a profiler sees none.
  const at::DisableRecordFunctionGuard unrecorded;
  const Trial trial(engine, block, *paths.front());
  return best_interleaved(
      engine, paths.size(), 3, [&](size_t i) { trial.run(*paths[i]); });
}

size_t choose_library(
    const Engine& engine,
    const std::string& key,
    c10::ArrayRef<const char*> libraries,
    size_t rule,
    c10::function_ref<void(size_t)> run) {
  const auto index_of = [&](const std::string& name) {
    for (const auto i : c10::irange(libraries.size())) {
      if (name == libraries[i]) {
        return i;
      }
    }
    return libraries.size();
  };
  if (std::optional<Choice> kept = kept_choice(key)) {
    if (const size_t i = index_of(kept->path); i < libraries.size()) {
      return i;
    }
    forget(key);
  }
  if (libraries.size() == 1 || !tuning_enabled()) {
    keep(key, Choice{libraries[rule], libraries[rule], "rules", {}});
    return rule;
  }
  // Each run is a whole GEMM over every step's rows: two rounds will do.
  const std::vector<double> times =
      best_interleaved(engine, libraries.size(), 2, run);
  Choice choice{"", "", "measured", {}};
  size_t best = 0;
  for (const auto i : c10::irange(libraries.size())) {
    choice.times.emplace_back(libraries[i], times[i]);
    if (times[i] < times[best]) {
      best = i;
    }
  }
  choice.path = choice.plan = libraries[best];
  return index_of(keep(key, std::move(choice)).path);
}

int64_t power_of_two_at_least(int64_t n) {
  int64_t p = 1;
  while (p < n) {
    p *= 2;
  }
  return p;
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
    t.choices.emplace(key, Choice{path, path, "cache", {}});
  }
}

void clear() {
  Table& t = table();
  const std::lock_guard<std::mutex> lock(t.mutex);
  t.choices.clear();
}

Forced::Forced(const Path* forward, const Path* backward)
    : previous_{forced_paths[0], forced_paths[1]} {
  forced_paths[0] = forward;
  forced_paths[1] = backward;
}

Forced::~Forced() {
  forced_paths[0] = previous_[0];
  forced_paths[1] = previous_[1];
}

const Path* Forced::get(bool backward) {
  return forced_paths[backward ? 1 : 0];
}

bool Forced::active() {
  return forced_paths[0] != nullptr || forced_paths[1] != nullptr;
}

} // namespace lltm::sequence::choice
