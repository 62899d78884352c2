// The host side of the CUDA backend: availability, streams, status checks and copies between
// devices. Declared in every build; without the kernels (STAGECRAFT_WITH_CUDA unset) there is no
// device: is_available() is false and every CUDA request is a DeviceError saying why.
#pragma once
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <mutex>
#include <source_location>
#include <string>
#include <string_view>

#include "../../core/device.hpp"
#include "../../core/error.hpp"
#include "abi.hpp"

namespace stagecraft::cuda {

/// True when stagecraft was built with its CUDA kernels (STAGECRAFT_CUDA) and finds a GPU.
inline constexpr bool built =
#if defined(STAGECRAFT_WITH_CUDA)
    true;
#else
    false;
#endif

/// The number of GPUs stagecraft can use (0 without the CUDA kernels, a driver or a device).
inline int device_count() {
#if defined(STAGECRAFT_WITH_CUDA)
  static const int n = abi::device_count();  // the set of devices is fixed for the process
  return n;
#else
  return 0;
#endif
}

/// True when a CUDA device can run stagecraft's kernels.
inline bool is_available() { return device_count() > 0; }

namespace detail {

/// A launch that can find a bad index on the GPU (gather, scatter_add), kept by its tag so that
/// the error raised when the host next waits for the device names the op, the user's line and
/// the shape.
struct FaultSite {
  std::int32_t tag = 0;
  std::string_view op;  ///< an op's static name
  const char* file = "";
  std::uint32_t line = 0;
  std::int64_t axis = 0;
  int rank = 0;
  std::int64_t dims[abi::max_rank] = {};
  /// A range check's (check_range): what a value is called ("label"; static) and the range
  /// [lo, hi); empty for a bad index (the record's bound is then the index's position).
  std::string_view what;
  std::int64_t lo = 0, hi = 0;
};

/// The latest launches that can fault, by tag (1, 2, ...; 0 means "no fault"): a ring, so a fault
/// found after many more such launches is still raised, without its site.
class FaultLog {
 public:
  static constexpr std::size_t size = 512;
  /// Keeps `s` under a new tag and returns the tag.
  std::int32_t record(FaultSite s) {
    const std::lock_guard<std::mutex> lock(mu_);
    next_ = next_ == std::numeric_limits<std::int32_t>::max() ? 1 : next_ + 1;
    s.tag = next_;
    ring_[static_cast<std::size_t>(next_) % size] = s;
    return next_;
  }
  /// The site of `tag`; false when it has left the ring (or never was).
  bool find(std::int32_t tag, FaultSite& out) const {
    const std::lock_guard<std::mutex> lock(mu_);
    if (tag <= 0) return false;
    const FaultSite& s = ring_[static_cast<std::size_t>(tag) % size];
    if (s.tag != tag) return false;
    out = s;
    return true;
  }

