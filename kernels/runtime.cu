// The runtime side of the ABI: device count, one non-blocking stream per device, stream-ordered
// memory, and copies (host to device staged through pinned buffers so the host does not wait).
#include <atomic>
#include <cstring>
#include <mutex>
#include <vector>

#include "batch_elements.cuh"
#include "batch_queue.hpp"
#include "common.cuh"

namespace stagecraft::cuda::kernels {
namespace {

constexpr int max_devices = 64;

/// A pinned host buffer and the event that marks the end of the last copy out of it.
struct Pinned {
  void* p = nullptr;
  std::size_t bytes = 0;
  cudaEvent_t done = nullptr;
};
/// Copies above this size go straight from pageable memory (the driver stages them itself).
constexpr std::size_t max_staged = std::size_t{16} << 20;

struct DeviceState {
  std::mutex mu;
  std::atomic<cudaStream_t> stream{nullptr};  // made on first use (under mu), then only read
  std::vector<Pinned> pinned;  // host-to-device staging buffers, reused once their copy ended
  abi::Fault* fault = nullptr;    // the fault record kernels write (device memory)
  abi::Fault* fault_host = nullptr;  // pinned: where a check copies the record (null: a pageable copy)
  abi::Fault found;               // what the last check read from it, until take_fault
  std::atomic<bool> armed{false};  // a kernel that can fault ran since the last check
  batch::Queue queued;             // small eager ops not yet launched (batch_enqueue)
};
DeviceState& state(int device) {
  static DeviceState states[max_devices];
  return states[device];
}

Status check_device(int device) {
  return device < 0 || device >= max_devices ? cudaErrorInvalidDevice : cudaSuccess;
}

/// This thread's capture: the device it captures on (-1: none), its capture stream, and whether
/// a launch that can write the fault record was recorded.
thread_local int capture_device = -1;
thread_local cudaStream_t capture_stream = nullptr;
thread_local bool capture_armed = false;

/// This thread's streams for capturing, per device: where it records a graph (capture_begin) and,
/// by depth - 1, the bodies of conditional nodes. Per thread, so that two threads capture at once
/// (a capture stream shared by the device's threads fails the second one's capture, or spoils the
/// first's).
struct CaptureStreams {
  cudaStream_t graph[max_devices] = {};
  std::vector<cudaStream_t> bodies[max_devices];
  CaptureStreams() = default;
  CaptureStreams(const CaptureStreams&) = delete;
  CaptureStreams& operator=(const CaptureStreams&) = delete;
  ~CaptureStreams() {  // at thread exit (failures ignored: the runtime may be going away)
    for (int d = 0; d < max_devices; ++d) {
      if (graph[d]) cudaStreamDestroy(graph[d]);
      for (cudaStream_t s : bodies[d]) cudaStreamDestroy(s);
    }
  }
};
CaptureStreams& capture_streams() {
  thread_local CaptureStreams streams;
  return streams;
}

/// A free staging buffer of at least n bytes (allocated when none is free); the caller holds mu.
Status staging(DeviceState& d, std::size_t n, Pinned** out) {
  for (Pinned& b : d.pinned) {
    if (b.bytes < n) continue;
    const cudaError_t q = cudaEventQuery(b.done);
    if (q == cudaSuccess) {
      *out = &b;
      return cudaSuccess;
    }
    // A copy still in flight (cudaErrorNotReady; or an event recorded while capturing): the buffer
    // is not taken. The runtime keeps that status as the thread's last error, which the next
    // launch's check (launched()) would report as its own failure ("device not ready" from the
    // first kernel after two quick uploads); a sticky error is not cleared by this.
    cudaGetLastError();
  }
  std::size_t bytes = 4096;
  while (bytes < n) bytes *= 2;
  Pinned b;
  b.bytes = bytes;
  if (const auto e = cudaMallocHost(&b.p, bytes)) return e;
  if (const auto e = cudaEventCreateWithFlags(&b.done, cudaEventDisableTiming)) {
    cudaFreeHost(b.p);
    return e;
  }
  d.pinned.push_back(b);
  *out = &d.pinned.back();
  return cudaSuccess;
}

}  // namespace

void arm_fault_check() {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= max_devices) return;
  if (device == capture_device) capture_armed = true;  // recorded, not run: the graph's launches arm it
  else state(device).armed.store(true);
}

