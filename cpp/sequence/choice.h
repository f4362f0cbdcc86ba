// The choice of a sequence path, made once per kind of block and kept: by
// LLTM_SEQUENCE_PATH where it names a path that runs, else by measuring
// every path that can run (the way torch.backends.cudnn.benchmark does),
// else, where measuring is off (LLTM_TUNING=0), by the backend's model.
//
// A kind of block is its Key: the device's type, the dtype, the direction of
// autograd, whether the forward saves, the threads it has, and its sizes,
// with the steps past 32 and the batch in buckets (each shares the power of
// two at or above it), so that the segments of a packed batch share a few
// choices. Within a process a key has one choice
// from its first block on, so that results stay bitwise repeatable;
// lltm/tuning.py keeps the measured choices on disk between processes.
#pragma once

#include "cpp/sequence/sequence.h"

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/FunctionRef.h>

#include <string>
#include <utility>
#include <vector>

namespace lltm::sequence::choice {

struct Key {
  c10::DeviceType device;
  at::ScalarType dtype;
  bool backward;
  bool save;
  int64_t threads;
  Sizes sizes; // bucketed

  std::string str() const;
};

// The key of a block, its sizes bucketed.
Key key_of(
    c10::DeviceType device,
    at::ScalarType dtype,
    bool backward,
    bool save,
    int64_t threads,
    const Sizes& sizes);

// A block of `steps` steps' microseconds from time(n), the microseconds of
// n steps: timed as it is up to 32 steps, else extrapolated from 8 and 32
// (a call's fixed costs, such as packing W_h, and a cost per step).
double time_steps(int64_t steps, c10::function_ref<double(int64_t)> time);

// What was chosen for a key, and why.
struct Choice {
  std::string path;
  // "forced" (LLTM_SEQUENCE_PATH), "measured", "model", or "cache" (from
  // disk, through lltm/tuning.py).
  std::string source;
  // Microseconds per candidate for "measured", the model's estimate for
  // "model".
  std::vector<std::pair<std::string, double>> times;
};

// LLTM_SEQUENCE_PATH's value; "" for unset or auto. A value that names no
// path of any device raises, naming the ones there are.
std::string requested_path();

// Whether measuring is on (LLTM_TUNING, read at each choice: 1 by default).
bool tuning_enabled();

// The choice for `key` among `candidates` (the paths that can run it): the
// requested path where it is a candidate, else the kept choice, else the
// fastest by measure(candidate) (microseconds; one thread measures at a
// time, the others wait), else by model() (its estimate per candidate).
const StepLoops& choose(
    const Key& key,
    c10::ArrayRef<const StepLoops*> candidates,
    c10::function_ref<double(const StepLoops&)> measure,
    c10::function_ref<std::vector<double>()> model);

// The kept choices, for Python: (key, choice).
std::vector<std::pair<std::string, Choice>> choices();
// Choices from disk: (key, path); a key already chosen keeps its choice.
void load(const std::vector<std::pair<std::string, std::string>>& entries);
// Forget every choice (the tests' fresh start).
void clear();

// While one is alive, the thread's blocks run `forward` and `backward`
// (nullptr: the usual choice): how measure() times a candidate.
class Forced {
 public:
  Forced(const StepLoops* forward, const StepLoops* backward);
  ~Forced();
  Forced(const Forced&) = delete;
  Forced& operator=(const Forced&) = delete;

  // The forced loops of this thread, or nullptr.
  static const StepLoops* get(bool backward);
  // Whether this thread is measuring (inside a call of its own, whose
  // buffers the measured runs must leave alone).
  static bool active();

 private:
  const StepLoops* previous_[2];
};

} // namespace lltm::sequence::choice
