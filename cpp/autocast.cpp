// Autocast for the forward ops (cell, cell_forward, forward, sequence,
// sequence_forward): inside torch.autocast, their floating inputs are cast to
// the autocast dtype (bfloat16 or float16) and the op runs, and returns, in
// that dtype. This is PyTorch's lower_precision_fp policy, the one of
// aten::lstm_cell and of the GEMMs the LLTM is made of. As in ATen, float64
// tensors are left as they are, and only tensors on the autocast device are
// cast. The casts sit above autograd, so gradients flow back to float32
// parameters in float32. The backward ops are not wrapped: autograd runs
// them outside autocast, on the dtype the forward ran in.
#include "lltm.h"
#include "sequence.h"

#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

namespace lltm {
namespace {

using Cell = CellResult(
    const at::Tensor&,
    const at::Tensor&,
    const at::Tensor&,
    const at::Tensor&,
    const at::Tensor&);
using CellForward = CellForwardResult(
    const at::Tensor&,
    const at::Tensor&,
    const at::Tensor&,
    const at::Tensor&,
    const at::Tensor&,
    bool);
using Forward = ForwardResult(
    const at::Tensor&,
    const at::Tensor&,
    const at::Tensor&,
    const at::Tensor&,
    const at::Tensor&);
using Sequence = sequence::Result(
    const at::Tensor&,
    const at::Tensor&,
    const at::Tensor&,
    const at::Tensor&,
    const at::Tensor&);
using SequenceForward = sequence::ForwardResult(
    const at::Tensor&,
    const at::Tensor&,
    const at::Tensor&,
    const at::Tensor&,
    const at::Tensor&);

// Calls `op` with its five tensors cast to the autocast dtype of `device`,
// autocast off for the call, then any further (non-tensor) arguments.
template <c10::DeviceType device, typename Signature, typename... Extra>
auto call_cast(
    const c10::TypedOperatorHandle<Signature>& op,
    const at::Tensor& a,
    const at::Tensor& b,
    const at::Tensor& c,
    const at::Tensor& d,
    const at::Tensor& e,
    Extra... extra) {
  c10::impl::ExcludeDispatchKeyGuard no_autocast(
      at::autocast::get_autocast_dispatch_key_from_device_type(device));
  const at::ScalarType dtype =
      at::autocast::get_lower_precision_fp_from_device_type(device);
  const auto cast = [&](const at::Tensor& t) {
    return at::autocast::cached_cast(dtype, t, device);
  };
  return op.call(cast(a), cast(b), cast(c), cast(d), cast(e), extra...);
}

template <c10::DeviceType device>
CellResult cell_autocast(
    const at::Tensor& input,
    const at::Tensor& weights,
    const at::Tensor& bias,
    const at::Tensor& old_h,
    const at::Tensor& old_cell) {
  static const auto op = find_op<Cell>("lltm::cell");
  return call_cast<device>(op, input, weights, bias, old_h, old_cell);
}

template <c10::DeviceType device>
CellForwardResult cell_forward_autocast(
    const at::Tensor& input,
    const at::Tensor& weights,
    const at::Tensor& bias,
    const at::Tensor& old_h,
    const at::Tensor& old_cell,
    bool save_X) {
  static const auto op = find_op<CellForward>("lltm::cell_forward");
  return call_cast<device>(op, input, weights, bias, old_h, old_cell, save_X);
}

template <c10::DeviceType device>
ForwardResult forward_autocast(
    const at::Tensor& input,
    const at::Tensor& weights,
    const at::Tensor& bias,
    const at::Tensor& old_h,
    const at::Tensor& old_cell) {
  static const auto op = find_op<Forward>("lltm::forward");
  return call_cast<device>(op, input, weights, bias, old_h, old_cell);
}

template <c10::DeviceType device>
sequence::Result sequence_autocast(
    const at::Tensor& input,
    const at::Tensor& weights,
    const at::Tensor& bias,
    const at::Tensor& h0,
    const at::Tensor& c0) {
  static const auto op = find_op<Sequence>("lltm::sequence");
  return call_cast<device>(op, input, weights, bias, h0, c0);
}

template <c10::DeviceType device>
sequence::ForwardResult sequence_forward_autocast(
    const at::Tensor& input,
    const at::Tensor& weights,
    const at::Tensor& bias,
    const at::Tensor& h0,
    const at::Tensor& c0) {
  static const auto op = find_op<SequenceForward>("lltm::sequence_forward");
  return call_cast<device>(op, input, weights, bias, h0, c0);
}

template <c10::DeviceType device>
void register_autocast(torch::Library& m) {
  m.impl("cell", &cell_autocast<device>);
  m.impl("cell_forward", &cell_forward_autocast<device>);
  m.impl("forward", &forward_autocast<device>);
  m.impl("sequence", &sequence_autocast<device>);
  m.impl("sequence_forward", &sequence_forward_autocast<device>);
}

} // namespace
} // namespace lltm

TORCH_LIBRARY_IMPL(lltm, AutocastCPU, m) {
  lltm::register_autocast<c10::DeviceType::CPU>(m);
}
TORCH_LIBRARY_IMPL(lltm, AutocastCUDA, m) {
  lltm::register_autocast<c10::DeviceType::CUDA>(m);
}
