// Fuzz target: the safetensors reader (state/safetensors.hpp), through its public API only, then
// every tensor it returns.
#include <cstdint>

#include <stagecraft/stagecraft.hpp>
#include <stagecraft/state/safetensors.hpp>

#include "harness.hpp"

namespace sc = stagecraft;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path = scfuzz::scratch_file(data, size, ".safetensors");
  scfuzz::expect_only_ioerror("load_safetensors", [&] {
    const sc::SafetensorsFile f = sc::load_safetensors(path);
    std::uint64_t bytes = 0;
    for (const auto& [name, t] : f.tensors) {
      scfuzz::check(t.device() == sc::Device::cpu(), "a tensor not on the CPU");
      scfuzz::check(t.nbytes() == static_cast<std::size_t>(t.numel()) * sc::itemsize(t.dtype()), "nbytes != numel");
      bytes += t.nbytes();
      (void)sc::sum(t.astype(sc::f64)).item<double>();  // reads every element (bools must be 0 or 1)
    }
    scfuzz::check(bytes <= size, "the tensors hold more bytes than the file");
  });
  return 0;
}
