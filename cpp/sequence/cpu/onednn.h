// ATen's oneDNN ops, shared by the onednn path (its step's GEMM) and the
// CPU engine's GEMMs around the blocks (gemm.cpp).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>

#include <optional>

namespace lltm::sequence::cpu_paths {

// ATen's mkldnn ops, found through the dispatcher: torch builds without
// oneDNN have none.
struct OneDnnOps {
  using Reorder = at::Tensor(const at::Tensor&, std::optional<int64_t>);
  using Linear = at::Tensor(
      const at::Tensor&,
      const at::Tensor&,
      const std::optional<at::Tensor>&,
      c10::string_view,
      c10::List<std::optional<c10::Scalar>>,
      std::optional<c10::string_view>);
  using LinearAdd = at::Tensor(
      const at::Tensor&,
      const at::Tensor&,
      const at::Tensor&,
      const std::optional<at::Tensor>&,
      c10::string_view);

  // The ops where torch has them and oneDNN is enabled
  // (torch.backends.mkldnn.enabled), else nullptr.
  static const OneDnnOps* get();

  c10::TypedOperatorHandle<Reorder> reorder;
  c10::TypedOperatorHandle<Linear> linear;
  c10::TypedOperatorHandle<LinearAdd> linear_add;
};

} // namespace lltm::sequence::cpu_paths
