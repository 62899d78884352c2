// Fuzz target: the .npy reader (io/npy.hpp), from memory and from a file: both must agree.
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

#include <stagecraft/io/npy.hpp>
#include <stagecraft/stagecraft.hpp>

#include "harness.hpp"

namespace sc = stagecraft;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  std::optional<sc::Tensor> from_memory, from_file;
  scfuzz::expect_only_ioerror("from_npy_bytes", [&] { from_memory = sc::io::from_npy_bytes(bytes, "fuzz input"); });
  const std::string path = scfuzz::scratch_file(data, size, ".npy");
  scfuzz::expect_only_ioerror("load_npy", [&] { from_file = sc::io::load_npy(path); });
  scfuzz::check(from_memory.has_value() == from_file.has_value(), "from_npy_bytes and load_npy disagree on validity");
  if (!from_memory) return 0;
  const sc::Tensor& a = *from_memory;
  const sc::Tensor& b = *from_file;
  scfuzz::check(a.shape() == b.shape() && a.dtype() == b.dtype() && a.nbytes() == b.nbytes(),
                "from_npy_bytes and load_npy disagree on shape or dtype");
  scfuzz::check(a.nbytes() == 0 || std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0,
                "from_npy_bytes and load_npy disagree on the data");
  scfuzz::check(a.nbytes() <= size, "the tensor holds more bytes than the file");
  (void)sc::sum(a.astype(sc::f64)).item<double>();  // reads every element
  // what we read we write back as NumPy would, and read again to the same tensor
  const sc::Tensor c = sc::io::from_npy_bytes(sc::io::to_npy_bytes(a), "round trip");
  scfuzz::check(c.shape() == a.shape() && c.dtype() == a.dtype() &&
                    (a.nbytes() == 0 || std::memcmp(a.raw_data(), c.raw_data(), a.nbytes()) == 0),
                "to_npy_bytes does not round-trip a tensor from_npy_bytes read");
  return 0;
}
