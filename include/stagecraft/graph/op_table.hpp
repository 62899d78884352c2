// Every op's functions by OpId, built from the op list: how graphs re-infer, run, view and
// re-dispatch a node without naming any op (transformations stay generic).
#pragma once
#include <array>
#include <source_location>
#include <string>

#include "../autodiff/tape.hpp"
#include "../eager/dispatch.hpp"
#include "../ops/registry.hpp"

namespace stagecraft::graph {

/// What a graph needs of an op, as plain function pointers.
struct OpFns {
  ops::OutMeta (*infer)(ops::Inputs, const ops::Attrs&, const std::source_location&);
  void (*cpu)(ops::Inputs, Tensor&, const ops::Attrs&);  ///< null for views
  /// The CUDA kernel (asynchronous, on the output's device); null for views, for ops without
  /// one and in builds without CUDA.
  void (*cuda)(ops::Inputs, Tensor&, const ops::Attrs&, const std::source_location&);
  Tensor (*alias)(const Tensor&, const ops::OutMeta&);   ///< views: no kernel, shares storage
  Tensor (*call)(ops::Inputs, const ops::Attrs&, const std::source_location&);  ///< full dispatch
  bool elementwise_unary;   ///< the Unary family: one input, output of its shape
  bool elementwise_binary;  ///< the Binary family: two broadcasting inputs
};

namespace detail_ops {
template <class Op>
void cpu_of(ops::Inputs in, Tensor& out, const ops::Attrs& a) {
  if constexpr (stagecraft::detail::ViewOp<Op>)  // never called: a view's entry has no cpu
    throw ValueError(std::string("[") + std::string(Op::name) + "] is a view and has no kernel");
  else Op::cpu(in, out, a);
}
#if defined(STAGECRAFT_PRECOMPILED)  // compiled in stagecraft::precompiled, as dispatch<Op> is
#define SC_EXTERN_CPU_OF(S) extern template void cpu_of<ops::S>(ops::Inputs, Tensor&, const ops::Attrs&);
STAGECRAFT_OP_LIST(SC_EXTERN_CPU_OF)
#undef SC_EXTERN_CPU_OF
#endif
template <class Op>
void cuda_of(ops::Inputs in, Tensor& out, const ops::Attrs& a, const std::source_location& loc) {
#if defined(STAGECRAFT_WITH_CUDA)
  if constexpr (stagecraft::detail::CudaOp<Op>) {
    const cuda::detail::ScopedCallSite site(Op::name, loc);  // names the op in an out-of-memory error
    Op::cuda(in, out, a, loc);
    return;
  }
#endif
  (void)in, (void)out, (void)a;
  stagecraft::detail::fail<DeviceError>(Op::name, loc, "has no kernel for ", out.device().str(), " in this build");
}
template <class Op>
Tensor alias_of(const Tensor& t, const ops::OutMeta& m) {
  return Op::alias(t, m);
}
template <class Op>
Tensor call_of(ops::Inputs in, const ops::Attrs& a, const std::source_location& loc) {
  return stagecraft::detail::dispatch<Op>(in, a, loc);
}
template <class Op>
constexpr OpFns fns_of() {
  OpFns f{&Op::infer, nullptr, nullptr, nullptr, &call_of<Op>, false, false};
  if constexpr (stagecraft::detail::ViewOp<Op>) {
    f.alias = &alias_of<Op>;
  } else {
    f.cpu = &cpu_of<Op>;
#if defined(STAGECRAFT_WITH_CUDA)
    if constexpr (stagecraft::detail::CudaOp<Op>) f.cuda = &cuda_of<Op>;
#endif
  }
  f.elementwise_unary = ops::unary_family(ops::op_elementwise_kind<Op>());
  f.elementwise_binary = ops::binary_family(ops::op_elementwise_kind<Op>());
  return f;
}
}  // namespace detail_ops

/// op_fns[id]: the functions of OpId id.
inline constexpr std::array<OpFns, ops::num_ops> op_fns = {{
#define STAGECRAFT_OP_FNS(S) detail_ops::fns_of<ops::S>(),
    STAGECRAFT_OP_LIST(STAGECRAFT_OP_FNS)
#undef STAGECRAFT_OP_FNS
}};

inline const OpFns& fns(ops::OpId id) { return op_fns[static_cast<std::size_t>(id)]; }

/// Calls op `id` through dispatch (eagerly, or appending to the current trace), with the nodes
/// it makes carrying `loc`.
STAGECRAFT_COMPILED_INLINE Tensor call_op(ops::OpId id, ops::Inputs in, const ops::Attrs& attrs, const SrcLoc& loc);
#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE Tensor call_op(ops::OpId id, ops::Inputs in, const ops::Attrs& attrs, const SrcLoc& loc) {
  const stagecraft::detail::LocOverride at(loc);
  return fns(id).call(in, attrs, std::source_location::current());
}
#endif  // STAGECRAFT_DEFINE_COMPILED

}  // namespace graph