void arm_fault_check(int device) {
  if (device >= 0 && device < max_devices) state(device).armed.store(true);
}

/// Makes `device` current where it is not (every eager launch asks: reading the current device is
/// cheaper than setting it; read each time, so a caller's own cudaSetDevice in between is seen).
Status make_current(int device) {
  int current = -1;
  if (cudaGetDevice(&current) == cudaSuccess && current == device) return cudaSuccess;
  return cudaSetDevice(device);
}

namespace {

/// main_stream without launching the queued ops: for the launch of a batch itself, and for
/// allocations (new memory is used by no queued op).
Status own_stream(int device, cudaStream_t* out) {
  if (const Status e = check_device(device)) return e;
  if (const auto e = make_current(device)) return e;
  DeviceState& d = state(device);
  cudaStream_t s = d.stream.load(std::memory_order_acquire);  // (no lock once made: one per launch)
  if (s == nullptr) {
    const std::lock_guard<std::mutex> lock(d.mu);
    s = d.stream.load(std::memory_order_relaxed);
    if (s == nullptr) {
      if (const auto e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)) return e;
      d.stream.store(s, std::memory_order_release);
    }
  }
  *out = s;
  return cudaSuccess;
}

/// What launches a batch of the queue of `device`: batch.cu's kernel on its own stream.
struct LaunchOn {
  int device;
  Status operator()(const abi::BatchSlot* slots, int n) const {
    cudaStream_t s = nullptr;
    if (const Status e = own_stream(device, &s)) return e;
    return launch_batch(slots, n, s);
  }
};

/// Launches the ops queued on device, if any (its stream made current).
Status flush_queued(int device) { return batch::flush(state(device).queued, LaunchOn{device}); }

}  // namespace

Status main_stream(int device, cudaStream_t* out) {
  if (const Status e = own_stream(device, out)) return e;
  return flush_queued(device);
}

cudaStream_t capture_stream_of(int device) { return device >= 0 && device == capture_device ? capture_stream : nullptr; }

void redirect_capture(cudaStream_t s) {
  if (capture_device >= 0) capture_stream = s;
}

Status body_stream(int device, int depth, cudaStream_t* out) {
  if (const Status e = check_device(device)) return e;
  if (depth < 1) return cudaErrorInvalidValue;
  std::vector<cudaStream_t>& bodies = capture_streams().bodies[device];
  while (bodies.size() < static_cast<std::size_t>(depth)) {
    if (const auto e = cudaSetDevice(device)) return e;
    cudaStream_t s = nullptr;
    if (const auto e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)) return e;
    bodies.push_back(s);
  }
  *out = bodies[depth - 1];
  return cudaSuccess;
}

namespace {

/// Queues work() (the caller's own, such as a copy to the host, which may itself wait for the
/// stream), then waits for the stream of `device`. When a kernel that can write the fault record
/// ran since the last check, the record is read in the same wait (its copy into a pinned slot
/// queued before work(): one round trip to the GPU, not two), cleared if set, and device_fault
/// returned then.
template <class Work>
Status wait_checking_faults(int device, cudaStream_t st, Work&& work) {
  DeviceState& d = state(device);
  if (!d.armed.exchange(false)) {
    if (const auto e = work()) return e;
    return cudaStreamSynchronize(st);
  }
  const std::lock_guard<std::mutex> lock(d.mu);
  abi::Fault f;
  if (!d.fault) {  // (armed by a kernel given no record: nothing to read)
    if (const auto e = work()) return e;
    return cudaStreamSynchronize(st);
  }
  if (d.fault_host) {
    if (const auto e = cudaMemcpyAsync(d.fault_host, d.fault, sizeof f, cudaMemcpyDeviceToHost, st)) return e;
    if (const auto e = work()) return e;
    if (const auto e = cudaStreamSynchronize(st)) return e;
    f = *d.fault_host;
  } else {
    if (const auto e = work()) return e;
    if (const auto e = cudaMemcpyAsync(&f, d.fault, sizeof f, cudaMemcpyDeviceToHost, st)) return e;
    if (const auto e = cudaStreamSynchronize(st)) return e;
  }
  if (f.tag == 0) return cudaSuccess;
  if (const auto e = cudaMemsetAsync(d.fault, 0, sizeof f, st)) return e;
  if (d.found.tag == 0) d.found = f;  // an untaken earlier fault stays the one reported
  return abi::device_fault;
}

}  // namespace
}  // namespace stagecraft::cuda::kernels