 private:
  mutable std::mutex mu_;
  std::int32_t next_ = 0;
  std::array<FaultSite, size> ring_{};
};
inline FaultLog& fault_log() {
  static FaultLog log;
  return log;
}

/// The message of a bad index `f` a kernel found on `d`, raised when `op` at `loc` waited for the
/// device: "[gather] index 7 is out of range for axis 0 of extent 5 (shape [5, 3]) at user.cpp:12;
/// found on cuda:0 by the kernel, raised at the next wait for the device ([to_vector] at ...)".
inline std::string fault_text(const FaultSite* site, const abi::Fault& f, Device d, std::string_view op,
                              const std::source_location& loc) {
  const std::string raised = "found on " + d.str() + " by the kernel, raised at the next wait for the device ([" +
                             std::string(op) + "] at " + stagecraft::detail::where(loc) + ")";
  if (site == nullptr)
    return "[gather/scatter_add/check_range] a value out of range (" + std::to_string(f.value) + ") in a launch too "
           "long ago to name; " + raised;
  std::string_view file = site->file;
  if (auto p = file.find_last_of("/\\"); p != std::string_view::npos) file.remove_prefix(p + 1);
  const std::string at = " at " + std::string(file) + ":" + std::to_string(site->line) + "; " + raised;
  if (!site->what.empty())
    return "[" + std::string(site->op) + "] " + std::string(site->what) + " " + std::to_string(f.value) + " at index " +
           std::to_string(f.bound) + " is out of range [" + std::to_string(site->lo) + ", " + std::to_string(site->hi) +
           ")" + at;
  std::string shape = "[";
  for (int k = 0; k < site->rank; ++k) shape += (k ? ", " : "") + std::to_string(site->dims[k]);
  return "[" + std::string(site->op) + "] index " + std::to_string(f.value) + " is out of range for axis " +
         std::to_string(site->axis) + " of extent " + std::to_string(f.bound) + " (shape " + shape + "])" + at;
}

/// Throws the ValueError of the fault the last wait for `d` found.
[[noreturn]] SC_COLD inline void raise_fault(Device d, std::string_view op, const std::source_location& loc) {
  abi::Fault f;
#if defined(STAGECRAFT_WITH_CUDA)
  abi::take_fault(d.index(), &f);
#endif
  FaultSite site;
  const bool known = fault_log().find(f.tag, site);
  throw ValueError(fault_text(known ? &site : nullptr, f, d, op, loc));
}

/// Throws DeviceError "[op] CUDA error: <what> on cuda:i at file:line" for a failed status, or
/// the ValueError of a bad index a kernel found (abi::device_fault).
inline void check(abi::Status s, Device d, std::string_view op, const std::source_location& loc) {
  if (SC_UNLIKELY(s == abi::device_fault)) raise_fault(d, op, loc);
  if (SC_UNLIKELY(s != 0))
    stagecraft::detail::fail<DeviceError>(op, loc, "CUDA error on ", d.str(), ": ",
#if defined(STAGECRAFT_WITH_CUDA)
                                          abi::error_string(s)
#else
                                          "status ", s
#endif
    );
}

/// Throws DeviceError unless `d` is a CUDA device this process can use.
inline void require_device(Device d, std::string_view op, const std::source_location& loc) {
  if (!built)
    stagecraft::detail::fail<DeviceError>(op, loc, "cannot use ", d.str(), ": stagecraft was built without CUDA "
                                          "(configure with -DSTAGECRAFT_CUDA=ON and a CUDA toolkit)");
  if (SC_UNLIKELY(d.index() < 0 || d.index() >= device_count()))
    stagecraft::detail::fail<DeviceError>(op, loc, "cannot use ", d.str(), ": ",
                                          device_count() == 0 ? std::string("no CUDA device is available")
                                                              : "only " + std::to_string(device_count()) +
                                                                    " CUDA device(s) are available");
}

/// The stream of CUDA device d (made current), where every kernel and copy of d runs.
inline abi::Stream stream(Device d, std::string_view op, const std::source_location& loc) {
  abi::Stream s = nullptr;
#if defined(STAGECRAFT_WITH_CUDA)
  check(abi::stream(d.index(), &s), d, op, loc);
#else
  require_device(d, op, loc);
#endif
  return s;
}

/// Copies n bytes between two devices, one of them CUDA (both checked by the caller). Host to
/// device returns before the copy ends (staged through pinned memory); device to host waits.
inline void copy(void* dst, Device to, const void* src, Device from, std::size_t n, std::string_view op,
                 const std::source_location& loc) {
#if defined(STAGECRAFT_WITH_CUDA)
  if (to.is_cuda() && from.is_cpu()) check(abi::copy_h2d(to.index(), dst, src, n), to, op, loc);
  else if (to.is_cpu()) check(abi::copy_d2h(from.index(), dst, src, n), from, op, loc);
  else check(abi::copy_d2d(to.index(), dst, from.index(), src, n), to, op, loc);
#else
  (void)dst, (void)src, (void)n, (void)from;
  require_device(to, op, loc);
#endif
}

/// -1: not read yet (STAGECRAFT_CUDA_BATCH), else 0 or 1 (set_eager_batching).
inline std::atomic<int>& eager_batching_flag() {
  static std::atomic<int> flag{-1};
  return flag;
}

/// Queues `op` (n elements, checked here; its geometry `geo` for the kinds that have one) on d's
/// batch of small ops when batching is on and the kernels take it (abi::batch_enqueue); false when
/// the caller must launch it itself.
inline bool enqueue_small(Device d, abi::BatchOp op, std::int64_t n, std::string_view name,
                          const std::source_location& loc, const abi::BatchGeometry* geo = nullptr);

/// Sets the n elements (of dtype dt) at dst on CUDA device d to value, converted on the device:
/// the caller passes a value that dt holds exactly. Returns before the kernel ends.
inline void fill(void* dst, Device d, abi::DT dt, double value, std::int64_t n, std::string_view op,
                 const std::source_location& loc) {
#if defined(STAGECRAFT_WITH_CUDA)
  abi::BatchOp b;
  b.kind = abi::BatchOp::fill;
  b.dt = dt;
  b.y = dst;
  b.value = value;
  if (enqueue_small(d, b, n, op, loc)) return;
  check(abi::fill(dt, value, dst, n, stream(d, op, loc)), d, op, loc);
#else
  (void)dst, (void)dt, (void)value, (void)n;
  require_device(d, op, loc);
#endif
}

/// The op and user line a CUDA allocation is made for (set around eager CUDA kernels and copies),
/// so an out-of-memory error names them although the allocator is called without them.
struct CallSite {
  std::string_view op = "cuda";
  std::source_location loc = std::source_location::current();
};
inline CallSite& call_site() {
  thread_local CallSite site;
  return site;
}
/// RAII: sets the call site for the allocations made while alive.
class ScopedCallSite {
 public:
  ScopedCallSite(std::string_view op, const std::source_location& loc) : saved_(call_site()) {
    call_site() = {op, loc};
  }
  ~ScopedCallSite() { call_site() = saved_; }
  ScopedCallSite(const ScopedCallSite&) = delete;
  ScopedCallSite& operator=(const ScopedCallSite&) = delete;

