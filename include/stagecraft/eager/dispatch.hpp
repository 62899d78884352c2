// The single entry point every op call goes through: checks, promotion, device choice,
// shape inference, then (today) the eager kernel. Tracing and tape recording plug in here.
#pragma once
#include <array>
#include <atomic>
#include <concepts>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <source_location>
#include <tuple>
#include <utility>
#include <vector>

#include "../core/device.hpp"
#include "../core/tensor.hpp"
#include "../ops/op.hpp"
#include "../autodiff/record.hpp"
#include "context.hpp"

namespace stagecraft {
namespace ops { struct Cast; }

namespace detail {

template <class Op>
concept ViewOp = requires(const Tensor& t, const ops::OutMeta& m) { Op::alias(t, m); };
template <class Op>
concept Promoting = requires { Op::promote_from; };
template <class Op>
concept FloatInputs = requires { requires Op::float_inputs; };
/// An op with a CUDA kernel: `static void cuda(Inputs, Tensor& out, const Attrs&, const std::source_location&)`.
template <class Op>
concept CudaOp = requires(ops::Inputs in, Tensor& out, const ops::Attrs& a, const std::source_location& loc) {
  Op::cuda(in, out, a, loc);
};

template <class Op>
Tensor dispatch(ops::Inputs in, const ops::Attrs& attrs, const std::source_location& loc);

#if defined(STAGECRAFT_PRECOMPILED)
}  // namespace detail
namespace ops {
#define SC_DECLARE_OP(S) struct S;
STAGECRAFT_OP_LIST(SC_DECLARE_OP)
#undef SC_DECLARE_OP
}  // namespace ops
namespace detail {
// Linked with stagecraft::precompiled (src/precompiled.cpp): every op's dispatch, kernels included,
// is compiled there once, so a user's file does not instantiate them (see README, compile time).
#define SC_EXTERN_DISPATCH(S) \
  extern template Tensor dispatch<ops::S>(ops::Inputs, const ops::Attrs&, const std::source_location&);
STAGECRAFT_OP_LIST(SC_EXTERN_DISPATCH)
#undef SC_EXTERN_DISPATCH
#endif

/// Converts t to dtype d through the Cast op (so a trace records the conversion).
Tensor cast_to(const Tensor& t, DType d, const std::source_location& loc);

/// The process-wide counters of device_stats().
struct ImplicitCopyCounters {
  std::atomic<std::int64_t> copies{0}, bytes{0};
  std::atomic<bool> strict{false};
};
inline ImplicitCopyCounters& implicit_copy_counters() {
  static ImplicitCopyCounters c;
  return c;
}

/// An input about to be copied to `to` (`why`: because a DeviceScope sent the op there, by
/// default): counted, or a DeviceError in strict mode (set_strict_device_placement).
inline void count_implicit_copy(const Tensor& t, Device to, std::string_view op, const std::source_location& loc,
                                std::string_view why = "a DeviceScope sent the op there") {
  ImplicitCopyCounters& c = implicit_copy_counters();
  if (SC_UNLIKELY(c.strict.load(std::memory_order_relaxed)))
    fail<DeviceError>(op, loc, "would copy an input of shape ", t.shape(), " from ", t.device().str(), " to ",
                      to.str(), " (", why, ") and strict device placement is on; move it with .to() first");
  c.copies.fetch_add(1, std::memory_order_relaxed);
  c.bytes.fetch_add(static_cast<std::int64_t>(t.nbytes()), std::memory_order_relaxed);
}

/// A rank-0 CPU tensor: it joins another device's op as a C++ number would (PyTorch's rule for
/// CPU scalars), copied there uncounted.
inline bool host_scalar(const Tensor& t) { return t.device().is_cpu() && t.rank() == 0; }

/// Inputs on several devices: the one device besides rank-0 CPU tensors, else a DeviceError.
SC_COLD inline Device mixed_device(ops::Inputs in, std::string_view op, const std::source_location& loc) {
  const Tensor* first = nullptr;
  for (const Tensor& t : in) {
    if (host_scalar(t)) continue;
    if (first == nullptr) first = &t;
    else if (t.device() != first->device())
      fail<DeviceError>(op, loc, "inputs are on different devices (", first->device().str(), " and ",
                        t.device().str(), "); move one with .to() or use a sc::DeviceScope");
  }
  return first != nullptr ? first->device() : Device::cpu();
}

/// The device an op runs on: the DeviceScope's, else its inputs' (which must agree, rank-0 CPU
/// tensors aside).
inline Device choose_device(ops::Inputs in, std::string_view op, const std::source_location& loc) {
  if (const Device* d = scoped_device()) return *d;
  if (in.empty()) return Device::cpu();
  const Device dev = in[0].device();
  for (const Tensor& t : in)
    if (SC_UNLIKELY(t.device() != dev)) return mixed_device(in, op, loc);
  return dev;
}

/// The dtype inputs [from, n) are converted to before the kernel runs, or nullopt-like
/// `same` when they already agree.
template <class Op>
bool wanted_dtype(ops::Inputs in, DType& want) {
  bool differ = false;
  if constexpr (Promoting<Op>) {
    if (static_cast<int>(in.size()) > Op::promote_from) {
      want = in[Op::promote_from].dtype();
      for (std::size_t i = Op::promote_from; i < in.size(); ++i) {
        differ |= in[i].dtype() != want;
        want = promote(want, in[i].dtype());
      }
    }
  }
  if constexpr (FloatInputs<Op>) {
    if (!in.empty() && !is_floating(want)) {
      want = DType::f32;
      differ = true;
    }
  }
  return differ;
}

/// Runs the op's kernel now on concrete inputs.
template <class Op>
Tensor run_eager(ops::Inputs in, const ops::Attrs& attrs, const ops::OutMeta& meta, Device dev,
                 const std::source_location& loc) {
  if constexpr (ViewOp<Op>) {
    return Op::alias(in[0], meta);
  } else {
    if (SC_UNLIKELY(!dev.is_cpu())) {
#if defined(STAGECRAFT_WITH_CUDA)
      if constexpr (CudaOp<Op>) {
        const cuda::detail::ScopedCallSite site(Op::name, loc);  // names the op in an out-of-memory error
        Tensor out = empty_tensor(meta.shape, meta.dtype, dev, Op::name, loc);
        Op::cuda(in, out, attrs, loc);
        return out;
      }
#endif
      fail<DeviceError>(Op::name, loc, "has no kernel for ", dev.str(), " in this build");
    }
    Tensor out = empty_tensor(meta.shape, meta.dtype, dev, Op::name, loc);
    try {
      Op::cpu(in, out, attrs);
    } catch (const Error& e) {  // a kernel's check (an index out of range): the user's line added
      rethrow_at_line(e, loc);
    }
    return out;
  }
}

/// True when an input is a value of a graph being traced (one load per input).
inline bool any_symbolic(ops::Inputs in) {
  for (const Tensor& t : in)
    if (t.impl()->symbolic.trace != 0) return true;
  return false;
}

/// The tracing path: the op becomes a node of the innermost trace (its inputs lifted into that
/// graph), and a recording tape sees the symbolic call, so backward passes are staged too.
template <class Op>
SC_NOINLINE Tensor trace_op(ops::Inputs in, const ops::Attrs& attrs, const ops::OutMeta& meta, Device dev,
                            const std::source_location& loc) {
  Context& ctx = context();
  if (ctx.trace == nullptr)
    fail<StagingError>(Op::name, loc, "got a symbolic tensor outside the trace that made it (it escaped an "
                                      "sc::function or sc::cond body); return it from the function instead");
  for (const Tensor& t : in)
    if (t.is_symbolic() && !ctx.trace->owns(t.impl()->symbolic))
      fail<StagingError>(Op::name, loc, "got a symbolic tensor from a trace that has finished (it escaped "
                                        "its sc::function); return it from the function instead of storing it");
  std::vector<Tensor> lifted;
  ctx.trace->lift(in, lifted, loc);
  Tensor out = ctx.trace->append(Op::id, lifted, attrs, meta, dev, loc);
  if (ctx.tapes != nullptr) record_on_tapes<Op>(lifted, attrs, out, loc);
  return out;
}

/// An op that moves its input to the device its attributes name (ops::ToDevice).
template <class Op>
concept MovesDevice = requires(const ops::Attrs& a) {
  { Op::target(a) } -> std::same_as<Device>;
};

/// dispatch for MovesDevice ops: the device is the op's target, the input stays where it is. A
/// concrete input is copied now, also while tracing (the copy is then a constant of the graph,
/// as the input was); a symbolic one becomes a node.
template <class Op>
SC_NOINLINE Tensor dispatch_move(ops::Inputs in, const ops::Attrs& attrs, const std::source_location& loc) {
  const ops::OutMeta meta = Op::infer(in, attrs, loc);  // (checks that attrs name a device)
  const Device dev = Op::target(attrs);
  for (const Device d : {in[0].device(), dev})
    if (d.is_cuda()) cuda::detail::require_device(d, Op::name, loc);
  if (SC_UNLIKELY(any_symbolic(in))) return trace_op<Op>(in, attrs, meta, dev, loc);
  Tensor out = run_eager<Op>(in, attrs, meta, dev, loc);
  if (SC_UNLIKELY(context().tapes != nullptr)) record_on_tapes<Op>(in, attrs, out, loc);
  return out;
}

/// The inputs, those from position `from` on converted to `want` (dispatch's promotion, out of
/// line: one function for every op).
SC_NOINLINE inline std::vector<Tensor> converted(ops::Inputs in, std::size_t from, DType want,
                                                 const std::source_location& loc) {
  std::vector<Tensor> conv(in.begin(), in.end());
  for (std::size_t i = from; i < conv.size(); ++i)
    if (conv[i].dtype() != want) conv[i] = cast_to(conv[i], want, loc);
  return conv;
}

/// The inputs, each on `dev` (a DeviceScope moved the op, or a CPU scalar joins it); a copy the
/// user did not ask for is counted.
SC_NOINLINE inline std::vector<Tensor> moved_to(ops::Inputs in, Device dev, std::string_view op,
                                                const std::source_location& loc) {
  std::vector<Tensor> moved(in.begin(), in.end());
  for (Tensor& m : moved)
    if (m.device() != dev) {
      if (!host_scalar(m) || scoped_device() != nullptr) count_implicit_copy(m, dev, op, loc);
      m = m.to(dev, loc);
    }
  return moved;
}

template <class Op>
Tensor dispatch(ops::Inputs in, const ops::Attrs& attrs, const std::source_location& loc) {
  for (const Tensor& t : in) require_defined(t, Op::name, loc);
  if constexpr (MovesDevice<Op>) return dispatch_move<Op>(in, attrs, loc);
  const Device dev = choose_device(in, Op::name, loc);
  if (SC_UNLIKELY(dev.is_cuda())) cuda::detail::require_device(dev, Op::name, loc);
  if constexpr (Promoting<Op> || FloatInputs<Op>) {
    DType want = in.empty() ? DType::f32 : in[0].dtype();
    if (SC_UNLIKELY(wanted_dtype<Op>(in, want))) {
      constexpr int from = [] { if constexpr (Promoting<Op>) return Op::promote_from; else return 0; }();
      return dispatch<Op>(converted(in, from, want, loc), attrs, loc);
    }
  }
  for (const Tensor& t : in)
    if (SC_UNLIKELY(t.device() != dev))  // a DeviceScope moved the op, or a CPU scalar joins it
      return dispatch<Op>(moved_to(in, dev, Op::name, loc), attrs, loc);
  const ops::OutMeta meta = Op::infer(in, attrs, loc);
  Context& ctx = context();
  if (SC_UNLIKELY(ctx.trace != nullptr || any_symbolic(in))) return trace_op<Op>(in, attrs, meta, dev, loc);
  Tensor out = run_eager<Op>(in, attrs, meta, dev, loc);
  // Tape recording: one thread-local check when no tape records.
  if (SC_UNLIKELY(ctx.tapes != nullptr)) record_on_tapes<Op>(in, attrs, out, loc);
  return out;
}

/// N handles side by side (what ops::Inputs spans) that share the caller's references
/// instead of taking their own: copying handles into an array cost two atomic increments
/// and two decrements per binary op. The caller's handles outlive the call, and these are
/// never destroyed or assigned to; a copy made from one takes a real reference as usual.
template <std::size_t N>
class BorrowedInputs {
 public:
  explicit BorrowedInputs(const std::array<const Tensor*, N>& src) noexcept {
    for (std::size_t i = 0; i < N; ++i)
      ::new (static_cast<void*>(bytes_ + i * sizeof(Tensor))) Tensor(Ref<TensorImpl>::adopt(src[i]->impl()));
  }
  BorrowedInputs(const BorrowedInputs&) = delete;
  BorrowedInputs& operator=(const BorrowedInputs&) = delete;
  ops::Inputs span() const noexcept { return {std::launder(reinterpret_cast<const Tensor*>(bytes_)), N}; }

