// The pybind11 module: the tutorial's API, `forward` and `backward` returning
// lists, over the dispatcher ops of lltm.cpp.
//
// pybind11 comes from torch's own bundled headers (<torch/include/pybind11>),
// never from a second copy: torch's Tensor type caster is compiled against
// those headers, and two copies in one translation unit build fine but break
// at run time. CMake adds no other pybind11 include directory.
#include "lltm.h"

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/version.h>

#include <string>
#include <vector>

#ifndef TORCH_EXTENSION_NAME
#error "TORCH_EXTENSION_NAME must name the module (CMake and torch JIT set it)"
#endif

namespace py = pybind11;

namespace {

std::vector<at::Tensor> forward(
    const at::Tensor& input,
    const at::Tensor& weights,
    const at::Tensor& bias,
    const at::Tensor& old_h,
    const at::Tensor& old_cell) {
  auto [new_h, new_cell, input_gate, output_gate, candidate_cell, X, gates] =
      lltm::forward(input, weights, bias, old_h, old_cell);
  return {new_h, new_cell, input_gate, output_gate, candidate_cell, X, gates};
}

std::vector<at::Tensor> backward(
    const at::Tensor& grad_h,
    const at::Tensor& grad_cell,
    const at::Tensor& new_cell,
    const at::Tensor& input_gate,
    const at::Tensor& output_gate,
    const at::Tensor& candidate_cell,
    const at::Tensor& X,
    const at::Tensor& gate_weights,
    const at::Tensor& weights) {
  auto [d_old_h, d_input, d_weights, d_bias, d_old_cell] = lltm::backward(
      grad_h,
      grad_cell,
      new_cell,
      input_gate,
      output_gate,
      candidate_cell,
      X,
      gate_weights,
      weights);
  return {d_old_h, d_input, d_weights, d_bias, d_old_cell};
}

} // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() =
      "LLTM forward and backward, the tutorial's API over the lltm:: "
      "dispatcher ops.";
  m.def(
      "forward",
      &forward,
      "LLTM forward. Returns [new_h, new_cell, input_gate, output_gate, "
      "candidate_cell, X, gate_weights].",
      py::arg("input"),
      py::arg("weights"),
      py::arg("bias"),
      py::arg("old_h"),
      py::arg("old_cell"),
      py::call_guard<py::gil_scoped_release>());
  m.def(
      "backward",
      &backward,
      "LLTM backward. Returns [d_old_h, d_input, d_weights, d_bias, "
      "d_old_cell].",
      py::arg("grad_h"),
      py::arg("grad_cell"),
      py::arg("new_cell"),
      py::arg("input_gate"),
      py::arg("output_gate"),
      py::arg("candidate_cell"),
      py::arg("X"),
      py::arg("gate_weights"),
      py::arg("weights"),
      py::call_guard<py::gil_scoped_release>());
  m.def(
      "supported_dtypes",
      [] { return lltm::supported_dtypes().vec(); },
      "The dtypes the kernels are built for.");
  // Recorded at compile time, so Python can check which headers were used.
  m.attr("PYBIND11_VERSION") = std::to_string(PYBIND11_VERSION_MAJOR) + "." +
      std::to_string(PYBIND11_VERSION_MINOR) + "." +
      std::to_string(PYBIND11_VERSION_MICRO);
  m.attr("TORCH_VERSION") = std::to_string(TORCH_VERSION_MAJOR) + "." +
      std::to_string(TORCH_VERSION_MINOR) + "." +
      std::to_string(TORCH_VERSION_PATCH);
}
