// Fused elementwise groups on the GPU: a FusedProgram becomes CUDA source, one thread per output
// element computing every instruction in registers by its op's rule (the rules.hpp functor the
// eager kernels call: no second copy of any op's math), compiled at run time by NVRTC and cached
// (kernels/rtc.cu: in memory, and on disk under kernel_cache_dir()).
//
// A group that ends in a sum, max or min over trailing axes is one kernel too: threads share each
// row, combine the reduced register as they compute it, then combine their partials in shared
// memory (reduction_source).
//
// The source is specialised to the program's shapes: each input's broadcast index is a few
// divisions by constants. Every thread reads its inputs before it writes, so an elementwise output
// may take the buffer of an input of its shape (the plan's in-place reuse); a reduction's result
// never does. Numerics: each instruction rounds as its eager CUDA kernel does (no a * b + c
// contraction across instructions); a sum adds in another order than the CPU's.
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "../backend/cuda/runtime.hpp"
#include "../core/tensor.hpp"
#include "../ops/registry.hpp"
#include "fused_kernel.hpp"

namespace stagecraft::cuda {

/// The directory where kernels compiled at run time are kept between processes: $STAGECRAFT_CACHE_DIR,
/// else $XDG_CACHE_HOME/stagecraft, else $HOME/.cache/stagecraft (with "/cuda" appended; empty:
/// no disk cache). Assign to change it (before the first traced function runs on a GPU).
STAGECRAFT_COMPILED_INLINE std::string& kernel_cache_dir();
#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE std::string& kernel_cache_dir() {
  static std::string dir = [] {
    const char* own = std::getenv("STAGECRAFT_CACHE_DIR");
    if (own != nullptr) return *own ? std::string(own) + "/cuda" : std::string();
    if (const char* x = std::getenv("XDG_CACHE_HOME"); x != nullptr && *x) return std::string(x) + "/stagecraft/cuda";
    if (const char* h = std::getenv("HOME"); h != nullptr && *h) return std::string(h) + "/.cache/stagecraft/cuda";
    return std::string();
  }();
  return dir;
}
#endif  // STAGECRAFT_DEFINE_COMPILED

/// How many fused kernels this process compiled, found compiled in memory, and loaded from the
/// disk cache (all 0 without CUDA).
struct FusedKernelStats {
  std::int64_t compiled = 0, memory_hits = 0, disk_hits = 0;
};
STAGECRAFT_COMPILED_INLINE FusedKernelStats fused_kernel_stats();
#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE FusedKernelStats fused_kernel_stats() {
#if defined(STAGECRAFT_WITH_CUDA)
  const abi::RtcStats s = abi::rtc_stats();
  return {s.compiled, s.memory_hits, s.disk_hits};
#else
  return {};
#endif
}
#endif  // STAGECRAFT_DEFINE_COMPILED

}  // namespace stagecraft::cuda

