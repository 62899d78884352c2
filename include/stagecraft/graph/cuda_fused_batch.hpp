// Independent fused groups on one GPU launched together: one generated kernel whose threads are
// cut into one range per program (each element of each program one thread, as cuda_fused.hpp's
// sc_fused computes it), so that a plan's run of small groups that do not read each other (an
// optimizer's update of each variable) is one launch instead of one each.
#pragma once
#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "cuda_fused.hpp"

namespace stagecraft::graph {

/// Whether a plan on a GPU launches a run of independent fused groups as one kernel
/// (CudaFusedBatch; on by default; off: one launch per group, for comparisons).
STAGECRAFT_COMPILED_INLINE bool& cuda_group_batching();

/// The most elements a group may have to be launched with others (default 2^20): larger groups
/// are bound by memory, not by their launch, and keep their own kernel (with 16-byte accesses).
STAGECRAFT_COMPILED_INLINE std::int64_t& cuda_batch_max_elements();

/// True when p can be launched with others: a CUDA-fusible program without a reduction, of at most
/// cuda_batch_max_elements() elements (and at least one).
STAGECRAFT_COMPILED_INLINE bool cuda_batchable(const FusedProgram& p);

/// The CUDA source of the programs launched together: kernel `sc_fused_batch(ins and outs of
/// program 0, of program 1, ..., long long n)`, one thread per element in a grid-stride loop over
/// n = the threads of all ranges; program k's range starts at a multiple of 32 (no warp computes
/// two programs) and its thread t computes element t - start as sc_fused would.
STAGECRAFT_COMPILED_INLINE std::string cuda_batch_source(const std::vector<FusedProgram>& ps);

/// Where each program's range starts, and (last) the threads of all: what cuda_batch_source uses.
STAGECRAFT_COMPILED_INLINE std::vector<std::int64_t> cuda_batch_starts(const std::vector<FusedProgram>& ps);

#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE bool& cuda_group_batching() {
  static bool on = true;
  return on;
}

STAGECRAFT_COMPILED_INLINE std::int64_t& cuda_batch_max_elements() {
  static std::int64_t n = std::int64_t{1} << 20;
  return n;
}

STAGECRAFT_COMPILED_INLINE bool cuda_batchable(const FusedProgram& p) {
  const std::int64_t n = p.out_shape.numel();
  return cuda_fusible(p) && !p.reduction && n >= 1 && n <= cuda_batch_max_elements();
}

STAGECRAFT_COMPILED_INLINE std::vector<std::int64_t> cuda_batch_starts(const std::vector<FusedProgram>& ps) {
  std::vector<std::int64_t> starts;
  std::int64_t at = 0;
  for (const FusedProgram& p : ps) {
    at = (at + 31) / 32 * 32;
    starts.push_back(at);
    at += p.out_shape.numel();
  }
  starts.push_back(at);
  return starts;
}

STAGECRAFT_COMPILED_INLINE std::string cuda_batch_source(const std::vector<FusedProgram>& ps) {
  namespace d = detail_cuda_fused;
  for (std::size_t k = 0; k < ps.size(); ++k) {
    if (!cuda_batchable(ps[k]))
      throw ValueError(d::tag("[fused] program ", static_cast<long long>(k)) +
                       " cannot be launched with others (a reduction, an op or dtype without a rule, or "
                       "more elements than cuda_batch_max_elements())");
    detail_fused::validate(ps[k]);
  }
  const std::vector<std::int64_t> starts = cuda_batch_starts(ps);
  std::string params, body, functions;  // (program k's products: sc_dot<k>_<input>)
  for (std::size_t k = 0; k < ps.size(); ++k) {
    const FusedProgram& p = ps[k];
    const std::string T = d::c_type(p.dtype), in = d::tag("in", static_cast<long long>(k)) + "_",
                      out = d::tag("out", static_cast<long long>(k)) + "_";
    const int nin = static_cast<int>(p.input_shapes.size());
    for (int j = 0; j < nin; ++j)
      params += "const " + std::string(d::arg_c_type(p, static_cast<std::size_t>(j))) + "* " + d::tag(in.c_str(), j) + ", ";
    for (std::size_t t = 0; t < p.num_out_args(); ++t) params += T + "* " + d::tag(out.c_str(), static_cast<long long>(t)) + ", ";
    const std::string dot = d::tag("sc_dot", static_cast<long long>(k)) + "_";
    auto load = [&](int j) {
      const auto u = static_cast<std::size_t>(j);
      const std::string at = d::input_index_expr(p, u);
      if (p.product(u)) return d::tag(dot.c_str(), j) + "(" + d::tag(in.c_str(), j) + ", " + d::tag(in.c_str(), p.products[u].b) + ", " + at + ")";
      return d::read_expr(p, u, T, d::tag(in.c_str(), j), at);
    };
    for (std::size_t j = 0; j < p.input_shapes.size(); ++j)
      if (p.product(j)) functions += d::product_function(p, j, T, dot);
    auto store = [&](int j, const std::string& r) {
      const auto u = static_cast<std::size_t>(j);
      return d::tag(out.c_str(), p.out_arg(u)) + "[" + d::out_index_expr(p, u) + "] = " + r;
    };
    const std::string end = d::tag("", starts[k] + p.out_shape.numel()) + "LL";
    body += std::string(k == 0 ? "    if" : "    else if") + " (t < " + (k + 1 < ps.size() ? d::tag("", starts[k + 1]) + "LL" : end) +
            ") {\n      const long long i = t - " + d::tag("", starts[k]) + "LL;\n      if (i < " +
            d::tag("", p.out_shape.numel()) + "LL) {\n" + d::element_body(p, T, "        ", load, store) + "      }\n    }\n";
  }
  return "// stagecraft fused batch: " + std::to_string(ps.size()) + " programs\n"
         "#include \"stagecraft/ops/rules.hpp\"\n"
         "namespace r = stagecraft::rules;\n" +
         functions + "extern \"C\" __global__ void sc_fused_batch(" + params + "long long n) {\n"
         "  for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < n; t += (long long)gridDim.x * blockDim.x) {\n" +
         body + "  }\n}\n";
}
#endif  // STAGECRAFT_DEFINE_COMPILED

