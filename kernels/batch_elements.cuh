// The work of an eager batch (kernels/batch.cu): one queued op's elements, for the GPU and for the
// host. batch.cu's kernel runs each op of a batch with a block's threads, one op after another;
// the CUDA emulator (kernels/emulator/runtime.cpp) and test_cuda_batch_elements call the same
// functions in plain loops, so the rules and dtypes a GPU batch applies are checked without a GPU.
// The ops and dtypes taken are the ones elementwise.cu takes for dispatch's inputs; anything else is
// refused (run_op gives false) and its caller launches it alone.
#pragma once
#include <cstdint>
#include <type_traits>

#include "stagecraft/backend/cuda/abi.hpp"
#include "stagecraft/ops/rules.hpp"

#if defined(__CUDACC__)
#define SC_BATCH_HD __host__ __device__
#else
#define SC_BATCH_HD inline
#endif

namespace stagecraft::cuda::kernels::batch {

using abi::BatchOp;
using abi::DT;

// Which dtypes a rule takes (the table elementwise.cu's kernels and the emulator's use too):
// floating rules f32/f64 only, arithmetic ones no bool, rules whose result is bool (comparisons,
// logical ops) every dtype. Their result type is asked of i32
// operands: on bool every rule's result is bool, and the host must not instantiate the
// arithmetic ones on bool (dividing by false traps on x86).
template <class R> constexpr bool floating_only = false;
template <> constexpr bool floating_only<rules::Exp> = true;
template <> constexpr bool floating_only<rules::Log> = true;
template <> constexpr bool floating_only<rules::Sqrt> = true;
template <> constexpr bool floating_only<rules::Tanh> = true;
template <> constexpr bool floating_only<rules::Sigmoid> = true;
template <> constexpr bool floating_only<rules::Sin> = true;
template <> constexpr bool floating_only<rules::Cos> = true;
template <> constexpr bool floating_only<rules::Div> = true;

template <class R>
constexpr bool unary_gives_bool = std::is_same_v<decltype(R::f(std::int32_t{})), bool>;
template <class R>
constexpr bool binary_gives_bool = std::is_same_v<decltype(R::f(std::int32_t{}, std::int32_t{})), bool>;

template <class R, class T>
constexpr bool takes() {
  if constexpr (floating_only<R>) return std::is_floating_point_v<T>;
  else return !std::is_same_v<T, bool>;
}

// The statement (...) once with T the C++ type of dt; false for an unknown dt.
#define SC_BATCH_DT_SWITCH(dt, T, ...) \
  switch (dt) {                         \
    case DT::b8: {                      \
      using T = bool;                   \
      __VA_ARGS__;                      \
    }                                   \
    case DT::i32: {                     \
      using T = std::int32_t;           \
      __VA_ARGS__;                      \
    }                                   \
    case DT::i64: {                     \
      using T = std::int64_t;           \
      __VA_ARGS__;                      \
    }                                   \
    case DT::f32: {                     \
      using T = float;                  \
      __VA_ARGS__;                      \
    }                                   \
    case DT::f64: {                     \
      using T = double;                 \
      __VA_ARGS__;                      \
    }                                   \
  }                                     \
  return false

template <class R, class T, class Out, class I>
SC_BATCH_HD void unary_elements(const BatchOp& op, I first, I step) {
  const T* x = static_cast<const T*>(op.a);
  Out* y = static_cast<Out*>(op.y);
  for (I i = first; i < op.n; i += step) y[i] = static_cast<Out>(R::f(x[i]));
}

template <class R, class T, class Out, class I>
SC_BATCH_HD void binary_elements(const BatchOp& op, I first, I step) {
  const T* a = static_cast<const T*>(op.a);
  const T* b = static_cast<const T*>(op.b);
  Out* y = static_cast<Out*>(op.y);
  for (I i = first; i < op.n; i += step) y[i] = static_cast<Out>(R::f(a[op.a_one ? 0 : i], b[op.b_one ? 0 : i]));
}

/// Runs op (when `run`) as unary rule R on T; false when R takes no T.
template <class R, class T, class I>
SC_BATCH_HD bool unary_as(const BatchOp& op, I first, I step, bool run) {
  if constexpr (unary_gives_bool<R>) {
    if (run) unary_elements<R, T, bool>(op, first, step);
    return true;
  } else if constexpr (takes<R, T>()) {
    if (run) unary_elements<R, T, T>(op, first, step);
    return true;
  } else {
    return false;
  }
}

template <class R, class T, class I>
SC_BATCH_HD bool binary_as(const BatchOp& op, I first, I step, bool run) {
  if constexpr (binary_gives_bool<R>) {
    if (run) binary_elements<R, T, bool>(op, first, step);
    return true;
  } else if constexpr (takes<R, T>()) {
    if (run) binary_elements<R, T, T>(op, first, step);
    return true;
  } else {
    return false;
  }
}

template <class R, class I>
SC_BATCH_HD bool unary_rule(const BatchOp& op, I first, I step, bool run) {
  SC_BATCH_DT_SWITCH(op.dt, T, return unary_as<R, T>(op, first, step, run));
}

template <class R, class I>
SC_BATCH_HD bool binary_rule(const BatchOp& op, I first, I step, bool run) {
  SC_BATCH_DT_SWITCH(op.dt, T, return binary_as<R, T>(op, first, step, run));
}

/// y = x converted, as elementwise.cu's cast kernel (rules::Cast).
template <class S, class T, class I>
SC_BATCH_HD bool cast_as(const BatchOp& op, I first, I step, bool run) {
  if (run) {
    const S* x = static_cast<const S*>(op.a);
    T* y = static_cast<T*>(op.y);
    for (I i = first; i < op.n; i += step) y[i] = static_cast<T>(rules::Cast<T>::f(x[i]));
  }
  return true;
}

template <class S, class I>
SC_BATCH_HD bool cast_from(const BatchOp& op, I first, I step, bool run) {
  SC_BATCH_DT_SWITCH(op.out_dt, T, return cast_as<S, T>(op, first, step, run));
}

/// Every element = value converted to T on the host's terms (elementwise.cu's fill converts it
/// before the launch: static_cast as here).
template <class T, class I>
SC_BATCH_HD bool fill_as(const BatchOp& op, I first, I step, bool run) {
  if (run) {
    const T v = static_cast<T>(op.value);
    T* y = static_cast<T*>(op.y);
    for (I i = first; i < op.n; i += step) y[i] = v;
  }
  return true;
}

/// Op's elements first, first + step, ... (a thread's share: its index and the block's width on
/// the GPU, 0 and 1 on the host), when `run`; without `run` only whether op is one the batch
/// kernel takes (its rule, dtypes and size).
template <class I>
SC_BATCH_HD bool run_op(const BatchOp& op, I first, I step, bool run) {
  if (op.n <= 0 || op.n > abi::batch_max_elements) return false;
  switch (op.kind) {
    case BatchOp::unary:
      switch (static_cast<abi::UnaryRule>(op.rule)) {
#define SC_CASE(R) \
  case abi::UnaryRule::R: return unary_rule<rules::R>(op, first, step, run);
        SC_CUDA_UNARY_RULES(SC_CASE)
#undef SC_CASE
        default: return false;
      }
    case BatchOp::binary:
      switch (static_cast<abi::BinaryRule>(op.rule)) {
#define SC_CASE(R) \
  case abi::BinaryRule::R: return binary_rule<rules::R>(op, first, step, run);
        SC_CUDA_BINARY_RULES(SC_CASE)
#undef SC_CASE
        default: return false;
      }
    case BatchOp::cast: {
      SC_BATCH_DT_SWITCH(op.dt, S, return cast_from<S>(op, first, step, run));
    }
    case BatchOp::fill: {
      SC_BATCH_DT_SWITCH(op.dt, T, return fill_as<T>(op, first, step, run));
    }
  }
  return false;
}

/// True when the batch kernel takes op.
inline bool takes_op(const BatchOp& op) { return run_op<int>(op, 0, 1, false); }

#undef SC_BATCH_DT_SWITCH

}  // namespace stagecraft::cuda::kernels::batch