namespace stagecraft::cuda::abi {
using namespace stagecraft::cuda::kernels;

int device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // no driver or no device: not an error to keep
    return 0;
  }
  return n;
}

const char* error_string(Status s) noexcept { return cudaGetErrorString(static_cast<cudaError_t>(s)); }

bool is_out_of_memory(Status s) noexcept { return s == cudaErrorMemoryAllocation; }

Status stream(int device, Stream* out) noexcept {
  if (device >= 0 && device == capture_device) {
    if (const auto e = make_current(device)) return e;
    *out = capture_stream;
    return cudaSuccess;
  }
  cudaStream_t s = nullptr;
  if (const Status e = main_stream(device, &s)) return e;
  *out = s;
  return cudaSuccess;
}

Status capture_begin(int device) noexcept {
  if (capture_device >= 0) return cudaErrorStreamCaptureUnsupported;  // one capture per thread
  cudaStream_t own = nullptr;  // made first (and the device made current): the graph launches there
  if (const Status e = main_stream(device, &own)) return e;
  cudaStream_t& cap = capture_streams().graph[device];
  if (!cap)
    if (const auto e = cudaStreamCreateWithFlags(&cap, cudaStreamNonBlocking)) return e;
  // Relaxed: other threads go on using the device (their launches are not on this stream), and
  // the allocator may take memory ordered on the main stream meanwhile.
  if (const auto e = cudaStreamBeginCapture(cap, cudaStreamCaptureModeRelaxed)) return e;
  capture_device = device;
  capture_stream = cap;
  capture_armed = false;
  return cudaSuccess;
}

Status capture_end(int device, GraphBody* body, bool* armed) noexcept {
  *body = nullptr;
  *armed = false;
  if (device != capture_device) return cudaErrorStreamCaptureUnmatched;
  cudaGraph_t g = nullptr;
  const auto e = cudaStreamEndCapture(capture_stream, &g);
  capture_device = -1;
  capture_stream = nullptr;
  *armed = capture_armed;
  capture_armed = false;
  if (e != cudaSuccess || g == nullptr) {
    if (g) cudaGraphDestroy(g);
    cudaGetLastError();  // a spoilt capture is not an error of later launches
    return e != cudaSuccess ? e : cudaErrorStreamCaptureInvalidated;
  }
  *body = g;
  return cudaSuccess;
}

Status synchronize(int device) noexcept {
  Stream s = nullptr;
  if (const Status e = stream(device, &s)) return e;
  return wait_checking_faults(device, static_cast<cudaStream_t>(s), [] { return cudaSuccess; });
}

Status fault_record(int device, Fault** out) noexcept {
  cudaStream_t s = nullptr;
  if (const Status e = main_stream(device, &s)) return e;
  DeviceState& d = state(device);
  {
    const std::lock_guard<std::mutex> lock(d.mu);
    if (!d.fault) {
      void* p = nullptr;
      if (const auto e = cudaMalloc(&p, sizeof(Fault))) return e;
      if (const auto e = cudaMemsetAsync(p, 0, sizeof(Fault), s)) {
        cudaFree(p);
        return e;
      }
      d.fault = static_cast<Fault*>(p);
      void* h = nullptr;  // (without it, checks copy the record to pageable memory: two round trips)
      if (cudaMallocHost(&h, sizeof(Fault)) == cudaSuccess) d.fault_host = static_cast<Fault*>(h);
      else cudaGetLastError();
    }
    *out = d.fault;
  }
  return cudaSuccess;
}