namespace stagecraft::graph {

namespace detail_cuda_fused {

/// prefix followed by k in decimal. (`"r" + std::to_string(k)` makes GCC 12 at -O3 warn of an
/// overlapping memcpy inside std::string::insert, a false positive: GCC bug 105651.)
inline std::string tag(const char* prefix, long long k) { return std::string(prefix).append(std::to_string(k)); }

/// The rules.hpp functor whose math op `Op` is, by name ("" for ops without one).
template <class Op>
constexpr std::string_view rule_name() {
#define SC_RULE_NAME(R) if constexpr (std::is_base_of_v<rules::R, Op>) return #R; else
  SC_CUDA_UNARY_RULES(SC_RULE_NAME) SC_CUDA_BINARY_RULES(SC_RULE_NAME) return std::string_view();
#undef SC_RULE_NAME
}

/// rule_names[id]: the rule of OpId id.
inline constexpr std::array<std::string_view, ops::num_ops> rule_names = {{
#define SC_RULE_OF(S) rule_name<ops::S>(),
    STAGECRAFT_OP_LIST(SC_RULE_OF)
#undef SC_RULE_OF
}};

/// The CUDA C++ type of a dtype a fused program runs over.
STAGECRAFT_COMPILED_INLINE const char* c_type(DType d);

/// The CUDA C++ type of the tensor passed as input k of p: c_type, or bool for an input converted
/// from bool (FusedProgram::input_dtypes); nullptr when the generator cannot read it.
STAGECRAFT_COMPILED_INLINE const char* arg_c_type(const FusedProgram& p, std::size_t k);

/// Element `at` of input k of p (the tensor `ptr`) as the program's type T: converted by the cast
/// op's rule when the input has another dtype (FusedProgram::converted).
STAGECRAFT_COMPILED_INLINE std::string read_expr(const FusedProgram& p, std::size_t k, const std::string& T,
                                                 const std::string& ptr, const std::string& at);

/// The index into an input of shape `in` for output element `i` of shape `out` (NumPy
/// broadcasting; axes of one element dropped, neighbouring axes the input has or lacks alike merged).
STAGECRAFT_COMPILED_INLINE std::string index_expr(const Shape& in, const Shape& out);

/// The index into the tensor passed as input k of p for output element `i`: through its window
/// (window_index_expr) or broadcast (index_expr).
STAGECRAFT_COMPILED_INLINE std::string input_index_expr(const FusedProgram& p, std::size_t k);

/// The index into the tensor passed as input k of p for output element `i`, where that input is a
/// window of its parent (FusedWindow): the window's offset plus each output axis's coordinate
/// times the parent's stride (axes it broadcasts over skipped).
STAGECRAFT_COMPILED_INLINE std::string window_index_expr(const FusedProgram& p, std::size_t k);

/// The index into the output tensor output j of p writes for its element `i`: `i`, or through the
/// output's window (FusedProgram::out_windows) as window_index_expr reads an input's.
STAGECRAFT_COMPILED_INLINE std::string out_index_expr(const FusedProgram& p, std::size_t j);

/// offset + each axis's coordinate of element `i` of `out` times st (axes of stride 0 skipped).
STAGECRAFT_COMPILED_INLINE std::string strided_index_expr(const Shape& out, const Shape& st, std::int64_t offset);
#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE std::string input_index_expr(const FusedProgram& p, std::size_t k) {
  return p.windowed(k) ? window_index_expr(p, k) : index_expr(p.input_shapes[k], p.out_shape);
}

STAGECRAFT_COMPILED_INLINE std::string window_index_expr(const FusedProgram& p, std::size_t k) {
  return strided_index_expr(p.out_shape, p.strides_over_out(k), p.arg_offset(k));
}

STAGECRAFT_COMPILED_INLINE std::string out_index_expr(const FusedProgram& p, std::size_t j) {
  return p.out_windowed(j) ? strided_index_expr(p.out_shape, p.out_strides(j), p.out_offset(j)) : std::string("i");
}

STAGECRAFT_COMPILED_INLINE std::string strided_index_expr(const Shape& out, const Shape& st, std::int64_t offset) {
  std::string e = tag("", offset) + "LL";
  std::int64_t inner = 1;  // output elements below axis d
  for (int d = out.rank() - 1; d >= 0; --d) {
    if (out[d] != 1 && st[d] != 0) {
      std::string t = "i";
      if (inner != 1) t = "(" + t + tag(" / ", inner) + "LL)";
      t = "(" + t + tag(" % ", out[d]) + "LL)";
      if (st[d] != 1) t += tag(" * ", st[d]) + "LL";
      e += " + " + t;
    }
    inner *= out[d];
  }
  return e;
}

STAGECRAFT_COMPILED_INLINE const char* c_type(DType d) {
  switch (d) {
    case DType::i32: return "int";
    case DType::i64: return "long long";
    case DType::f32: return "float";
    case DType::f64: return "double";
    default: return nullptr;
  }
}

STAGECRAFT_COMPILED_INLINE const char* arg_c_type(const FusedProgram& p, std::size_t k) {
  const DType d = p.arg_dtype(k);
  return d == DType::b8 && p.converted(k) ? "bool" : c_type(d);
}

STAGECRAFT_COMPILED_INLINE std::string read_expr(const FusedProgram& p, std::size_t k, const std::string& T,
                                                 const std::string& ptr, const std::string& at) {
  const std::string x = ptr + "[" + at + "]";
  return p.converted(k) ? "r::Cast<" + T + ">::f(" + x + ")" : x;
}

STAGECRAFT_COMPILED_INLINE std::string index_expr(const Shape& in, const Shape& out) {
  const int ro = out.rank(), ri = in.rank();
  struct Axis {
    std::int64_t n;
    bool present;
  };
  std::vector<Axis> axes;
  for (int d = 0; d < ro; ++d) {
    const std::int64_t n = out[d];
    if (n == 1) continue;
    const int k = d - (ro - ri);
    const bool present = k >= 0 && in[k] == n;
    if (!axes.empty() && axes.back().present == present) axes.back().n *= n;
    else axes.push_back({n, present});
  }
  std::string e;
  std::int64_t inner_out = 1, inner_in = 1;  // elements below the axis in the output and the input
  for (int a = static_cast<int>(axes.size()) - 1; a >= 0; --a) {
    const Axis& ax = axes[a];
    if (ax.present) {
      std::string t = "i";
      if (inner_out != 1) t = "(" + t + tag(" / ", inner_out) + "LL)";
      if (a > 0) t = "(" + t + tag(" % ", ax.n) + "LL)";
      if (inner_in != 1) t += tag(" * ", inner_in) + "LL";
      e += (e.empty() ? "" : " + ") + t;
      inner_in *= ax.n;
    }
    inner_out *= ax.n;
  }
  return e.empty() ? "0" : e;
}
#endif  // STAGECRAFT_DEFINE_COMPILED

/// The CUDA vector type of 16 bytes of a dtype, its lane count and the lanes' member names.
struct VectorType {
  const char* name;
  int width;
  const char* lanes[4];
};
STAGECRAFT_COMPILED_INLINE VectorType vector_of(DType d);
#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE VectorType vector_of(DType d) {
  switch (d) {
    case DType::i32: return {"int4", 4, {"x", "y", "z", "w"}};
    case DType::f32: return {"float4", 4, {"x", "y", "z", "w"}};
    case DType::i64: return {"longlong2", 2, {"x", "y", nullptr, nullptr}};
    default: return {"double2", 2, {"x", "y", nullptr, nullptr}};
  }
}
#endif  // STAGECRAFT_DEFINE_COMPILED

/// The statements of one element: inputs loaded by load(k), each instruction by its rule, each
/// output stored by store(j, register).
template <class Load, class Store>
std::string element_body(const FusedProgram& p, const std::string& T, const std::string& indent, Load load,
                         Store store) {
  const int nin = static_cast<int>(p.input_shapes.size());
  std::string s;
  for (int k = 0; k < nin; ++k)  // (an operand is read by products only)
    if (!p.operand(static_cast<std::size_t>(k))) s += indent + "const " + T + tag(" r", k) + " = " + load(k) + ";\n";
  for (std::size_t j = 0; j < p.code.size(); ++j) {
    const FusedInstr& c = p.code[j];
    s += indent + "const " + T + tag(" r", nin + static_cast<int>(j)) + " = r::" +
         std::string(rule_names[static_cast<std::size_t>(c.op)]) + tag("::f(r", c.a) +
         (c.b >= 0 ? tag(", r", c.b) : std::string()) + ");\n";
  }
  for (std::size_t j = 0; j < p.outputs.size(); ++j)
    s += indent + store(static_cast<int>(j), tag("r", p.outputs[j])) + ";\n";
  return s;
}

