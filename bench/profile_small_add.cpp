// A driver for `valgrind --tool=callgrind`: argv[1] (default 100000) one-element adds and as
// many tensor + scalar adds, nothing else, so the profile is the eager hot path alone.
#include <cstdio>
#include <cstdlib>

#include <stagecraft/stagecraft.hpp>

namespace sc = stagecraft;

int main(int argc, char** argv) {
  const long n = argc > 1 ? std::atol(argv[1]) : 100000;
  const sc::Tensor a = sc::ones({1}), b = sc::ones({1});
  float acc = 0.f;
  for (long i = 0; i < n; ++i) {
    const sc::Tensor c = a + b;
    const sc::Tensor d = c + 1.f;
    acc += *static_cast<const float*>(d.raw_data());
  }
  std::printf("%g\n", static_cast<double>(acc));
  return 0;
}