 private:
  alignas(Tensor) unsigned char bytes_[N * sizeof(Tensor)];
};

/// Two-input convenience: the handles are borrowed, not copied (see BorrowedInputs).
template <class Op>
Tensor dispatch2(const Tensor& a, const Tensor& b, const ops::Attrs& attrs, const std::source_location& loc) {
  const BorrowedInputs<2> in({&a, &b});
  return dispatch<Op>(in.span(), attrs, loc);
}

/// The DTypeError of a C++ integer that does not fit d, the dtype in which the op of a `like`
/// tensor reads it (eager's weak scalars, and the staged stages' integer constants).
template <class V>
[[noreturn]] SC_COLD void integer_misfit(std::string_view op, const std::source_location& loc, V value, DType d,
                                         DType like) {
  if (d == DType::i32)
    fail<DTypeError>(op, loc, "the integer ", value, " does not fit the tensor's dtype ", d,
                     "; convert the tensor first (.astype(sc::i64))");
  fail<DTypeError>(op, loc, "the integer ", value, " does not fit ", d, " (the ", name(like),
                   " tensor's operations take it as ", d, ", the widest integer dtype); pass a floating-point ",
                   "scalar or convert the tensor to a float dtype");
}

/// t (a rank-0 CPU tensor holding a C++ number) on device d: copied there the first time, then
/// the same device tensor each time (tensors are immutable; a few hundred kept per process, the
/// oldest set dropped when full), so that an eager GPU op with a number (x * 0.5f, an optimizer's
/// constants) makes no copy from the host and no allocation.
inline Tensor device_scalar(const Tensor& t, Device d, const std::source_location& loc) {
  struct Cache {
    std::mutex mu;
    std::map<std::tuple<int, int, std::uint64_t>, Tensor> kept;
  };
  static Cache& cache = *new Cache;  // (never destroyed: its tensors may outlive the device's allocator at exit)
  std::uint64_t bits = 0;
  std::memcpy(&bits, t.raw_data(), itemsize(t.dtype()));
  const auto key = std::make_tuple(d.index(), static_cast<int>(t.dtype()), bits);
  {
    const std::lock_guard<std::mutex> lock(cache.mu);
    if (const auto it = cache.kept.find(key); it != cache.kept.end()) return it->second;
  }
  Tensor on = t.to(d, loc);
  if (SC_UNLIKELY(on.is_symbolic())) return on;  // (a concrete copy even while tracing: never expected)
  const std::lock_guard<std::mutex> lock(cache.mu);
  if (cache.kept.size() >= 512) cache.kept.clear();  // (changing numbers, as a decaying rate: bounded)
  cache.kept.emplace(key, on);
  return on;
}

/// A rank-0 tensor holding a C++ scalar with the dtype the weak-scalar rule gives it next to
/// `like` (see core/dtype.hpp); on like's device (device_scalar).
template <Scalar S>
Tensor weak_scalar(S value, const Tensor& like, const std::source_location& loc, std::string_view op = "scalar") {
  require_defined(like, op, loc);
  const DType d = promote_scalar(like.dtype(), scalar_kind<S>());
  Tensor t = empty_tensor(Shape{}, d, Device::cpu());
  visit_dtype(d, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_integral_v<S> && std::is_integral_v<T> && !std::is_same_v<T, bool>) {
      const T v = static_cast<T>(value);
      if (SC_UNLIKELY(static_cast<S>(v) != value || (v < T(0)) != (value < S(0))))  // it would wrap silently
        integer_misfit(op, loc, value, d, like.dtype());
    }
    *static_cast<T*>(t.raw_data()) = static_cast<T>(value);
  });
  return like.device().is_cpu() ? t : device_scalar(t, like.device(), loc);
}

}  // namespace detail

/// Copies between devices that no one asked for: an op's input on another device than the one a
/// DeviceScope sends the op to is copied there, and counted here (process-wide, all threads).
struct DeviceStats {
  std::int64_t implicit_copies = 0;      ///< inputs copied to another device by an op
  std::int64_t implicit_copy_bytes = 0;  ///< their bytes
};
inline DeviceStats device_stats() {
  const detail::ImplicitCopyCounters& c = detail::implicit_copy_counters();
  return {c.copies.load(std::memory_order_relaxed), c.bytes.load(std::memory_order_relaxed)};
}
inline void reset_device_stats() {
  detail::implicit_copy_counters().copies.store(0);
  detail::implicit_copy_counters().bytes.store(0);
}
/// Strict device placement: an implicit copy (above) is a DeviceError naming the op, the input's
/// shape and both devices, instead of a silent transfer. Off by default; process-wide.
inline void set_strict_device_placement(bool on) { detail::implicit_copy_counters().strict.store(on); }
inline bool strict_device_placement() { return detail::implicit_copy_counters().strict.load(); }

}  // namespace stagecraft

// Tensor::to and the op it dispatches (it needs dispatch above; every op header includes this one).
#include "../ops/to_device.hpp"
