// A prototype, for docs/stable-abi.md: the LLTM forward as a stable-ABI op,
// lltm_stable::forward, written against torch/csrc/stable only (no ATen, no
// pybind11), so that one build loads under every torch from the targeted one
// (TORCH_TARGET_VERSION) on. CPU, float32 and float64, contiguous inputs; it
// returns the tutorial's seven tensors. Built and loaded by
// docs/stable-abi/try_stable_abi.py.
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/Exception.h>

#include <cmath>
#include <cstdint>
#include <vector>

namespace {

using torch::stable::Tensor;

template <typename T>
T sigmoid(T z) {
  return T(1) / (T(1) + std::exp(-z));
}

template <typename T>
T elu(T z) {
  return z > T(0) ? z : std::expm1(z);
}

template <typename T>
void cell(
    const T* gates,
    const T* bias,
    const T* old_cell,
    T* new_h,
    T* new_cell,
    T* input_gate,
    T* output_gate,
    T* candidate,
    int64_t batch,
    int64_t state) {
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t s = 0; s < state; ++s) {
      const int64_t i = b * state + s;
      const T* row = gates + b * 3 * state;
      const T ig = sigmoid(row[s] + bias[s]);
      const T og = sigmoid(row[state + s] + bias[state + s]);
      const T cg = elu(row[2 * state + s] + bias[2 * state + s]);
      input_gate[i] = ig;
      output_gate[i] = og;
      candidate[i] = cg;
      new_cell[i] = old_cell[i] + cg * ig;
      new_h[i] = std::tanh(new_cell[i]) * og;
    }
  }
}

std::vector<Tensor> forward(
    Tensor input,
    Tensor weights,
    Tensor bias,
    Tensor old_h,
    Tensor old_cell) {
  const int64_t batch = input.size(0);
  const int64_t features = input.size(1);
  const int64_t state = old_h.size(1);
  STD_TORCH_CHECK(
      weights.size(0) == 3 * state && weights.size(1) == state + features,
      "lltm_stable::forward: weights must be [3 * state_size, state_size + "
      "input_features]");
  input = torch::stable::contiguous(input);
  old_h = torch::stable::contiguous(old_h);
  old_cell = torch::stable::contiguous(old_cell);
  bias = torch::stable::contiguous(bias);
  // X = [old_h | input], gates = X @ W^T (the bias is added in the cell loop).
  Tensor X = torch::stable::new_empty(input, {batch, state + features});
  Tensor left = torch::stable::narrow(X, 1, 0, state);
  Tensor right = torch::stable::narrow(X, 1, state, features);
  torch::stable::copy_(left, old_h);
  torch::stable::copy_(right, input);
  Tensor gate_weights = torch::stable::contiguous(
      torch::stable::matmul(X, torch::stable::transpose(weights, 0, 1)));
  Tensor new_h = torch::stable::new_empty(input, {batch, state});
  Tensor new_cell = torch::stable::new_empty(input, {batch, state});
  Tensor input_gate = torch::stable::new_empty(input, {batch, state});
  Tensor output_gate = torch::stable::new_empty(input, {batch, state});
  Tensor candidate = torch::stable::new_empty(input, {batch, state});
  const auto dtype = input.scalar_type();
  if (dtype == torch::headeronly::ScalarType::Float) {
    cell(
        gate_weights.const_data_ptr<float>(),
        bias.const_data_ptr<float>(),
        old_cell.const_data_ptr<float>(),
        new_h.mutable_data_ptr<float>(),
        new_cell.mutable_data_ptr<float>(),
        input_gate.mutable_data_ptr<float>(),
        output_gate.mutable_data_ptr<float>(),
        candidate.mutable_data_ptr<float>(),
        batch,
        state);
  } else if (dtype == torch::headeronly::ScalarType::Double) {
    cell(
        gate_weights.const_data_ptr<double>(),
        bias.const_data_ptr<double>(),
        old_cell.const_data_ptr<double>(),
        new_h.mutable_data_ptr<double>(),
        new_cell.mutable_data_ptr<double>(),
        input_gate.mutable_data_ptr<double>(),
        output_gate.mutable_data_ptr<double>(),
        candidate.mutable_data_ptr<double>(),
        batch,
        state);
  } else {
    STD_TORCH_CHECK(
        false, "lltm_stable::forward: the prototype takes float32 or float64");
  }
  return {new_h, new_cell, input_gate, output_gate, candidate, X, gate_weights};
}

} // namespace

STABLE_TORCH_LIBRARY(lltm_stable, m) {
  m.def(
      "forward(Tensor input, Tensor weights, Tensor bias, Tensor old_h, "
      "Tensor old_cell) -> Tensor[]");
}

STABLE_TORCH_LIBRARY_IMPL(lltm_stable, CPU, m) {
  m.impl("forward", TORCH_BOX(&forward));
}
