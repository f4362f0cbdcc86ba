// The paths of the sequence ops: each a way to run one dense block of steps
// on one device, one constant in a file of its own (cpu/<name>.cpp,
// cuda/<name>.cpp), registered in its device's table by one line
// (LLTM_REGISTER_SEQUENCE_PATH). A path's plan() says whether it can run a
// block, and how: the choice (choice.h) asks each path of the table, takes
// one plan per block, and the path's forward or backward executes that plan
// and chooses nothing more. A plan's name ("fused/held") is what
// lltm.paths_that_ran reports.
#pragma once

#include "cpp/sequence/sequence.h"

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>
#include <c10/util/ArrayRef.h>

#include <any>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace lltm::sequence {

struct Path;

// One dense block of steps, as a path is asked to run it.
struct Block {
  Sizes sizes;
  at::ScalarType dtype;
  // The backward's reverse loop, else a forward.
  bool backward;
  // A forward that saves for a backward, else an inference forward.
  bool save;
};

// How a path runs one block: made once by the path's plan(), executed by
// its forward or backward.
struct Plan {
  const Path* path = nullptr;
  // Which of the path's ways runs the block ("mma/coop/16x64"); empty where
  // the path has one way.
  std::string variant;
  // What the path's launchers read: the kernel library's own plan (CUDA's
  // cuda::SequencePlan), or nothing.
  std::any detail;
  // The forward adds the input's projection in float32 (a 16-bit path
  // whose steps accumulate in float32): run_forward computes it so, into
  // ForwardBuffers::projection, rather than rounded into gates.
  bool float32_projection = false;
  // The path's steps add the input's projection themselves, from
  // ForwardBuffers::input: run_forward runs no GEMM for the block.
  bool input_in_steps = false;

  // "fused/held", or the path's name where it has one way.
  std::string name() const;
};

struct Path {
  // As LLTM_SEQUENCE_PATH names it, and a file name under cpu/ or cuda/.
  const char* name;
  c10::DeviceType device;
  // Its place in its device's table: where the device chooses by rule, auto
  // takes the first path, by rank, whose window and plan hold.
  int rank;
  // The plan of a block this path can run (the choice sets its `path`);
  // else std::nullopt, and why not in *why_not ("float32 only").
  std::optional<Plan> (*plan)(const Block& block, std::string* why_not);
  // Where auto takes this path when the device chooses by rule (its
  // thresholds, named constants in the path's file), asked before its plan;
  // nullptr: everywhere.
  bool (*window)(const Block& block);
  // The model's microseconds for a block (LLTM_TUNING=0); nullptr: none, and
  // the model never picks this path.
  double (*estimate_us)(const Block& block);
  // The forward over buffers whose gates hold the input projection: every
  // step; without saving (cells undefined), c_t goes to c_n and gates may
  // keep the pre-activations.
  void (*forward)(
      const Plan& plan,
      const Sizes& sizes,
      const ForwardInputs& inputs,
      ForwardBuffers& buffers);
  // The reverse loop: writes d_gates ([T, B, 3S]) and returns d_c0, and
  // d_h0 too where output_mask[3] asks and the path can.
  StateGrads (*backward)(
      const Plan& plan,
      const Sizes& sizes,
      const BackwardInputs& inputs,
      const OutputMask& output_mask,
      at::Tensor& d_gates);
  // Both directions of a bidirectional call at once (inputs, buffers and
  // d_gates of direction 0, then 1, one dense block each): each step's work
  // of the two in one parallel region, where the engine runs them together
  // (Engine::together). nullptr: the path runs one direction a call.
  void (*forward_directions)(
      const Plan& plan,
      const Sizes& sizes,
      c10::ArrayRef<ForwardInputs> inputs,
      c10::ArrayRef<ForwardBuffers> buffers) = nullptr;
  std::vector<StateGrads> (*backward_directions)(
      const Plan& plan,
      const Sizes& sizes,
      c10::ArrayRef<BackwardInputs> inputs,
      const OutputMask& output_mask,
      c10::ArrayRef<at::Tensor> d_gates) = nullptr;
};

// The paths of a device, by rank.
c10::ArrayRef<const Path*> paths(c10::DeviceType device);

// The path of a device with this name, or nullptr.
const Path* find_path(c10::DeviceType device, std::string_view name);

// The engine of a device (sequence.h), or nullptr where none is built.
const Engine* engine(c10::DeviceType device);

// Static registrations, once per path and per engine, before any call.
struct PathRegistration {
  explicit PathRegistration(const Path& path);
};
struct EngineRegistration {
  explicit EngineRegistration(const Engine& engine);
};

} // namespace lltm::sequence

// Adds `path` (a Path constant) to its device's table.
#define LLTM_REGISTER_SEQUENCE_PATH(path)         \
  static const ::lltm::sequence::PathRegistration \
      lltm_sequence_path_registration_##path {    \
    path                                          \
  }