/// The device function `sc_dot<k>(a, b, q)` of input k, a product (FusedProduct): element q
/// (row-major) of op(A) op(B). Four partial sums (terms j % 4; one fused multiply-add each, a tail
/// in the first) keep four chains and many loads in flight, then (s0 + s1) + (s2 + s3): a
/// thread's small product is bound by latency, not by arithmetic.
/// With `lanes` > 1 (a power of two up to 32), `sc_dot<k>(a, b, q, lane)` is called by that many
/// neighbouring threads of a warp together, all with the same q: lane l takes the terms l, l +
/// lanes, ... in two partial sums, and the lanes' sums are combined by lanes-wide butterfly of
/// warp shuffles (every lane returns the same value, bit for bit: each step adds the same pair).
/// (`name` instead of sc_dot: programs launched together name theirs apart.)
STAGECRAFT_COMPILED_INLINE std::string product_function(const FusedProgram& p, std::size_t k, const std::string& T,
                                                        const std::string& name = "sc_dot", int lanes = 1);
#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE std::string product_function(const FusedProgram& p, std::size_t k, const std::string& T,
                                                        const std::string& name, int lanes) {
  const FusedProduct& q = p.products[k];
  const std::int64_t m = q.m(), kk = q.k(), n = p.source_shape(k)[1];
  const std::string ms = tag("", m) + "LL", ks = tag("", kk) + "LL", ns = tag("", n) + "LL";
  auto term = [&](const std::string& j, const char* acc) {
    const std::string x = q.ta ? j + " * " + ms + " + row" : "row * " + ks + " + " + j;
    const std::string y = q.tb ? "col * " + ks + " + " + j : j + " * " + ns + " + col";
    return std::string("    ") + acc + " = std::fma(a[" + x + "], b[" + y + "], " + acc + ");\n";
  };
  const std::string head = "__device__ __forceinline__ " + T + " " + tag(name.c_str(), static_cast<long long>(k)) + "(const " + T +
                           "* a, const " + T + "* b, long long q" + (lanes > 1 ? ", int lane" : "") + ") {\n"
                           "  const long long row = q / " + ns + ", col = q % " + ns + ";\n";
  if (lanes > 1) {
    const std::string L = tag("", lanes) + "LL";
    std::string s = head + "  " + T + " s0 = 0, s1 = 0;\n"
                    "  long long j = lane;\n"
                    "#pragma unroll 4\n"
                    "  for (; j + " + L + " < " + ks + "; j += 2 * " + L + ") {\n" +
                    term("j", "s0") + term("(j + " + L + ")", "s1") +
                    "  }\n"
                    "  if (j < " + ks + ") {\n" + term("j", "s0") + "  }\n"
                    "  " + T + " s = s0 + s1;\n";
    for (int h = lanes / 2; h >= 1; h /= 2) s += tag("  s += __shfl_xor_sync(0xffffffffu, s, ", h) + ");\n";
    return s + "  return s;\n}\n";
  }
  return head + "  " + T + " s0 = 0, s1 = 0, s2 = 0, s3 = 0;\n"
         "  long long j = 0;\n"
         "#pragma unroll 4\n"
         "  for (; j + 4 <= " + ks + "; j += 4) {\n" +
         term("j", "s0") + term("(j + 1)", "s1") + term("(j + 2)", "s2") + term("(j + 3)", "s3") +
         "  }\n"
         "  for (; j < " + ks + "; ++j) {\n" + term("j", "s0") + "  }\n"
         "  return (s0 + s1) + (s2 + s3);\n"
         "}\n";
}
#endif  // STAGECRAFT_DEFINE_COMPILED

/// Threads that share one row of a reduction (a power of two, at most a block's 256): enough for
/// the row's elements, so a short row leaves the block's other threads to the next rows.
STAGECRAFT_COMPILED_INLINE int reduce_threads_per_row(std::int64_t inner);

/// The combine step of reduction `op` in CUDA source: the op's rule, the new value first for max
/// and min (as backend/cpu/reduce.hpp's reducers, so NaN propagates the same way).
STAGECRAFT_COMPILED_INLINE std::string combine_expr(ops::OpId op, const std::string& acc, const std::string& v);
#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE int reduce_threads_per_row(std::int64_t inner) {
  int t = 1;
  while (t < inner && t < 256) t *= 2;
  return t;
}

STAGECRAFT_COMPILED_INLINE std::string combine_expr(ops::OpId op, const std::string& acc, const std::string& v) {
  if (op == ops::OpId::Max) return "r::Maximum::f(" + v + ", " + acc + ")";
  if (op == ops::OpId::Min) return "r::Minimum::f(" + v + ", " + acc + ")";
  return "r::Add::f(" + acc + ", " + v + ")";
}
#endif  // STAGECRAFT_DEFINE_COMPILED

/// How the GPU cuts a reduction's rows (as the eager reductions do: see cuda::abi::reduce_split).
using ReductionSplit = cuda::abi::ReduceSplit;

