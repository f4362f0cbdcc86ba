// Tensors that are not plain strided tensors: sparse (COO, CSR, CSC, BSR,
// BSC), MKL-DNN, nested and quantized ones. They dispatch to their own keys,
// where lltm has no kernel, so without this file a call fails with
// "Could not run 'lltm::cell' with arguments from the 'SparseCPU' backend",
// which names no argument. Here every lltm op gets, at those keys, one boxed
// kernel that finds the first such argument and names it, in the words of
// the fake kernels' _check_layouts (src/lltm/ops.py). A quantized tensor is
// strided, and is rejected for its dtype by the shared dtype check.
#include "cpp/cell/cell.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <torch/library.h>

#include <iterator>
#include <string>
#include <utility>
#include <vector>

namespace lltm {
namespace {

const char* layout_name(c10::Layout layout) {
  constexpr std::pair<c10::Layout, const char*> kNames[] = {
      {c10::kSparse, "torch.sparse_coo"},
      {c10::kSparseCsr, "torch.sparse_csr"},
      {c10::kSparseCsc, "torch.sparse_csc"},
      {c10::kSparseBsr, "torch.sparse_bsr"},
      {c10::kSparseBsc, "torch.sparse_bsc"},
      {c10::kMkldnn, "torch._mkldnn"},
      {c10::kJagged, "torch.jagged"}};
  for (const auto& [known, name] : kNames) {
    if (known == layout) {
      return name;
    }
  }
  return "torch.strided";
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

// The keys that tensors other than plain strided ones dispatch to.
constexpr c10::DispatchKey kNonStridedKeys[] = {
    c10::DispatchKey::SparseCPU,
    c10::DispatchKey::SparseCUDA,
    c10::DispatchKey::SparseMeta,
    c10::DispatchKey::SparseCsrCPU,
    c10::DispatchKey::SparseCsrCUDA,
    c10::DispatchKey::SparseCsrMeta,
    c10::DispatchKey::MkldnnCPU,
    c10::DispatchKey::NestedTensorCPU,
    c10::DispatchKey::NestedTensorCUDA,
    c10::DispatchKey::QuantizedCPU,
    c10::DispatchKey::QuantizedCUDA};

// One library per key, as TORCH_LIBRARY_IMPL makes them: registered when the
// module loads, for as long as it stays loaded.
std::vector<torch::Library> register_rejections() {
  std::vector<torch::Library> libraries;
  libraries.reserve(std::size(kNonStridedKeys));
  for (const c10::DispatchKey key : kNonStridedKeys) {
    torch::Library& m = libraries.emplace_back(
        torch::Library::IMPL, "lltm", key, __FILE__, __LINE__);
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
          name,
          torch::CppFunction::makeFromBoxedFunction<&reject_non_strided>());
    }
  }
  return libraries;
}

const std::vector<torch::Library> rejections = register_rejections();

} // namespace
} // namespace lltm
