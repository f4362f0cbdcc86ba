// lltm's ops as the C++ that calls them through the dispatcher sees them:
// each op's name, the signature of its kernels and its typed handle, looked
// up once. The kernels above the backends (autograd.cpp, autocast.cpp) call
// the op again from here, each under its own guard that steps below its
// dispatch key.
#pragma once

#include "cpp/cell/cell.h"
#include "cpp/sequence/sequence.h"

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

inline constexpr char kCell[] = "lltm::cell";
inline constexpr char kCellForward[] = "lltm::cell_forward";
inline constexpr char kCellBackward[] = "lltm::cell_backward";
inline constexpr char kForward[] = "lltm::forward";
inline constexpr char kBackward[] = "lltm::backward";
inline constexpr char kSequence[] = "lltm::sequence";
inline constexpr char kSequenceForward[] = "lltm::sequence_forward";
inline constexpr char kSequenceBackward[] = "lltm::sequence_backward";

using Cell = Op<kCell, CellSignature>;
using CellForward = Op<kCellForward, CellForwardSignature>;
using CellBackward = Op<kCellBackward, CellBackwardSignature>;
using Forward = Op<kForward, ForwardSignature>;
using Backward = Op<kBackward, BackwardSignature>;
using Sequence = Op<kSequence, sequence::Signature>;
using SequenceForward = Op<kSequenceForward, sequence::ForwardSignature>;
using SequenceBackward = Op<kSequenceBackward, sequence::BackwardSignature>;

} // namespace lltm::ops