 private:
  CallSite saved_;
};

}  // namespace detail

/// How conv2d and its two gradients run on a GPU.
enum class ConvAlgorithm {
  cudnn,  ///< cuDNN, where it is loaded and takes the convolution (f32 and f64); else as im2col
  im2col  ///< the im2col / col2im kernels and cuBLAS products, always (the default)
};

namespace detail {
/// The ConvAlgorithm named v ("cudnn" or "im2col"; `source` names where v came from in the error).
inline ConvAlgorithm parse_conv_algorithm(std::string_view v, std::string_view source) {
  if (v == "cudnn") return ConvAlgorithm::cudnn;
  if (v == "im2col") return ConvAlgorithm::im2col;
  throw ValueError("[conv2d] " + std::string(source) + " must be 'cudnn' or 'im2col', got '" + std::string(v) + "'");
}
struct ConvSettings {
  // im2col by default: on an H100 the Fashion-MNIST CNN's Adam step took 1.55 ms eager and 1.11 ms
  // staged that way, 1.93 and 1.72 ms through cuDNN's deterministic direct algorithms (its FFT
  // and Winograd ones, faster, round differently; bench/results/gpu.md)
  std::atomic<int> algorithm{static_cast<int>(ConvAlgorithm::im2col)};
  std::atomic<std::int64_t> cudnn{0}, im2col{0};
  ConvSettings() {
    const char* env = std::getenv("STAGECRAFT_CUDA_CONV");
    if (env != nullptr && *env != 0) algorithm = static_cast<int>(parse_conv_algorithm(env, "STAGECRAFT_CUDA_CONV"));
  }
};
inline ConvSettings& conv_settings() {
  static ConvSettings s;
  return s;
}
}  // namespace detail

/// Chooses how conv2d and its gradients run on GPUs from now on (process-wide). The default is
/// im2col, or what $STAGECRAFT_CUDA_CONV ("cudnn" or "im2col") says; an unknown value there is a
/// ValueError at the first convolution.
inline void set_conv_algorithm(ConvAlgorithm a) { detail::conv_settings().algorithm = static_cast<int>(a); }
inline ConvAlgorithm conv_algorithm() { return static_cast<ConvAlgorithm>(detail::conv_settings().algorithm.load()); }

/// How many GPU convolution passes (conv2d, its input and its kernel gradient) ran through cuDNN
/// and through the im2col kernels, process-wide: counted as eager ops and plan steps queue them
/// (a CUDA graph's replays are not counted again).
struct ConvStats {
  std::int64_t cudnn = 0, im2col = 0;
};
inline ConvStats conv_stats() {
  const detail::ConvSettings& s = detail::conv_settings();
  return {s.cudnn.load(std::memory_order_relaxed), s.im2col.load(std::memory_order_relaxed)};
}
inline void reset_conv_stats() {
  detail::conv_settings().cudnn = 0;
  detail::conv_settings().im2col = 0;
}

namespace detail {
/// "9.19.0" for cuDNN's version number: major * 10000 + minor * 100 + patch since cuDNN 9 (91900),
/// major * 1000 + minor * 100 + patch before (8907 is 8.9.7).
inline std::string cudnn_version_text(int v) {
  const bool old = v < 10000;
  return std::to_string(old ? v / 1000 : v / 10000) + "." + std::to_string(old ? v / 100 % 10 : v / 100 % 100) + "." +
         std::to_string(v % 100);
}
}  // namespace detail

/// The version of the cuDNN library the convolutions use, as cuDNN numbers it (91900 for 9.19.0,
/// 8907 for 8.9.7: detail::cudnn_version_text), loaded on the first call; 0 when there is none
/// (built without CUDA or without cudnn.h, or no libcudnn found at run time: $STAGECRAFT_CUDNN may
/// name the file). Needs no GPU.
inline int cudnn_version() {
#if defined(STAGECRAFT_WITH_CUDA)
  return abi::cudnn_version(nullptr, 0);
#else
  return 0;
#endif
}
/// "cuDNN 9.19.0", or why cuDNN is not used ("cannot load libcudnn.so.9: ...").
inline std::string cudnn_status() {
#if defined(STAGECRAFT_WITH_CUDA)
  char why[256] = {};
  const int v = abi::cudnn_version(why, sizeof why);
  if (v == 0) return why;
  return "cuDNN " + detail::cudnn_version_text(v);
#else
  return "stagecraft was built without CUDA";
#endif
}

/// Whether small eager ops on a GPU (unary and binary elementwise ops, broadcasting too, casts,
/// fills, sums, maxima and minima over one run of neighbouring axes, the copies of slices,
/// transposes and concats, of at most abi::batch_max_elements elements; single products within
/// abi::batch_max_gemm_outputs and abi::batch_max_gemm_work) are queued and launched together, up
/// to abi::batch_max_ops per launch, instead of one launch each: a small op costs its launch (~4.5 us on an H100), the
/// queue a fraction of a microsecond. On by default; STAGECRAFT_CUDA_BATCH=0 turns it off, as
/// set_eager_batching(false) does. Queued ops run in their order before anything else queued on
/// the device after them (a larger op, a copy, a wait, a graph launch) and at flush(): results
/// are the same either way, but an error of a batch's launch is raised by the op that launched it.
inline bool eager_batching() {
  int v = detail::eager_batching_flag().load(std::memory_order_relaxed);
  if (SC_UNLIKELY(v < 0)) {
    const char* e = std::getenv("STAGECRAFT_CUDA_BATCH");
    v = e != nullptr && std::string_view(e) == "0" ? 0 : 1;
    detail::eager_batching_flag().store(v, std::memory_order_relaxed);
  }
  return v != 0;
}
inline void set_eager_batching(bool on) { detail::eager_batching_flag().store(on ? 1 : 0, std::memory_order_relaxed); }

/// Launches the small ops queued on CUDA device `index` now (see eager_batching; a no-op without
/// CUDA devices or when none are queued).
inline void flush(int index = 0, std::source_location loc = std::source_location::current()) {
#if defined(STAGECRAFT_WITH_CUDA)
  if (index < 0 || index >= device_count()) return;
  detail::check(abi::batch_flush(index), Device::cuda(index), "flush", loc);
#else
  (void)index, (void)loc;
#endif
}

/// Small eager ops queued (eager_batching) and the launches that ran them, process-wide.
struct BatchStats {
  std::int64_t ops = 0, launches = 0;
};
inline BatchStats batch_stats() {
#if defined(STAGECRAFT_WITH_CUDA)
  const abi::BatchStats s = abi::batch_stats();
  return {s.ops, s.batches};
#else
  return {};
#endif
}

namespace detail {
inline bool enqueue_small(Device d, abi::BatchOp op, std::int64_t n, std::string_view name,
                          const std::source_location& loc, const abi::BatchGeometry* geo) {
#if defined(STAGECRAFT_WITH_CUDA)
  const std::int64_t most = op.kind == abi::BatchOp::gemm ? abi::batch_max_gemm_outputs : abi::batch_max_elements;
  if (n <= 0 || n > most || !eager_batching()) return false;
  op.n = static_cast<std::int32_t>(n);
  const abi::Status s = abi::batch_enqueue(d.index(), op, geo);
  if (s == abi::not_supported) return false;
  check(s, d, name, loc);
  return true;
#else
  (void)d, (void)op, (void)n, (void)name, (void)loc, (void)geo;
  return false;
#endif
}
}  // namespace detail

/// Waits until every kernel and copy queued on CUDA device `index` has finished; an error of an
/// earlier asynchronous launch is raised here. A no-op without CUDA devices.
inline void synchronize(int index = 0, std::source_location loc = std::source_location::current()) {
#if defined(STAGECRAFT_WITH_CUDA)
  if (index < 0 || index >= device_count()) return;
  detail::check(abi::synchronize(index), Device::cuda(index), "synchronize", loc);
#else
  (void)index, (void)loc;
#endif
}

}  // namespace stagecraft::cuda