/// The kernel `name(params)` of a program with a reduction, launched with blocks of 256 threads
/// (rtc_launch). The rows of `inner` elements are cut into pieces (`split`; whole rows when not
/// cut), and each piece is taken by W = reduce_threads_per_row(piece) threads (256 / W pieces per
/// block, blocks striding over them): each thread computes the elements lane, lane + W, ... of its
/// piece (storing the elementwise outputs) and combines the reduced register's values; the piece's
/// W partials are then combined by a tree in shared memory, a pair only when both hold values (no
/// identity element: exact for max, min and NaN), and the piece's first thread writes red[piece].
/// Every thread of a block takes the same number of steps, so each __syncthreads is reached by all.
template <class Load, class Store>
std::string reduction_source(const FusedProgram& p, const std::string& T, const std::string& params, Load load,
                             Store store, const std::string& name, ReductionSplit split) {
  const FusedReduction& rd = *p.reduction;
  const int w = reduce_threads_per_row(split.chunk);
  const std::string W = std::to_string(w), inner = std::to_string(rd.inner) + "LL",
                    chunks = std::to_string(split.chunks) + "LL", chunk = std::to_string(split.chunk) + "LL",
                    per_block = std::to_string(256 / w) + "LL";
  const std::string v = tag("r", rd.reg);
  const bool cut = split.chunks > 1;
  std::string s = "extern \"C\" __global__ void " + name + "(" + params + ") {\n"
                  "  __shared__ " + T + " part[256];\n"
                  "  const int lane = threadIdx.x % " + W + ";\n"
                  "  const long long pieces = n / " + inner + (cut ? " * " + chunks : std::string()) + ";\n"
                  "  for (long long first = blockIdx.x * " + per_block + "; first < pieces; first += (long long)gridDim.x * " +
                  per_block + ") {\n"
                  "    const long long piece = first + threadIdx.x / " + W + ";\n" +
                  (cut ? "    const long long row = piece / " + chunks + ", begin = piece % " + chunks + " * " + chunk + ";\n"
                         "    const long long len = piece < pieces ? (" + inner + " - begin < " + chunk + " ? " + inner +
                         " - begin : " + chunk + ") : 0;\n"
                       : "    const long long row = piece, begin = 0, len = " + inner + ";\n") +
                  "    " + T + " acc = 0;\n"
                  "    if (piece < pieces) {\n"
                  "      for (long long j = begin + lane; j < begin + len; j += " + W + ") {\n"
                  "        const long long i = row * " + inner + " + j;\n" +
                  element_body(p, T, "        ", load, store) +
                  "        acc = j == begin + lane ? " + v + " : " + combine_expr(rd.op, "acc", v) + ";\n"
                  "      }\n"
                  "    }\n"
                  "    part[threadIdx.x] = acc;\n";
  for (int half = w / 2; half >= 1; half /= 2) {
    const std::string h = std::to_string(half);
    s += "    __syncthreads();\n"
         "    if (lane < " + h + " && lane + " + h + " < len) part[threadIdx.x] = " +
         combine_expr(rd.op, "part[threadIdx.x]", "part[threadIdx.x + " + h + "]") + ";\n";
  }
  s += "    __syncthreads();\n"
       "    if (lane == 0 && piece < pieces) red[piece] = part[threadIdx.x];\n"
       "    __syncthreads();  // part is refilled for the next pieces\n"
       "  }\n"
       "}\n";
  return s;
}

/// The program that combines the partials of a cut reduction: [rows, chunks] reduced over its rows
/// by the same op (the kernel sc_fused_r2 of cuda_source).
STAGECRAFT_COMPILED_INLINE FusedProgram combine_program(const FusedProgram& p, ReductionSplit split);
#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE FusedProgram combine_program(const FusedProgram& p, ReductionSplit split) {
  const FusedReduction& rd = *p.reduction;
  const std::int64_t rows = p.out_shape.numel() / rd.inner;
  FusedProgram c;
  c.dtype = p.dtype;
  c.out_shape = Shape{rows, split.chunks};
  c.input_shapes = {c.out_shape};
  c.reduction = FusedReduction{rd.op, 0, split.chunks, Shape{rows}};
  return c;
}
#endif  // STAGECRAFT_DEFINE_COMPILED

/// p without its reduction, the reduced register written out instead as one more output tensor
/// (after p's; of out_shape): the elementwise half of a reduction whose elements are formed by
/// lanes (cuda_product_lanes), its rows then reduced by a second kernel.
STAGECRAFT_COMPILED_INLINE FusedProgram reduced_as_output(const FusedProgram& p);
#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE FusedProgram reduced_as_output(const FusedProgram& p) {
  FusedProgram q = p;
  q.reduction.reset();
  const auto next = static_cast<int>(p.num_out_args());
  q.outputs.push_back(p.reduction->reg);
  if (!q.out_windows.empty()) q.out_windows.emplace_back();
  if (!q.out_args.empty()) q.out_args.push_back(next);
  return q;
}
#endif  // STAGECRAFT_DEFINE_COMPILED

}  // namespace detail_cuda_fused

/// How the GPU cuts the rows of p's reduction (see detail_cuda_fused::ReductionSplit; p must have one).
STAGECRAFT_COMPILED_INLINE detail_cuda_fused::ReductionSplit cuda_reduction_split(const FusedProgram& p);

/// True when every input of p is read at the element's own index or is one value: the program then
/// also has a kernel reading and writing 16 bytes per access (sc_fused_v).
STAGECRAFT_COMPILED_INLINE bool cuda_vectorizable(const FusedProgram& p);

/// Whether generated kernels use 16-byte loads and stores where a program allows them (default on;
/// off: one element per access, for comparisons).
STAGECRAFT_COMPILED_INLINE bool& cuda_vector_loads();

