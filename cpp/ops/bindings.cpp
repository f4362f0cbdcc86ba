// The pybind11 module: the tutorial's API, `forward` and `backward` returning
// lists, over the dispatcher ops of lltm.cpp.
//
// pybind11 comes from torch's own bundled headers (<torch/include/pybind11>),
// never from a second copy: torch's Tensor type caster is compiled against
// those headers, and two copies in one translation unit build fine but break
// at run time. CMake adds no other pybind11 include directory.
#include "cpp/cell/cell.h"
#include "cpp/ops/ops.h"
#include "cpp/sequence/choice.h"
#include "cpp/sequence/path.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/TypeTraits.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/version.h>

#include <cstddef>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#ifndef TORCH_EXTENSION_NAME
#error "TORCH_EXTENSION_NAME must name the module (CMake and torch JIT set it)"
#endif

namespace py = pybind11;

namespace {

// The tutorial's API returns lists; `Impl` calls the op through the
// dispatcher (ops.h) or, for the benchmark's baseline, is the ATen-only
// implementation.
template <auto Impl>
struct AsList {
  template <typename Op, typename... Args>
  static std::vector<at::Tensor> call(const Args&... args) {
    return std::apply(
        [](auto&&... t) { return std::vector<at::Tensor>{std::move(t)...}; },
        Impl(args...));
  }
};

// Defines `name` as Impl, which has Op's signature, with its keyword
// arguments named as in Op's schema, and the GIL released.
template <typename Op, auto Impl, size_t... k>
void def(
    py::module_& m,
    const char* name,
    const char* doc,
    std::index_sequence<k...> /*ks*/) {
  const auto& args = c10::Dispatcher::singleton()
                         .findSchemaOrThrow(Op::name, "")
                         .schema()
                         .arguments();
  m.def(
      name,
      &Op::template kernel<AsList<Impl>>,
      doc,
      py::arg(args[k].name().c_str())...,
      py::call_guard<py::gil_scoped_release>());
}

template <typename Op, auto Impl>
void def(py::module_& m, const char* name, const char* doc) {
  constexpr size_t arity =
      c10::guts::function_traits<typename Op::Signature>::number_of_parameters;
  def<Op, Impl>(m, name, doc, std::make_index_sequence<arity>());
}

} // namespace