Status take_fault(int device, Fault* out) noexcept {
  if (const Status e = check_device(device)) return e;
  DeviceState& d = state(device);
  const std::lock_guard<std::mutex> lock(d.mu);
  *out = d.found;
  d.found = Fault{};
  return cudaSuccess;
}

Status last_error() noexcept { return cudaGetLastError(); }

// Memory is always ordered on the main stream, also while this thread captures: a block handed to
// a capture is then valid whenever the graph runs (on the main stream, after the allocation).
Status malloc_async(int device, std::size_t n, void** p) noexcept {
  cudaStream_t s = nullptr;
  if (const Status e = own_stream(device, &s)) return e;
  const auto e = cudaMallocAsync(p, n, s);
  if (e == cudaErrorMemoryAllocation) cudaGetLastError();  // not sticky: the caller retries
  return e;
}

Status free_async(int device, void* p) noexcept {
  cudaStream_t s = nullptr;
  if (const Status e = main_stream(device, &s)) return e;
  return cudaFreeAsync(p, s);
}

Status trim_pool(int device) noexcept {
  if (const Status e = synchronize(device)) return e;
  cudaMemPool_t pool = nullptr;
  if (const auto e = cudaDeviceGetDefaultMemPool(&pool, device)) return e;
  return cudaMemPoolTrimTo(pool, 0);
}

Status copy_h2d(int device, void* dst, const void* src, std::size_t n) noexcept {
  if (n == 0) return cudaSuccess;
  Stream s = nullptr;
  if (const Status e = stream(device, &s)) return e;
  const auto st = static_cast<cudaStream_t>(s);
  if (n > max_staged) return cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, st);
  DeviceState& d = state(device);
  const std::lock_guard<std::mutex> lock(d.mu);
  Pinned* b = nullptr;
  if (const Status e = staging(d, n, &b)) return e;
  std::memcpy(b->p, src, n);
  if (const auto e = cudaMemcpyAsync(dst, b->p, n, cudaMemcpyHostToDevice, st)) return e;
  return cudaEventRecord(b->done, st);
}

Status copy_d2h(int device, void* dst, const void* src, std::size_t n) noexcept {
  if (n == 0) return cudaSuccess;
  Stream s = nullptr;
  if (const Status e = stream(device, &s)) return e;
  const auto st = static_cast<cudaStream_t>(s);
  return wait_checking_faults(device, st, [&] { return cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, st); });
}

Status copy_d2d(int dst_device, void* dst, int src_device, const void* src, std::size_t n) noexcept {
  if (n == 0) return cudaSuccess;
  if (src_device != dst_device) {  // the source's pending work must finish before the peer copy reads it
    if (const Status e = synchronize(src_device)) return e;
  }
  Stream s = nullptr;
  if (const Status e = stream(dst_device, &s)) return e;
  const auto st = static_cast<cudaStream_t>(s);
  if (src_device == dst_device) return cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, st);
  return cudaMemcpyPeerAsync(dst, dst_device, src, src_device, n, st);
}

Status batch_enqueue(int device, const BatchOp& op, const BatchGeometry* geo) noexcept {
  if (const Status e = check_device(device)) return e;
  if (device == capture_device || !batch::takes_op(op, geo)) return cudaErrorNotSupported;
  return batch::push(state(device).queued, op, geo, LaunchOn{device});
}

Status batch_flush(int device) noexcept {
  if (const Status e = check_device(device)) return e;
  return flush_queued(device);
}

BatchStats batch_stats() noexcept { return batch::stats(); }

}  // namespace stagecraft::cuda::abi
