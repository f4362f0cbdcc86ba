// lltm's ops as the C++ that calls them through the dispatcher sees them:
// each op's name, the signature of its kernels and its typed handle, looked
// up once. The kernels above the backends (autograd.cpp, autocast.cpp) call
// the op again from here, each under its own guard that steps below its
// dispatch key.
#pragma once

#include "lltm.h"
#include "sequence.h"

#include <optional>

namespace lltm::ops {

// Op<name, Signature>::call calls the op through the dispatcher;
// kernel<Body> is a function of the op's signature, for registering a
// kernel or binding the op, whose body is Body::call<Op>(args...).
template <const char* Name, typename Signature>
struct Op;

template <const char* Name, typename R, typename... Args>
struct Op<Name, R(Args...)> {
  using Result = R;
  using Signature = R(Args...);
  static constexpr const char* name = Name;

  static Result call(Args... args) {
    static const auto op = find_op<Signature>(Name);
    return op.call(args...);
  }

  template <typename Body>
  static decltype(auto) kernel(Args... args) {
    return Body::template call<Op>(args...);
  }
};

// Signature with another result and more parameters after its own: an op
// that takes the inputs of another, and more.
template <typename Result, typename Signature, typename... More>
struct Extend;

template <typename Result, typename R, typename... Args, typename... More>
struct Extend<Result, R(Args...), More...> {
  using type = Result(Args..., More...);
};

inline constexpr char kCell[] = "lltm::cell";
inline constexpr char kCellForward[] = "lltm::cell_forward";
inline constexpr char kCellBackward[] = "lltm::cell_backward";
inline constexpr char kForward[] = "lltm::forward";
inline constexpr char kBackward[] = "lltm::backward";
inline constexpr char kSequence[] = "lltm::sequence";
inline constexpr char kSequenceForward[] = "lltm::sequence_forward";
inline constexpr char kSequenceBackward[] = "lltm::sequence_backward";

// The signatures are those of the C++ API where lltm.h or sequence.h
// declares one; the schemas (lltm.cpp, sequence.cpp) name the arguments.
using Cell = Op<kCell, decltype(cell)>;
using CellForward =
    Op<kCellForward, Extend<CellForwardResult, decltype(cell), bool>::type>;
using CellBackward =
    Op<kCellBackward,
       CellBackwardResult(
           const std::optional<at::Tensor>&,
           const std::optional<at::Tensor>&,
           const at::Tensor&,
           const at::Tensor&,
           const std::optional<at::Tensor>&,
           const at::Tensor&,
           OutputMask)>;
using Forward = Op<kForward, decltype(forward)>;
using Backward = Op<kBackward, decltype(backward)>;
using Sequence = Op<kSequence, decltype(sequence::run)>;
using SequenceForward =
    Op<kSequenceForward,
       Extend<sequence::ForwardResult, decltype(sequence::run)>::type>;
using SequenceBackward =
    Op<kSequenceBackward,
       sequence::BackwardResult(
           const std::optional<at::Tensor>&,
           const std::optional<at::Tensor>&,
           const std::optional<at::Tensor>&,
           const at::Tensor&,
           const at::Tensor&,
           const at::Tensor&,
           const at::Tensor&,
           const at::Tensor&,
           const at::Tensor&,
           OutputMask)>;

} // namespace lltm::ops
