// The LLTM operators: their C++ entry points and the input checks that every
// backend shares.
//
// Two families of ops, both in the `lltm` namespace of the dispatcher:
//
// * The tutorial's contract, `lltm::forward` (7 outputs) and `lltm::backward`
//   (5 outputs), which `lltm._C.forward`/`backward` expose unchanged.
// * The cell that `lltm.lltm` and `lltm.LLTM` use: `lltm::cell` returns only
//   (new_h, new_cell); its C++ autograd kernel (autograd.cpp) calls
//   `lltm::cell_forward`, which also returns what the backward needs, and
//   `lltm::cell_backward`, which computes only the gradients asked for.
//
// The schemas live in lltm.cpp (TORCH_LIBRARY). Each backend registers its
// kernels with TORCH_LIBRARY_IMPL in its own file (cpu.cpp, and
// cuda.cpp when CUDA is built). Every kernel calls the check helper of
// its op first, so all backends reject bad input with the same message.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/ScalarType.h>
#include <c10/util/ArrayRef.h>

#include <array>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <tuple>

namespace lltm {

// (new_h, new_cell, input_gate, output_gate, candidate_cell, X, gate_weights)
using ForwardResult = std::tuple<
    at::Tensor,
    at::Tensor,
    at::Tensor,
    at::Tensor,
    at::Tensor,
    at::Tensor,
    at::Tensor>;

// (d_old_h, d_input, d_weights, d_bias, d_old_cell)
using BackwardResult =
    std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;

// (new_h, new_cell)
using CellResult = std::tuple<at::Tensor, at::Tensor>;

// (new_h, new_cell, gates, X): gates = [i | o | g], the activations of the
// three gates, [batch, 3 * state_size]; X = [old_h | input] when asked for
// (the weights' gradient needs it), else undefined.
using CellForwardResult =
    std::tuple<at::Tensor, at::Tensor, at::Tensor, std::optional<at::Tensor>>;

// (d_input, d_weights, d_bias, d_old_h, d_old_cell), in the order of the
// forward's inputs; each is undefined unless its output_mask entry is set.
// d_bias is [3 * state_size].
using CellBackwardResult = std::tuple<
    std::optional<at::Tensor>,
    std::optional<at::Tensor>,
    std::optional<at::Tensor>,
    std::optional<at::Tensor>,
    std::optional<at::Tensor>>;

// Which of (input, weights, bias, old_h, old_cell) need a gradient.
using OutputMask = std::array<bool, 5>;

// The typed handle of one of lltm's ops, e.g. find_op<CellResult(...)>(
// "lltm::cell"); look it up once, into a static.
template <typename Signature>
c10::TypedOperatorHandle<Signature> find_op(const char* name) {
  return c10::Dispatcher::singleton()
      .findSchemaOrThrow(name, "")
      .template typed<Signature>();
}

// The dtypes every backend supports: float32, float64, float16 and bfloat16.
c10::ArrayRef<at::ScalarType> supported_dtypes();

struct Sizes {
  int64_t batch;
  int64_t input_features;
  int64_t state_size;
};

// Validates the arguments of lltm::forward, lltm::cell and
// lltm::cell_forward (`op` names the op in the message) and returns the
// problem sizes. Throws c10::Error with a message that names the offending
// argument.
Sizes check_forward_args(
    const at::Tensor& input,
    const at::Tensor& weights,
    const at::Tensor& bias,
    const at::Tensor& old_h,
    const at::Tensor& old_cell,
    const char* op = "lltm::forward");

// Validates the arguments of lltm::backward and returns the problem sizes.
Sizes check_backward_args(
    const at::Tensor& grad_h,
    const at::Tensor& grad_cell,
    const at::Tensor& new_cell,
    const at::Tensor& input_gate,
    const at::Tensor& output_gate,
    const at::Tensor& candidate_cell,
    const at::Tensor& X,
    const at::Tensor& gate_weights,
    const at::Tensor& weights);

// Validates the arguments of lltm::cell_backward and returns the sizes.
Sizes check_cell_backward_args(
    const std::optional<at::Tensor>& grad_h,
    const std::optional<at::Tensor>& grad_cell,
    const at::Tensor& new_cell,
    const at::Tensor& gates,
    const std::optional<at::Tensor>& X,
    const at::Tensor& weights,
    const OutputMask& output_mask);

// The pieces of the input checks, shared by the checks of every op (the
// sequence ops' too, in cpp/sequence/checks.cpp), so that all say the same
// words.
namespace checks {

struct Arg {
  const at::Tensor& tensor;
  const char* name;
};

// "[4, 5]".
std::string shape_str(c10::IntArrayRef sizes);

// Every tensor is defined, of a supported floating dtype, and has the dtype
// and device of the first one.
void check_dtypes_and_devices(const char* op, std::initializer_list<Arg> args);

// arg has `dim` dimensions; `layout` names them ("[batch, state_size]").
void check_dim(const char* op, const Arg& arg, int64_t dim, const char* layout);

void check_shape(
    const char* op,
    const Arg& arg,
    c10::IntArrayRef expected,
    const char* layout);

// An argument that may be None: it takes part in the checks below only when
// given (else its tensor is undefined).
Arg optional_arg(const std::optional<at::Tensor>& t, const char* name);

// Each given one of args has the dtype and device of `like`.
void check_given_like(
    const char* op,
    const Arg& like,
    std::initializer_list<Arg> args);

// check_dim and check_shape of each given one of args.
void check_dims(
    const char* op,
    std::initializer_list<Arg> args,
    int64_t dim,
    const char* layout);
void check_shapes(
    const char* op,
    std::initializer_list<Arg> args,
    c10::IntArrayRef expected,
    const char* layout);

// bias is [3 * state_size] or [1, 3 * state_size].
void check_bias(const char* op, const at::Tensor& bias, int64_t state_size);

} // namespace checks

// The GEMMs, shared by every backend (ATen picks BLAS or cuBLAS, and with
// it the float32 precision setting, as for any matmul).

// W_h = weights[:, :S] and W_x = weights[:, S:], views: the GEMMs read the
// column blocks in place.
at::Tensor weights_h(const at::Tensor& weights, int64_t state_size);
at::Tensor weights_x(const at::Tensor& weights, int64_t state_size);

// Writes the gate pre-activations without the bias into `out` ([batch,
// 3 * state_size]): X W^T with X = [old_h | input] given, else
// old_h W_h^T + input W_x^T, which never materializes X.
void gate_preactivations(
    at::Tensor& out,
    const at::Tensor& input,
    const at::Tensor& weights,
    const at::Tensor& old_h,
    const std::optional<at::Tensor>& X);

// From d_gates = dZ ([batch, 3 * state_size]): d_weights = dZ^T X,
// d_old_h = dZ W_h and d_input = dZ W_x, each only when its mask entry
// (input, weights, old_h of OutputMask) is set. One GEMM each, so that the
// two input gradients come out dense.
void backward_gemms(
    const at::Tensor& d_gates,
    const std::optional<at::Tensor>& X,
    const at::Tensor& weights,
    const OutputMask& output_mask,
    CellBackwardResult& result);

// The signatures of the ops' kernels; the schemas (lltm.cpp) name the
// arguments. ops.h calls the ops through the dispatcher with them, which is
// the C++ API.
using ForwardSignature = ForwardResult(
    const at::Tensor& input,
    const at::Tensor& weights,
    const at::Tensor& bias,
    const at::Tensor& old_h,
    const at::Tensor& old_cell);
using BackwardSignature = BackwardResult(
    const at::Tensor& grad_h,
    const at::Tensor& grad_cell,
    const at::Tensor& new_cell,
    const at::Tensor& input_gate,
    const at::Tensor& output_gate,
    const at::Tensor& candidate_cell,
    const at::Tensor& X,
    const at::Tensor& gate_weights,
    const at::Tensor& weights);
// Signature with another result and more parameters after its own: the
// signature of an op that takes the inputs of another.
template <typename Result, typename Signature, typename... More>
struct Extend;
template <typename Result, typename R, typename... Args, typename... More>
struct Extend<Result, R(Args...), More...> {
  using type = Result(Args..., More...);
};
using CellSignature = Extend<CellResult, ForwardSignature>::type;
// ..., bool save_X
using CellForwardSignature =
    Extend<CellForwardResult, ForwardSignature, bool>::type;
using CellBackwardSignature = CellBackwardResult(
    const std::optional<at::Tensor>& grad_h,
    const std::optional<at::Tensor>& grad_cell,
    const at::Tensor& new_cell,
    const at::Tensor& gates,
    const std::optional<at::Tensor>& X,
    const at::Tensor& weights,
    OutputMask output_mask);

// The implementation in ATen operations alone, on any device: the
// tutorial's "C++ extension" that the benchmark compares the kernels with
// (lltm._C._forward_aten and _backward_aten).
namespace aten {
ForwardSignature forward;
BackwardSignature backward;
} // namespace aten

} // namespace lltm
