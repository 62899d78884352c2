// The kernels' ABI header stands alone: it compiles first in a file, without any CUDA header.
#include <stagecraft/backend/cuda/abi.hpp>

#if defined(__CUDA_RUNTIME_H__) || defined(CUDART_VERSION) || defined(__CUDACC__)
#error "stagecraft/backend/cuda/abi.hpp must not need a CUDA header"
#endif

namespace {
[[maybe_unused]] constexpr stagecraft::cuda::abi::Geometry abi_geometry{};
static_assert(sizeof(stagecraft::cuda::abi::Status) == sizeof(int));
static_assert(static_cast<int>(stagecraft::cuda::abi::UnaryRule::count) == 19);
static_assert(static_cast<int>(stagecraft::cuda::abi::BinaryRule::count) == 18);
}  // namespace
