// Autocast for the forward ops (cell, cell_forward, forward, sequence,
// sequence_forward): inside torch.autocast, their floating inputs are cast to
// the autocast dtype (bfloat16 or float16) and the op runs, and returns, in
// that dtype. This is PyTorch's lower_precision_fp policy, the one of
// aten::lstm_cell and of the GEMMs the LLTM is made of. As in ATen, float64
// tensors are left as they are, and only tensors on the autocast device are
// cast. The casts sit above autograd, so gradients flow back to float32
// parameters in float32. The backward ops are not wrapped: autograd runs
// them outside autocast, on the dtype the forward ran in.
#include "cpp/ops/ops.h"

#include <ATen/autocast_mode.h>
#include <torch/library.h>

namespace lltm {
namespace {

// ATen's own autocast kernel of each op, with the lower_precision_fp policy:
// autocast off for the call, the tensors cast as cached_cast casts them.
template <c10::DeviceType device, typename... Ops>
void impl(torch::Library& m) {
  (m.impl(
       Ops::name,
       &at::autocast::WrapFunction<
           at::autocast::CastPolicy::lower_precision_fp,
           device,
           typename Ops::Signature,
           typename Ops::Signature,
           &Ops::call>::type::call),
   ...);
}

template <c10::DeviceType device>
void register_autocast(torch::Library& m) {
  impl<
      device,
      ops::Cell,
      ops::CellForward,
      ops::Forward,
      ops::Sequence,
      ops::SequenceForward>(m);
}

} // namespace
} // namespace lltm

TORCH_LIBRARY_IMPL(lltm, AutocastCPU, m) {
  lltm::register_autocast<c10::DeviceType::CPU>(m);
}
TORCH_LIBRARY_IMPL(lltm, AutocastCUDA, m) {
  lltm::register_autocast<c10::DeviceType::CUDA>(m);
}
