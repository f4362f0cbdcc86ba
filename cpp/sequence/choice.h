// The choice of a path for each block of steps, and its plan:
//
// 1. LLTM_SEQUENCE_PATH, where set to a path of the block's device: that
//    path's plan, or an error with the path's own reason where it cannot run
//    the block.
// 2. Else the choice kept for the block's kind, else every path that can run
//    it timed on made-up values (the way torch.backends.cudnn.benchmark
//    does; CUDA with events on the current stream), the fastest kept for the
//    process; where measuring is off (LLTM_TUNING=0), the paths' model.
// 3. Else, inside a CUDA graph's capture (which cannot be timed), or where
//    measuring is off and the device has no model (CUDA): the first path of
//    the table whose window holds and whose plan runs the block, the device's
//    rules, decided again for each block.
//
// A kind of block is its key: the device, the dtype, the direction of
// autograd, whether the forward saves, what the device's measure depends on
// (the CPU's threads, the GPU's name), and its sizes, with the steps past the
// engine's steps_timed and the batch in buckets (each shares the power of two
// at or above it), so that the segments of a packed batch share a few choices.
// Within a process a key keeps its measured choice from its first block on, so
// that results stay bitwise repeatable; lltm/tuning.py keeps the measured
// choices on disk.
#pragma once

#include "cpp/sequence/path.h"

#include <c10/util/ArrayRef.h>
#include <c10/util/FunctionRef.h>

#include <string>
#include <utility>
#include <vector>

namespace lltm::sequence::choice {

// The plan of a block on `engine`'s device, by the rules above; `op` names
// the op in messages.
Plan plan_block(const Engine& engine, const Block& block, const char* op);

// The plan of `path` for a block, or std::nullopt with why not: what
// lltm.paths.plan() asks. "" or "auto" is the choice above (which measures
// where the device does).
std::optional<Plan> plan_for(
    const Engine& engine,
    const std::string& path,
    const Block& block,
    std::string* why_not);

// Of `libraries` (the ways to run one GEMM around the blocks, such as the
// input's projection), the one kept for `key` ("cpu|Float|gemm|threads=2|
// M=32768|K=30|N=180"), else the fastest of run(i) on `engine`'s clock
// (timed as the paths are, in turns, at least two rounds), kept for the
// process and on disk as a block's path is; where measuring is off,
// libraries[rule]. Returns its index.
size_t choose_library(
    const Engine& engine,
    const std::string& key,
    c10::ArrayRef<const char*> libraries,
    size_t rule,
    c10::function_ref<void(size_t)> run);

// The bucket of a size in a key: the power of two at or above n.
int64_t power_of_two_at_least(int64_t n);

// Each candidate's microseconds over a block of `steps` steps, from
// time(n), theirs over n steps: timed as it is up to `timed` steps, else
// extrapolated from timed / 4 and `timed` (a call's fixed costs, such as
// packing W_h, and a cost per step).
std::vector<double> time_steps(
    int64_t steps,
    int64_t timed,
    c10::function_ref<std::vector<double>(int64_t)> time);

// Microseconds that each of `paths` takes over a block of made-up values (not
// from torch's generator) on `engine`'s device, the op's work around the
// block included: each one's best run, the candidates taking turns over
// rounds after a warm-up each.
std::vector<double> time_paths(
    const Engine& engine,
    c10::ArrayRef<const Path*> paths,
    const Block& block);

// What was chosen for a key, and why.
struct Choice {
  std::string path;
  // The plan of the key's last block ("fused/held").
  std::string plan;
  // "measured", "model", "rules", "capture" (the rules, inside a CUDA
  // graph's capture), or "cache" (from disk, through lltm/tuning.py).
  std::string source;
  // Microseconds per candidate for "measured", the model's estimate for
  // "model".
  std::vector<std::pair<std::string, double>> times;
};

// Whether measuring is on (LLTM_TUNING, read at each choice: 1 by default).
bool tuning_enabled();

// The kept choices, for Python: (key, choice).
std::vector<std::pair<std::string, Choice>> choices();
// Choices from disk: (key, path); a key already chosen keeps its choice.
void load(const std::vector<std::pair<std::string, std::string>>& entries);
// Forget every choice (the tests' fresh start).
void clear();

// While one is alive, the thread's blocks run `forward` and `backward`
// (nullptr: the usual choice): how time_paths times a candidate.
class Forced {
 public:
  Forced(const Path* forward, const Path* backward);
  ~Forced();
  Forced(const Forced&) = delete;
  Forced& operator=(const Forced&) = delete;

  // The forced path of this thread, or nullptr.
  static const Path* get(bool backward);
  // Whether this thread is measuring (inside a call of its own, whose
  // buffers the measured runs must leave alone).
  static bool active();

 private:
  const Path* previous_[2];
};

} // namespace lltm::sequence::choice
