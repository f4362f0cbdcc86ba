// Tensors that are not plain strided tensors: sparse (COO, CSR, CSC, BSR,
// BSC), MKL-DNN, nested and quantized ones. They dispatch to their own keys,
// where lltm has no kernel, so without this file a call fails with
// "Could not run 'lltm::cell' with arguments from the 'SparseCPU' backend",
// which names no argument. Here every lltm op gets, at those keys, one boxed
// kernel that finds the first such argument and names it, in the words of
// the fake kernels' _check_layouts (src/lltm/ops.py). A quantized tensor is
// strided, and is rejected for its dtype by the shared dtype check.
#include "lltm.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <torch/library.h>

#include <string>

namespace lltm {
namespace {

std::string layout_name(c10::Layout layout) {
  switch (layout) {
    case c10::kSparse:
      return "torch.sparse_coo";
    case c10::kSparseCsr:
      return "torch.sparse_csr";
    case c10::kSparseCsc:
      return "torch.sparse_csc";
    case c10::kSparseBsr:
      return "torch.sparse_bsr";
    case c10::kSparseBsc:
      return "torch.sparse_bsc";
    case c10::kMkldnn:
      return "torch._mkldnn";
    case c10::kJagged:
      return "torch.jagged";
    default:
      return "torch.strided";
  }
}

void check_layout(
    const char* op,
    const std::string& name,
    const at::Tensor& t) {
  TORCH_CHECK_TYPE(
      !t.is_nested(),
      op,
      ": expected ",
      name,
      " to be a strided tensor, but got a nested tensor");
  TORCH_CHECK_TYPE(
      t.layout() == c10::kStrided,
      op,
      ": expected ",
      name,
      " to be a strided tensor, but got a tensor of layout ",
      layout_name(t.layout()));
  if (t.is_quantized()) {
    checks::check_dtypes_and_devices(op, {checks::Arg{t, name.c_str()}});
  }
}

// The boxed kernel of every op at the keys below: the arguments are the last
// entries of the stack, in the schema's order.
void reject_non_strided(
    const c10::OperatorHandle& handle,
    torch::jit::Stack* stack) {
  const auto& schema = handle.schema();
  const std::string op = schema.name();
  const auto& arguments = schema.arguments();
  const size_t first = stack->size() - arguments.size();
  for (size_t i = 0; i < arguments.size(); ++i) {
    const c10::IValue& value = (*stack)[first + i];
    if (value.isTensor()) {
      check_layout(op.c_str(), arguments[i].name(), value.toTensor());
    }
  }
  TORCH_CHECK_TYPE(
      false,
      op,
      ": expected strided tensors, but got a tensor of another kind");
}

void register_rejections(torch::Library& m) {
  for (const char* name :
       {"forward",
        "backward",
        "cell",
        "cell_forward",
        "cell_backward",
        "sequence",
        "sequence_forward",
        "sequence_backward"}) {
    m.impl(
        name, torch::CppFunction::makeFromBoxedFunction<&reject_non_strided>());
  }
}

} // namespace
} // namespace lltm

TORCH_LIBRARY_IMPL(lltm, SparseCPU, m) {
  lltm::register_rejections(m);
}
TORCH_LIBRARY_IMPL(lltm, SparseCUDA, m) {
  lltm::register_rejections(m);
}
TORCH_LIBRARY_IMPL(lltm, SparseMeta, m) {
  lltm::register_rejections(m);
}
TORCH_LIBRARY_IMPL(lltm, SparseCsrCPU, m) {
  lltm::register_rejections(m);
}
TORCH_LIBRARY_IMPL(lltm, SparseCsrCUDA, m) {
  lltm::register_rejections(m);
}
TORCH_LIBRARY_IMPL(lltm, SparseCsrMeta, m) {
  lltm::register_rejections(m);
}
TORCH_LIBRARY_IMPL(lltm, MkldnnCPU, m) {
  lltm::register_rejections(m);
}
TORCH_LIBRARY_IMPL(lltm, NestedTensorCPU, m) {
  lltm::register_rejections(m);
}
TORCH_LIBRARY_IMPL(lltm, NestedTensorCUDA, m) {
  lltm::register_rejections(m);
}
TORCH_LIBRARY_IMPL(lltm, QuantizedCPU, m) {
  lltm::register_rejections(m);
}
TORCH_LIBRARY_IMPL(lltm, QuantizedCUDA, m) {
  lltm::register_rejections(m);
}
