// stagecraft::precompiled: every op's eager dispatch and CPU kernels, the traced fusion's kernel
// tables, and the safetensors JSON reader and writer, compiled once. Files built against this
// target (STAGECRAFT_PRECOMPILED, set by the target) see the templates as `extern template` and
// the non-template functions as declarations, and skip compiling them: the umbrella header and a
// staged expression compile much faster (bench/compile_time.sh). The library stays
// header-only: this is an opt-in build-speed mode, with the same code and numbers.
// The non-template functions the headers only declare under STAGECRAFT_PRECOMPILED
// (STAGECRAFT_COMPILED_INLINE, config.hpp) are defined here, once.
#define STAGECRAFT_PRECOMPILED_SOURCE 1
#include <stagecraft/stagecraft.hpp>

#if !defined(STAGECRAFT_PRECOMPILED)
#error "src/precompiled.cpp is built by the stagecraft::precompiled target, which defines STAGECRAFT_PRECOMPILED"
#endif

namespace stagecraft {
namespace detail {
#define SC_INSTANTIATE_DISPATCH(S) \
  template Tensor dispatch<ops::S>(ops::Inputs, const ops::Attrs&, const std::source_location&);
STAGECRAFT_OP_LIST(SC_INSTANTIATE_DISPATCH)
#undef SC_INSTANTIATE_DISPATCH
}  // namespace detail

namespace graph::detail_ops {
#define SC_INSTANTIATE_CPU_OF(S) template void cpu_of<ops::S>(ops::Inputs, Tensor&, const ops::Attrs&);
STAGECRAFT_OP_LIST(SC_INSTANTIATE_CPU_OF)
#undef SC_INSTANTIATE_CPU_OF
}  // namespace graph::detail_ops

namespace graph::detail_fused {
template void place_results<bool>(PreparedFused&, const std::vector<char>&);
template void place_results<std::int32_t>(PreparedFused&, const std::vector<char>&);
template void place_results<std::int64_t>(PreparedFused&, const std::vector<char>&);
template void place_results<float>(PreparedFused&, const std::vector<char>&);
template void place_results<double>(PreparedFused&, const std::vector<char>&);
}  // namespace graph::detail_fused
}  // namespace stagecraft