/// True when p can run as a generated CUDA kernel: over a dtype and ops the generator knows, and
/// a reduction consumer (if any) a sum, max or min over a floating dtype (as the CPU evaluator's).
STAGECRAFT_COMPILED_INLINE bool cuda_fusible(const FusedProgram& p);

/// The most threads that form one element's products together (default 32, a warp; 1: a thread
/// per element, for comparisons). Read when a program's kernel is made.
STAGECRAFT_COMPILED_INLINE int& cuda_max_product_lanes();

/// How many neighbouring threads of a warp compute each element of p together (1, 2, 4, 8, 16 or
/// 32): 1 unless p forms products (FusedProduct). A few elements whose
/// products have long inner dimensions (an LSTM step at batch 1: 64 elements, 64 or 256 terms
/// each) leave a thread per element bound by one long chain of loads on an almost idle GPU; the
/// lanes share the terms instead. The count is the largest power of two within
/// cuda_max_product_lanes(), half the longest inner dimension, and 2^17 / elements threads in all
/// (a full GPU's worth: more elements fill the GPU with a thread each, and read B coalesced).
STAGECRAFT_COMPILED_INLINE int cuda_product_lanes(const FusedProgram& p);

/// The CUDA source of p: kernel `sc_fused(const T* in0.., T* out0.., long long n)`, one element per
/// thread and step of a grid-stride loop; for vectorizable programs also `sc_fused_v` (same
/// parameters), which reads and writes 16 bytes per access (all pointers 16-byte aligned) and does
/// the last n % width elements one by one. A program with a reduction has instead
/// `sc_fused_r(const T* in0.., T* out0.., T* red, long long n)`, see reduction_source().
/// With lanes > 1 (cuda_product_lanes), sc_fused is launched with `lanes` threads per element: a
/// warp takes 32 / lanes neighbouring elements per step of its grid-stride loop (the loop's test is
/// the warp's, so its shuffles meet), the lanes form the products together, each computes the
/// rest, and the first lane stores. A reduction is then two kernels: sc_fused, which also writes
/// the reduced register's elements to a scratch tensor (one more output, after the others), and
/// `sc_fused_r2(const T* in0, T* red, long long n)`, which reduces its rows.
STAGECRAFT_COMPILED_INLINE std::string cuda_source(const FusedProgram& p);
STAGECRAFT_COMPILED_INLINE std::string cuda_source(const FusedProgram& p, int lanes);
#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE int& cuda_max_product_lanes() {
  static int lanes = 32;
  return lanes;
}

STAGECRAFT_COMPILED_INLINE int cuda_product_lanes(const FusedProgram& p) {
  if (!p.any_product()) return 1;
  std::int64_t inner = 0;
  for (std::size_t k = 0; k < p.products.size(); ++k)
    if (p.product(k)) inner = std::max(inner, p.products[k].k());
  const std::int64_t n = std::max<std::int64_t>(p.out_shape.numel(), 1);
  int lanes = 1;
  while (lanes < 32 && lanes * 2 <= cuda_max_product_lanes() && lanes * 2 <= inner / 2 && n * lanes * 2 <= (std::int64_t{1} << 17))
    lanes *= 2;
  return lanes;
}

STAGECRAFT_COMPILED_INLINE std::string cuda_source(const FusedProgram& p) { return cuda_source(p, cuda_product_lanes(p)); }

STAGECRAFT_COMPILED_INLINE detail_cuda_fused::ReductionSplit cuda_reduction_split(const FusedProgram& p) {
  const std::int64_t inner = p.reduction->inner;
  if (inner <= 0) return {1, inner};
  return cuda::abi::reduce_split(p.out_shape.numel() / inner, inner);
}

STAGECRAFT_COMPILED_INLINE bool cuda_vectorizable(const FusedProgram& p) {
  if (p.reduction) return false;  // its kernel walks rows (sc_fused_r)
  if (p.any_window() || p.any_out_window()) return false;  // a window's rows need not start 16 bytes apart
  if (p.any_product()) return false;  // an element's products are loops
  for (std::size_t k = 0; k < p.input_shapes.size(); ++k) {
    const std::string e = detail_cuda_fused::index_expr(p.input_shapes[k], p.out_shape);
    if (e != "i" && e != "0") return false;
    if (e == "i" && p.converted(k)) return false;  // (its 16 bytes hold another count of elements)
  }
  return true;
}

STAGECRAFT_COMPILED_INLINE bool& cuda_vector_loads() {
  static bool on = true;
  return on;
}

STAGECRAFT_COMPILED_INLINE bool cuda_fusible(const FusedProgram& p) {
  if (detail_cuda_fused::c_type(p.dtype) == nullptr) return false;
  if (p.reduction && (!is_floating(p.dtype) || p.reduction->leading ||  // (column reductions: the CPU's only)
                      (p.reduction->op != ops::OpId::Sum && p.reduction->op != ops::OpId::Max &&
                       p.reduction->op != ops::OpId::Min)))
    return false;
  for (const FusedInstr& c : p.code)
    if (static_cast<int>(c.op) >= ops::num_ops || detail_cuda_fused::rule_names[static_cast<std::size_t>(c.op)].empty())
      return false;
  for (std::size_t k = 0; k < p.input_dtypes.size(); ++k)
    if (detail_cuda_fused::arg_c_type(p, k) == nullptr) return false;
  return true;
}

