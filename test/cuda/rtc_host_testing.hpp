// Generated CUDA kernels built by the host compiler and run here (no GPU): with __global__ and
// the thread indices defined for the host, a kernel's text is plain C++ around the rules. Shared
// by the rtc tests (one program's kernel) and the batch tests (programs launched together).
// Also check_compiles, the NVRTC check of a generated source, where the build has CUDA.
#pragma once
#if defined(STAGECRAFT_WITH_CUDA)
#include <string>

#include <stagecraft/graph/cuda_fused.hpp>

namespace sctest::rtc {
/// src compiles under NVRTC for sm_90 into a kernel of some size (NVRTC's log on failure).
inline void check_compiles(const std::string& src) {
  char log[8192] = {};
  std::size_t bytes = 0;
  const sc::cuda::abi::Status s = sc::cuda::abi::rtc_check(src.c_str(), 90, &bytes, log, sizeof log);
  INFO(log);
  INFO(src);
  REQUIRE(s == 0);
  CHECK(bytes > 1000);
}
}  // namespace sctest::rtc
#endif

#if defined(SC_TEST_CXX) && defined(SC_TEST_INCLUDE)
#include <dlfcn.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <stagecraft/graph/cuda_fused.hpp>
#include <stagecraft/graph/cuda_fused_batch.hpp>

