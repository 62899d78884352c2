// Wall time of an eager one-element add (`a + b`, a fresh result each time), on the CPU and, in a
// build with CUDA, on cuda:0 (batched, the default, and a launch per add): 7 rounds of n adds,
// median and best round per add. Against the CUDA
// emulator (kernels/emulator, which runs each kernel inline on the host) the GPU row is the
// library's host-side work for a GPU op (dispatch, the result's allocation, the launch call) plus
// the emulator's own, so it bounds what the headers add to a real GPU launch. Without Google
// Benchmark, one command (a line; against the emulator after `cmake --build --preset emu`):
//   g++ -std=c++20 -O2 -DNDEBUG -fopenmp -DSTAGECRAFT_WITH_CUDA=1 -Iinclude
//       -I/usr/include/x86_64-linux-gnu/openblas-openmp bench/time_small_op.cpp
//       build/emu/libstagecraft_cuda.a -lopenblas -lz -ldl -pthread
//   ./a.out [n=1000000]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include <stagecraft/stagecraft.hpp>

namespace {

/// Median and best of 7 rounds of n adds on device d, in microseconds per add.
void time_adds(sc::Device d, long n, const char* what = "") {
  const sc::Tensor a = sc::full({1}, 1.f).to(d), b = sc::full({1}, 2.f).to(d);
  std::vector<double> us;
  for (int r = 0; r < 7; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    for (long i = 0; i < n; ++i) {
      const sc::Tensor c = a + b;
      (void)c;
    }
    if (d.is_cuda()) sc::cuda::synchronize();
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / n);
  }
  std::sort(us.begin(), us.end());
  std::printf("one-element add on %s%s: %.3f us (best %.3f)\n", d.str().c_str(), what, us[3], us[0]);
}

}  // namespace

int main(int argc, char** argv) {
  const long n = argc > 1 ? std::atol(argv[1]) : 1000000;
  sc::set_num_threads(1);
  time_adds(sc::Device::cpu(), n);
  if (sc::cuda::is_available()) {
    time_adds(sc::Device::cuda(0), n, ", batched launches (the default)");
    sc::cuda::set_eager_batching(false);
    time_adds(sc::Device::cuda(0), n, ", a launch each");
  }
  else std::printf("no CUDA device (build against the emulator or run where a GPU is)\n");
  return 0;
}