/// Programs launched together on a GPU (see cuda_batch_source), compiled on first run there.
class CudaFusedBatch {
 public:
  explicit CudaFusedBatch(std::vector<FusedProgram> ps)
      : programs_(std::move(ps)), threads_(cuda_batch_starts(programs_).back()) {
#if defined(STAGECRAFT_WITH_CUDA)  // (without the kernels no GPU runs it: CudaFused::generated)
    source_ = cuda_batch_source(programs_);
#endif
  }
  const std::vector<FusedProgram>& programs() const { return programs_; }
  const std::string& source() const { return source_; }

  /// Runs the programs on the GPU of outputs[0]: inputs are program 0's inputs, then program 1's,
  /// ...; outputs likewise (each program's output tensors), contiguous, all on that device; no
  /// input may share memory with an output. Asynchronous, on the device's stream.
  void run(std::span<const Tensor> inputs, std::span<Tensor> outputs, const std::source_location& loc) const;

 private:
  std::vector<FusedProgram> programs_;
  std::string source_;
  std::int64_t threads_ = 0;
#if defined(STAGECRAFT_WITH_CUDA)
  mutable std::mutex mu_;
  mutable std::vector<cuda::abi::RtcKernel> kernels_;  // by device index
#endif
};

#if STAGECRAFT_DEFINE_COMPILED
STAGECRAFT_COMPILED_INLINE void CudaFusedBatch::run(std::span<const Tensor> inputs, std::span<Tensor> outputs,
                                                    const std::source_location& loc) const {
  namespace d = detail_cuda_fused;
  std::size_t nin = 0, nout = 0;
  for (const FusedProgram& p : programs_) nin += p.input_shapes.size(), nout += p.num_out_args();
  if (SC_UNLIKELY(inputs.size() != nin || outputs.size() != nout || outputs.empty()))
    throw ValueError(d::tag("[fused] the programs take ", static_cast<long long>(nin)) + " inputs and " +
                     std::to_string(nout) + d::tag(" outputs, got ", static_cast<long long>(inputs.size())) + " and " +
                     std::to_string(outputs.size()));
  const Device dev = outputs[0].device();
  std::size_t i = 0, o = 0;
  for (const FusedProgram& p : programs_) {
    for (std::size_t k = 0; k < p.input_shapes.size(); ++k, ++i) detail_fused::check_tensor(inputs[i], p.arg_dtype(k), dev, p.arg_shape(k), "input", i);
    for (std::size_t t = 0; t < p.num_out_args(); ++t, ++o) detail_fused::check_tensor(outputs[o], p.dtype, dev, p.out_arg_shape(t), "output", o);
  }
  for (std::size_t a = 0; a < inputs.size(); ++a)  // (another program's threads may write it first)
    for (std::size_t b = 0; b < outputs.size(); ++b)
      if (SC_UNLIKELY(detail_fused::overlaps(inputs[a], outputs[b])))
        throw ValueError(d::tag("[fused] input ", static_cast<long long>(a)) + " shares memory with output " + std::to_string(b) +
                         "; programs launched together may not");
  cuda::detail::require_device(dev, "fused", loc);
#if defined(STAGECRAFT_WITH_CUDA)
  const cuda::abi::Stream s = cuda::detail::stream(dev, "fused", loc);  // also makes dev current
  std::vector<const void*> ptrs;
  ptrs.reserve(inputs.size() + outputs.size());
  i = 0, o = 0;
  for (const FusedProgram& p : programs_) {
    for (std::size_t k = 0; k < p.input_shapes.size(); ++k) ptrs.push_back(inputs[i++].raw_data());
    for (std::size_t t = 0; t < p.num_out_args(); ++t) ptrs.push_back(outputs[o++].raw_data());
  }
  std::lock_guard<std::mutex> lock(mu_);
  const auto di = static_cast<std::size_t>(dev.index());
  if (kernels_.size() <= di) kernels_.resize(di + 1, nullptr);
  cuda::abi::RtcKernel& slot = kernels_[di];
  d::compile_once(slot, dev, source_, "sc_fused_batch", loc);
  long long n = threads_;
  std::vector<void*> args;
  args.reserve(ptrs.size() + 1);
  for (const void*& q : ptrs) args.push_back(&q);
  args.push_back(&n);
  cuda::detail::check(cuda::abi::rtc_launch(slot, args.data(), n, s), dev, "fused", loc);
#endif
}
#endif  // STAGECRAFT_DEFINE_COMPILED

}  // namespace stagecraft::graph