namespace sctest::rtc {

/// The generated source of p, built as a shared library by the host compiler; its sc_run runs the
/// kernel over every element (three blocks of 256 threads, each striding). `lanes`: threads per
/// element (cuda_source's; cuda_product_lanes(p) when left out).
class HostBuilt {
 public:
  explicit HostBuilt(const sc::graph::FusedProgram& p, int lanes = 0) {
    const std::string T = sc::graph::detail_cuda_fused::c_type(p.dtype);
    if (lanes == 0) lanes = sc::graph::cuda_product_lanes(p);
    std::string src = prelude() + sc::graph::cuda_source(p, lanes) + blocks();
    std::string args;
    for (std::size_t k = 0; k < p.input_shapes.size(); ++k)  // (an input converted from another dtype has its own type)
      args += "(const " + std::string(sc::graph::detail_cuda_fused::arg_c_type(p, k)) + "*)in[" + std::to_string(k) + "], ";
    const std::size_t nout = p.num_out_args() + (p.reduction ? 1 : 0);
    for (std::size_t j = 0; j < nout; ++j) args += "(" + T + "*)out[" + std::to_string(j) + "], ";
    args += "n";
    const std::string head = "(const void* const* in, void* const* out, long long n) {\n"
                             "  for (blockIdx.x = 0; blockIdx.x < gridDim.x; ++blockIdx.x) {\n";
    if (p.reduction && lanes > 1) {
      // The elements by lanes (the reduced register into part), then part's rows reduced.
      const std::string red = "(" + T + "*)out[" + std::to_string(nout - 1) + "]";
      std::string args1 = args;
      args1.replace(args1.rfind(red), red.size(), "part.data()");
      src += "extern \"C\" void sc_run(const void* const* in, void* const* out, long long n) {\n"
             "  std::vector<" + T + "> part(n);\n"
             "  sc_blocks([=, &part] { sc_fused(" + args1 + "); });\n"
             "  sc_blocks([=, &part] { sc_fused_r2(part.data(), " + red + ", n); });\n"
             "}\n";
    } else if (p.reduction) {
      // A cut reduction's two kernels in turn, as CudaFused::run launches them.
      const auto split = sc::graph::cuda_reduction_split(p);
      const std::string red = "(" + T + "*)out[" + std::to_string(nout - 1) + "]";
      src += "extern \"C\" void sc_run(const void* const* in, void* const* out, long long n) {\n";
      if (split.chunks == 1) {
        src += "  sc_blocks([=] { sc_fused_r(" + args + "); });\n";
      } else {
        const std::string pieces = std::to_string(p.out_shape.numel() / p.reduction->inner * split.chunks);
        std::string args1 = args;
        args1.replace(args1.rfind(red), red.size(), "part.data()");
        src += "  std::vector<" + T + "> part(" + pieces + ");\n"
               "  sc_blocks([=, &part] { sc_fused_r(" + args1 + "); });\n"
               "  sc_blocks([=, &part] { sc_fused_r2(part.data(), " + red + ", " + pieces + "); });\n";
      }
      src += "}\n";
    } else if (lanes > 1) {  // (its lanes meet at shuffles: real threads)
      src += "extern \"C\" void sc_run(const void* const* in, void* const* out, long long n) {\n"
             "  sc_blocks([=] { sc_fused(" + args + "); });\n"
             "}\n";
    } else {
      const std::string loop = "    for (threadIdx.x = 0; threadIdx.x < blockDim.x; ++threadIdx.x)\n      ";
      src += "extern \"C\" void sc_run" + head + loop + "sc_fused(" + args + ");\n  }\n}\n";
      if (sc::graph::cuda_vectorizable(p))
        src += "extern \"C\" void sc_run_v" + head + loop + "sc_fused_v(" + args + ");\n  }\n}\n";
    }
    build(src);
  }
  /// The batch kernel of programs launched together (cuda_batch_source); sc_run passes every
  /// program's inputs, then every program's outputs, in turn.
  explicit HostBuilt(const std::vector<sc::graph::FusedProgram>& ps) {
    namespace cf = sc::graph::detail_cuda_fused;
    std::string args;
    std::size_t i = 0, o = 0;
    for (const sc::graph::FusedProgram& p : ps) {
      const std::string T = cf::c_type(p.dtype);
      for (std::size_t k = 0; k < p.input_shapes.size(); ++k)
        args += "(const " + std::string(cf::arg_c_type(p, k)) + "*)in[" + std::to_string(i++) + "], ";
      for (std::size_t t = 0; t < p.num_out_args(); ++t) args += "(" + T + "*)out[" + std::to_string(o++) + "], ";
    }
    build(prelude() + sc::graph::cuda_batch_source(ps) +
          "extern \"C\" void sc_run(const void* const* in, void* const* out, long long n) {\n"
          "  for (blockIdx.x = 0; blockIdx.x < gridDim.x; ++blockIdx.x)\n"
          "    for (threadIdx.x = 0; threadIdx.x < blockDim.x; ++threadIdx.x)\n"
          "      sc_fused_batch(" + args + "n);\n"
          "}\n");
  }
  ~HostBuilt() {
    if (lib_ != nullptr) ::dlclose(lib_);
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  HostBuilt(const HostBuilt&) = delete;
  HostBuilt& operator=(const HostBuilt&) = delete;
  const std::string& error() const { return error_; }
  bool has_vector_kernel() const { return run_v_ != nullptr; }
  /// Runs sc_fused, or sc_fused_v (16-byte accesses) when `vector`.
  void run(const std::vector<sc::Tensor>& in, std::vector<sc::Tensor>& out, std::int64_t n, bool vector = false) const {
    std::vector<const void*> pi;
    std::vector<void*> po;
    for (const sc::Tensor& t : in) pi.push_back(t.raw_data());
    for (sc::Tensor& t : out) po.push_back(t.raw_data());
    (vector ? run_v_ : run_)(pi.data(), po.data(), n);
  }

 private:
  /// The blocks of a kernel whose threads meet (a reduction's barriers, lanes' shuffles), one
  /// after the other, each 256 real threads; a thread that returns leaves the barrier (the rest go
  /// on meeting without it, as a GPU's warps that have finished).
  static std::string blocks() {
    return "template <class F> static void sc_blocks(F f) {\n"
           "  for (blockIdx.x = 0; blockIdx.x < gridDim.x; ++blockIdx.x) {\n"
           "    std::barrier<> block(blockDim.x);\n"
           "    sc_block = &block;\n"
           "    std::vector<std::thread> threads;\n"
           "    for (unsigned t = 0; t < blockDim.x; ++t)\n"
           "      threads.emplace_back([=] { threadIdx.x = t; f(); sc_block->arrive_and_drop(); });\n"
           "    for (std::thread& t : threads) t.join();\n"
           "  }\n"
           "}\n";
  }
  /// CUDA's names for the host: three blocks of 256 threads, one block after the other. A
  /// reduction's threads are real threads meeting at a barrier (__syncthreads), its shared array
  /// a static; a warp shuffle posts the value in a static array between two barriers; elementwise
  /// kernels without products need no barrier, so one loop plays their threads.
  static std::string prelude() {
    return
        "#include <barrier>\n"
        "#include <thread>\n"
        "#include <vector>\n"
        "#define __global__\n"
        "#define __device__\n"
        "#define __forceinline__ inline\n"
        "#define __shared__ static\n"
        "struct sc_dim3 { unsigned x; };\n"
        "static sc_dim3 blockIdx{0}, blockDim{256}, gridDim{3};\n"
        "static thread_local sc_dim3 threadIdx{0};\n"
        "static std::barrier<>* sc_block = nullptr;\n"
        "static void __syncthreads() { sc_block->arrive_and_wait(); }\n"
        "template <class V> static V __shfl_xor_sync(unsigned, V v, int m) {\n"
        "  static V posted[256];\n"
        "  posted[threadIdx.x] = v;\n"
        "  sc_block->arrive_and_wait();\n"
        "  const V r = posted[threadIdx.x ^ static_cast<unsigned>(m)];\n"
        "  sc_block->arrive_and_wait();\n"
        "  return r;\n"
        "}\n"
        "struct alignas(16) float4 { float x, y, z, w; };\n"
        "struct alignas(16) int4 { int x, y, z, w; };\n"
        "struct alignas(16) double2 { double x, y; };\n"
        "struct alignas(16) longlong2 { long long x, y; };\n";
  }
  /// Builds src as a shared library in a directory of its own and loads its sc_run (and sc_run_v).
  void build(const std::string& src) {
    dir_ = std::filesystem::temp_directory_path() / ("sc_rtc_host_" + std::to_string(::getpid()) + "_" + std::to_string(counter()++));
    std::filesystem::create_directories(dir_);
    std::ofstream(dir_ / "k.cpp") << src;
    const std::string cmd = std::string(SC_TEST_CXX) + " -std=c++20 -O1 -shared -fPIC -pthread -w -I" + SC_TEST_INCLUDE + " " +
                            (dir_ / "k.cpp").string() + " -o " + (dir_ / "k.so").string() + " 2>" + (dir_ / "log").string();
    if (std::system(cmd.c_str()) != 0) {
      std::ifstream log(dir_ / "log");
      error_ = std::string(std::istreambuf_iterator<char>(log), {}) + "\nsource:\n" + src;
      return;
    }
    lib_ = ::dlopen((dir_ / "k.so").c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib_ != nullptr) run_ = reinterpret_cast<Run>(::dlsym(lib_, "sc_run"));
    if (lib_ != nullptr) run_v_ = reinterpret_cast<Run>(::dlsym(lib_, "sc_run_v"));
    if (run_ == nullptr) error_ = "dlopen/dlsym failed";
  }
  using Run = void (*)(const void* const*, void* const*, long long);
  static int& counter() {
    static int c = 0;
    return c;
  }
  std::filesystem::path dir_;
  void* lib_ = nullptr;
  Run run_ = nullptr;
  Run run_v_ = nullptr;
  std::string error_;
};

}  // namespace sctest::rtc
#endif