STAGECRAFT_COMPILED_INLINE std::string cuda_source(const FusedProgram& p, int lanes) {
  namespace d = detail_cuda_fused;
  if (lanes < 1 || lanes > 32 || (lanes & (lanes - 1)) != 0 || (lanes > 1 && !p.any_product()))
    throw ValueError(d::tag("[fused] ", lanes) + " threads per element: a power of two up to 32, and 1 for a program "
                     "without products");
  if (!cuda_fusible(p))
    throw ValueError("[fused] the program cannot run as a CUDA kernel (an op or dtype without a rule, or a "
                     "reduction other than a floating sum, max or min)");
  detail_fused::validate(p);
  const std::string T = d::c_type(p.dtype);
  const int nin = static_cast<int>(p.input_shapes.size()), nout = static_cast<int>(p.outputs.size());
  std::string params;
  for (int k = 0; k < nin; ++k) params += "const " + std::string(d::arg_c_type(p, static_cast<std::size_t>(k))) + d::tag("* in", k) + ", ";
  for (int t = 0; t < static_cast<int>(p.num_out_args()); ++t) params += T + d::tag("* out", t) + ", ";
  if (p.reduction) params += T + "* red, ";
  params += "long long n";
  std::vector<std::string> index(static_cast<std::size_t>(nin));
  for (int k = 0; k < nin; ++k) {
    const auto u = static_cast<std::size_t>(k);
    if (p.operand(u)) continue;
    index[u] = d::input_index_expr(p, u);
  }
  auto load_at = [&](int k) {
    const auto u = static_cast<std::size_t>(k);
    if (p.product(u))
      return d::tag("sc_dot", k) + d::tag("(in", k) + d::tag(", in", p.products[u].b) + ", " + index[u] + (lanes > 1 ? ", lane)" : ")");
    return d::read_expr(p, u, T, d::tag("in", k), index[u]);
  };
  auto store_at = [&](int j, const std::string& r) {
    const auto u = static_cast<std::size_t>(j);
    return (lanes > 1 ? "if (own) " : "") + d::tag("out", p.out_arg(u)) + "[" + d::out_index_expr(p, u) + "] = " + r;
  };
  std::string head = "// stagecraft fused kernel: " + std::string(name(p.dtype)) + p.out_shape.str() +
                     (lanes > 1 ? d::tag(", ", lanes) + " threads per element" : std::string()) + "\n" +
                     "#include \"stagecraft/ops/rules.hpp\"\n"
                     "namespace r = stagecraft::rules;\n";
  for (std::size_t k = 0; k < p.input_shapes.size(); ++k)
    if (p.product(k)) head += d::product_function(p, k, T, "sc_dot", lanes);
  if (p.reduction && lanes > 1) {  // the elements by lanes, the reduced register to scratch; then its rows
    const FusedReduction& rd = *p.reduction;
    const FusedProgram c = d::combine_program(p, {rd.inner, 1});  // [rows, inner] reduced over inner
    return cuda_source(d::reduced_as_output(p), lanes) +
           d::reduction_source(c, T, "const " + T + "* in0, " + T + "* red, long long n",
                               [](int) { return std::string("in0[i]"); },
                               [](int, const std::string&) { return std::string(); }, "sc_fused_r2", {1, rd.inner});
  }
  if (p.reduction) {
    const d::ReductionSplit split = cuda_reduction_split(p);
    std::string s = head + d::reduction_source(p, T, params, load_at, store_at, "sc_fused_r", split);
    if (split.chunks == 1) return s;
    const FusedProgram c = d::combine_program(p, split);
    return s + d::reduction_source(c, T, "const " + T + "* in0, " + T + "* red, long long n",
                                   [](int) { return std::string("in0[i]"); },
                                   [](int, const std::string&) { return std::string(); }, "sc_fused_r2", {1, split.chunks});
  }
  const std::string scalar_body = d::element_body(p, T, "    ", load_at, store_at);
  if (lanes > 1) {  // (not vectorizable: it has products)
    const std::string L = d::tag("", lanes);
    return head + "extern \"C\" __global__ void sc_fused(" + params + ") {\n"
           "  const int lane = threadIdx.x % " + L + ";\n"
           "  const long long step = (long long)gridDim.x * blockDim.x / " + L + ";\n"
           "  long long e = (blockIdx.x * (long long)blockDim.x + threadIdx.x) / " + L + ";\n"
           "  for (long long first = e - (threadIdx.x % 32) / " + L + "; first < n; first += step, e += step) {\n"
           "    const long long i = e < n ? e : n - 1;  // (a warp's lanes past n compute element n - 1 and store nothing)\n"
           "    const bool own = lane == 0 && e < n;\n" +
           scalar_body + "  }\n}\n";
  }
  std::string s = head + "extern \"C\" __global__ void sc_fused(" + params + ") {\n"
                  "  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {\n" +
                  scalar_body + "  }\n}\n";
  if (!cuda_vectorizable(p)) return s;
  const d::VectorType v = d::vector_of(p.dtype);
  const std::string V = v.name, W = std::to_string(v.width);
  s += "extern \"C\" __global__ void sc_fused_v(" + params + ") {\n"
       "  const long long nv = n / " + W + ", t = blockIdx.x * (long long)blockDim.x + threadIdx.x, "
       "step = (long long)gridDim.x * blockDim.x;\n"
       "  for (long long v = t; v < nv; v += step) {\n";
  for (int k = 0; k < nin; ++k)
    if (index[static_cast<std::size_t>(k)] == "i")
      s += "    const " + V + d::tag(" l", k) + " = reinterpret_cast<const " + V + d::tag("*>(in", k) + ")[v];\n";
  for (int j = 0; j < nout; ++j) s += "    " + V + d::tag(" o", j) + ";\n";
  for (int lane = 0; lane < v.width; ++lane) {
    const std::string m = v.lanes[lane];
    auto load_lane = [&](int k) {
      return index[static_cast<std::size_t>(k)] == "i" ? d::tag("l", k) + "." + m
                                                        : d::read_expr(p, static_cast<std::size_t>(k), T, d::tag("in", k), "0");
    };
    auto store_lane = [&](int j, const std::string& r) { return d::tag("o", j) + "." + m + " = " + r; };
    s += "    {\n" + d::element_body(p, T, "      ", load_lane, store_lane) + "    }\n";
  }
  for (int j = 0; j < nout; ++j)
    s += "    reinterpret_cast<" + V + d::tag("*>(out", p.out_arg(static_cast<std::size_t>(j))) + d::tag(")[v] = o", j) + ";\n";
  s += "  }\n"
       "  for (long long i = nv * " + W + " + t; i < n; i += step) {\n" + scalar_body + "  }\n}\n";
  return s;
}
#endif  // STAGECRAFT_DEFINE_COMPILED