// Free-threaded CPython (3.14t): the module declares that it runs without the
// GIL, so that importing it does not turn the GIL back on. What makes that
// safe, path by path:
// - forward, backward and the _aten pair already run with the GIL released
//   (py::gil_scoped_release above), alongside any Python thread, so
//   nothing below them relied on the GIL before either. They touch no Python
//   object; the tensors are reference-counted by c10 (atomically).
// - Their one-time state is C++11 function-local statics (the dispatcher
//   handles of find_op, the CPU kernel table of cpu::best_kernels, the
//   sequence step loops): initialized once under the compiler's guard,
//   read-only after. The dispatcher's lookups take its own lock. The CUDA
//   device caches (cuda/common/device.h) are std::atomic, and like all of
//   the above already ran with the GIL released.
// - The argument and result conversions are pybind11's (3.x, which locks its
//   internals on a free-threaded build) and torch's Tensor caster, the same
//   torch's own free-threaded wheels use.
// - The module's attributes are set here, during import, under the import
//   lock; supported_dtypes returns a copy of a constant array.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m, py::mod_gil_not_used()) {
  m.doc() =
      "LLTM forward and backward, the tutorial's API over the lltm:: "
      "dispatcher ops.";
  def<lltm::ops::Forward, &lltm::ops::Forward::call>(
      m,
      "forward",
      "LLTM forward. Returns [new_h, new_cell, input_gate, output_gate, "
      "candidate_cell, X, gate_weights].");
  def<lltm::ops::Backward, &lltm::ops::Backward::call>(
      m,
      "backward",
      "LLTM backward. Returns [d_old_h, d_input, d_weights, d_bias, "
      "d_old_cell].");
  // The ATen-only implementation on any device, without the dispatcher:
  // the benchmark's "C++ on the GPU" baseline.
  def<lltm::ops::Forward, &lltm::aten::forward>(
      m,
      "_forward_aten",
      "forward() computed with ATen operations only, on any device.");
  def<lltm::ops::Backward, &lltm::aten::backward>(
      m,
      "_backward_aten",
      "backward() computed with ATen operations only, on any device.");
  m.def(
      "supported_dtypes",
      [] { return lltm::supported_dtypes().vec(); },
      "The dtypes the kernels are built for.");
  // The sequence paths (cpp/sequence/path.h) and their choices
  // (cpp/sequence/choice.h), for lltm.paths and lltm.tuning.
  m.def(
      "_sequence_paths",
      [](const at::Device& device) {
        std::vector<std::string> names;
        for (const auto* path : lltm::sequence::paths(device.type())) {
          names.emplace_back(path->name);
        }
        return names;
      },
      "The sequence paths of a device's type, by rank (none where lltm has "
      "no kernels for it).",
      py::arg("device"));
  m.def(
      "_sequence_plan",
      [](const std::string& path,
         const at::Device& device,
         at::ScalarType dtype,
         int64_t steps,
         int64_t batch,
         int64_t input_features,
         int64_t state_size,
         bool backward,
         bool save) {
        const auto* engine = lltm::sequence::engine(device.type());
        TORCH_CHECK_VALUE(
            engine != nullptr,
            "lltm.paths.plan: lltm has no sequence kernels for ",
            device.str());
        const c10::DeviceGuard guard(device);
        std::string why_not;
        const auto plan = lltm::sequence::choice::plan_for(
            *engine,
            path,
            {{steps, batch, input_features, state_size}, dtype, backward, save},
            &why_not);
        return plan ? std::make_pair(std::optional(plan->name()), why_not)
                    : std::make_pair(std::optional<std::string>(), why_not);
      },
      "The plan that runs a block of steps on `path` (\"auto\": the "
      "choice's): (its name, \"\"), or (None, why not).",
      py::arg("path"),
      py::arg("device"),
      py::arg("dtype"),
      py::arg("steps"),
      py::arg("batch"),
      py::arg("input_features"),
      py::arg("state_size"),
      py::arg("backward"),
      py::arg("save"),
      py::call_guard<py::gil_scoped_release>());
  m.def(
      "_path_choices",
      [] {
        std::vector<py::dict> out;
        for (const auto& [key, choice] : lltm::sequence::choice::choices()) {
          py::dict entry;
          entry["key"] = key;
          entry["path"] = choice.path;
          entry["plan"] = choice.plan;
          entry["source"] = choice.source;
          entry["times_us"] = choice.times;
          out.push_back(std::move(entry));
        }
        return out;
      },
      "The sequence paths chosen so far: key, path, plan, source, times_us.");
  m.def(
      "_load_path_choices",
      &lltm::sequence::choice::load,
      "Keep these (key, path) choices, where a key has none yet.",
      py::arg("entries"),
      py::call_guard<py::gil_scoped_release>());
  m.def(
      "_clear_path_choices",
      &lltm::sequence::choice::clear,
      "Forget every sequence path's choice.",
      py::call_guard<py::gil_scoped_release>());
  // Recorded at compile time, so Python can check which headers were used.
  m.attr("PYBIND11_VERSION") = std::to_string(PYBIND11_VERSION_MAJOR) + "." +
      std::to_string(PYBIND11_VERSION_MINOR) + "." +
      std::to_string(PYBIND11_VERSION_MICRO);
  m.attr("TORCH_VERSION") = std::to_string(TORCH_VERSION_MAJOR) + "." +
      std::to_string(TORCH_VERSION_MINOR) + "." +
      std::to_string(TORCH_VERSION_PATCH);
}