#if defined(STAGECRAFT_WITH_CUDA)
namespace detail_cuda_fused {
/// Compiles kernel `name` of `source` for dev into slot unless slot holds it already (NVRTC, or
/// the in-memory and on-disk caches); NVRTC's log in the DeviceError when the source is refused.
inline void compile_once(cuda::abi::RtcKernel& slot, Device dev, const std::string& source, const char* name,
                         const std::source_location& loc) {
  if (slot != nullptr) return;
  char log[4096] = {};
  const cuda::abi::Status st =
      cuda::abi::rtc_kernel(dev.index(), source.c_str(), name, cuda::kernel_cache_dir().c_str(), &slot, log, sizeof log);
  if (st == cuda::abi::rtc_compile_error)
    stagecraft::detail::fail<DeviceError>("fused", loc, "NVRTC could not compile the fused kernel: ", log, "\nsource:\n", source);
  cuda::detail::check(st, dev, "fused", loc);
}
}  // namespace detail_cuda_fused
#endif

/// A program ready for the GPU: its source, and its kernel per device (compiled on first run there).
class CudaFused {
 public:
  explicit CudaFused(FusedProgram p)
      : program_(std::move(p)), lanes_(cuda_product_lanes(program_)), source_(generated(program_, lanes_)),
        vectorizable_(cuda_vectorizable(program_)) {}
  const FusedProgram& program() const { return program_; }
  /// The kernel's source (empty in a build without the CUDA kernels, where no GPU runs it).
  const std::string& source() const { return source_; }
  /// Threads per element of its kernel (cuda_product_lanes when it was made).
  int lanes() const { return lanes_; }
  /// Kernels each run launches: 2 for a reduction cut in pieces (cuda_reduction_split) or whose
  /// elements lanes form (the rows reduced by a second kernel), else 1.
  int launches() const {
    return program_.reduction && (lanes_ > 1 || cuda_reduction_split(program_).chunks > 1) ? 2 : 1;
  }

  /// Runs the program on the GPU of outputs[0]: inputs and outputs as graph::run's (contiguous,
  /// of the program's dtype and shapes), all on that device. Asynchronous, on the device's stream.
  void run(std::span<const Tensor> inputs, std::span<Tensor> outputs, const std::source_location& loc) const;

 private:
  /// The source of p's kernel. Without the kernels (STAGECRAFT_WITH_CUDA unset) no plan step runs
  /// on a GPU, so none is generated: the generator's code stays out of every CPU-only user file
  /// that makes a plan (about 100 KB of a traced function's object).
  static std::string generated([[maybe_unused]] const FusedProgram& p, [[maybe_unused]] int lanes) {
#if defined(STAGECRAFT_WITH_CUDA)
    return cuda_source(p, lanes);
#else
    return {};
#endif
  }

  FusedProgram program_;
  int lanes_;
  std::string source_;
  bool vectorizable_;
#if defined(STAGECRAFT_WITH_CUDA)
  mutable std::mutex mu_;
  struct OnDevice {
    std::array<cuda::abi::RtcKernel, 3> kernels{};  // sc_fused (or sc_fused_r), sc_fused_v, sc_fused_r2
    Tensor scratch;  // a cut reduction's partials (cuda_reduction_split), or the elements its lanes formed
  };
  mutable std::vector<OnDevice> on_device_;  // by device index
#endif
};

#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE void CudaFused::run(std::span<const Tensor> inputs, std::span<Tensor> outputs,
                                               const std::source_location& loc) const {
  const FusedProgram& p = program_;
  const std::size_t nout = p.num_out_args() + (p.reduction ? 1 : 0);
  if (SC_UNLIKELY(inputs.size() != p.input_shapes.size() || outputs.size() != nout || outputs.empty()))
    throw ValueError(detail_cuda_fused::tag("[fused] the program takes ", p.input_shapes.size()) + " inputs and " +
                     std::to_string(nout) + detail_cuda_fused::tag(" outputs, got ", inputs.size()) + " and " +
                     std::to_string(outputs.size()));
  const Device dev = outputs[0].device();
  for (std::size_t i = 0; i < inputs.size(); ++i)
    detail_fused::check_tensor(inputs[i], p.arg_dtype(i), dev, p.arg_shape(i), "input", i);
  for (std::size_t t = 0; t < p.num_out_args(); ++t)
    detail_fused::check_tensor(outputs[t], p.dtype, dev, p.out_arg_shape(t), "output", t);
  for (std::size_t t = 0; t < p.num_out_args(); ++t)  // (its elements are written in another order than inputs are read)
    for (std::size_t i = 0; i < inputs.size() && !(p.out_arg_shape(t) == p.out_shape); ++i)
      if (SC_UNLIKELY(detail_fused::overlaps(inputs[i], outputs[t])))
        throw ValueError(detail_cuda_fused::tag("[fused] input ", i) + " shares memory with an output tensor written through windows; it may not");
  if (p.reduction) {
    detail_fused::check_tensor(outputs[nout - 1], p.dtype, dev, p.reduction->out_shape, "output", nout - 1);
    // Rows are written as they finish while other blocks still read: the reduction's result must
    // not share memory with an input (the CPU evaluator keeps partials apart; this kernel does not).
    for (std::size_t i = 0; i < inputs.size(); ++i)
      if (SC_UNLIKELY(detail_fused::overlaps(inputs[i], outputs[nout - 1])))
        throw ValueError(detail_cuda_fused::tag("[fused] output ", nout - 1) + " (the reduction's result) shares memory with input " +
                         std::to_string(i) + "; on a GPU it may not");
  }
  cuda::detail::require_device(dev, "fused", loc);
#if defined(STAGECRAFT_WITH_CUDA)
  const cuda::abi::Stream s = cuda::detail::stream(dev, "fused", loc);  // also makes dev current
  std::vector<const void*> ptrs;
  ptrs.reserve(inputs.size() + outputs.size());
  for (const Tensor& t : inputs) ptrs.push_back(t.raw_data());
  for (const Tensor& t : outputs) ptrs.push_back(t.raw_data());
  bool vec = vectorizable_ && cuda_vector_loads();  // (never with a reduction: not vectorizable)
  for (const void* q : ptrs) vec = vec && reinterpret_cast<std::uintptr_t>(q) % 16 == 0;
  const detail_cuda_fused::ReductionSplit split = p.reduction ? cuda_reduction_split(p) : detail_cuda_fused::ReductionSplit{};
  // The device's kernels, compiled on first use; and a cut reduction's scratch. The lock is held
  // until both of its kernels are queued, so another thread's run cannot come between them on
  // the device's one stream and overwrite the partials.
  std::lock_guard<std::mutex> lock(mu_);
  const auto di = static_cast<std::size_t>(dev.index());
  if (on_device_.size() <= di) on_device_.resize(di + 1);
  OnDevice& mine = on_device_[di];
  auto kernel = [&](int which) {
    static constexpr const char* names[3] = {"sc_fused", "sc_fused_v", "sc_fused_r2"};
    cuda::abi::RtcKernel& slot = mine.kernels[static_cast<std::size_t>(which)];
    detail_cuda_fused::compile_once(slot, dev, source_, which == 0 && p.reduction && lanes_ == 1 ? "sc_fused_r" : names[which], loc);
    return slot;
  };
  long long n = p.out_shape.numel();
  std::vector<void*> args;
  args.reserve(ptrs.size() + 1);
  for (const void*& q : ptrs) args.push_back(&q);
  args.push_back(&n);
  if (!p.reduction || lanes_ > 1) {  // lanes threads per element (rtc_launch makes blocks of 256 threads), or one per 16 bytes
    const void* result = ptrs.back();
    if (p.reduction) {  // the reduced register's elements to scratch, reduced by sc_fused_r2 below
      if (!mine.scratch.defined() || mine.scratch.numel() < n)
        mine.scratch = stagecraft::detail::empty_tensor(Shape{n}, p.dtype, dev, "fused", loc);
      ptrs.back() = mine.scratch.raw_data();
    }
    const std::int64_t width = vec ? detail_cuda_fused::vector_of(p.dtype).width : 1;
    cuda::detail::check(cuda::abi::rtc_launch(kernel(vec ? 1 : 0), args.data(), (n + width - 1) / width * lanes_, s), dev,
                        "fused", loc);
    if (!p.reduction || n == 0) return;
    const void* elements = mine.scratch.raw_data();
    void* args2[3] = {&elements, &result, &n};
    const std::int64_t rows = n / p.reduction->inner, per_block = 256 / detail_cuda_fused::reduce_threads_per_row(p.reduction->inner);
    cuda::detail::check(cuda::abi::rtc_launch(kernel(2), args2, (rows + per_block - 1) / per_block * 256, s), dev, "fused", loc);
    return;
  }
  // 256 threads for each block of pieces (a grid-stride loop over them)
  const std::int64_t rows = n / p.reduction->inner, pieces = rows * split.chunks,
                     per_block = 256 / detail_cuda_fused::reduce_threads_per_row(split.chunk);
  const void* result = ptrs.back();
  if (split.chunks > 1) {
    if (!mine.scratch.defined() || mine.scratch.numel() < pieces)
      mine.scratch = stagecraft::detail::empty_tensor(Shape{pieces}, p.dtype, dev, "fused", loc);
    ptrs.back() = mine.scratch.raw_data();  // the pieces' partials, combined below
  }
  cuda::detail::check(cuda::abi::rtc_launch(kernel(0), args.data(), (pieces + per_block - 1) / per_block * 256, s),
                      dev, "fused", loc);
  if (split.chunks == 1) return;
  const void* partials = mine.scratch.raw_data();
  long long m = pieces;
  void* args2[3] = {&partials, &result, &m};
  const std::int64_t per_block2 = 256 / detail_cuda_fused::reduce_threads_per_row(split.chunks);
  cuda::detail::check(cuda::abi::rtc_launch(kernel(2), args2, (rows + per_block2 - 1) / per_block2 * 256, s), dev,
                      "fused", loc);
#endif
}
#endif  // STAGECRAFT_DEFINE_COMPILED

}  // namespace stagecraft::graph
