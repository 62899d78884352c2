// Package-test consumer: includes the umbrella header and runs a little of each layer: an eager
// op, a traced function (the graph layer: tracing, passes, fusion, the plan), a safetensors round
// trip and a saved function (the JSON reader and writer). Built header-only (consumer) and against
// the installed stagecraft::precompiled (consumer_precompiled), where the graph layer and the JSON
// code are only declared by the headers and must come from the archive.
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <unistd.h>

#include <stagecraft/stagecraft.hpp>

#if defined(STAGECRAFT_PRECOMPILED) && defined(NLOHMANN_JSON_VERSION_MAJOR)
#error "the umbrella header parsed <nlohmann/json.hpp> in a file built against stagecraft::precompiled"
#endif

namespace {

int fail(const char* what) {
  std::fprintf(stderr, "stagecraft consumer: %s\n", what);
  return 1;
}

}  // namespace

int main() {
  const sc::Tensor a = sc::tensor({{1.f, 2.f, 3.f}, {4.f, 5.f, 6.f}});
  const sc::Tensor b = sc::tensor({10.f, 20.f, 30.f});
  const sc::Tensor c = a + b;  // broadcasts [2,3] + [3]
  const std::vector<float> want{11.f, 22.f, 33.f, 14.f, 25.f, 36.f};
  if (c.dtype() != sc::f32 || c.shape() != sc::Shape{2, 3} || c.to_vector<float>() != want)
    return fail("wrong result for a + b");

  // Traced: (a + b) * 2 - 1 is one fused group; the same numbers as eager.
  auto f = sc::function([](sc::Tensor x, sc::Tensor y) { return (x + y) * 2.f - 1.f; });
  const std::vector<float> staged = f(a, b).to_vector<float>();
  for (std::size_t i = 0; i < want.size(); ++i)
    if (staged[i] != want[i] * 2.f - 1.f) return fail("wrong result for the traced function");

  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("stagecraft_consumer_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  struct Cleanup {
    std::filesystem::path d;
    ~Cleanup() { std::filesystem::remove_all(d); }
  } cleanup{dir};

  // safetensors: written and read back, with its metadata.
  sc::save_safetensors(dir / "t.safetensors", {{"c", c}}, {{"who", "consumer"}});
  const sc::SafetensorsFile back = sc::load_safetensors(dir / "t.safetensors");
  if (back.metadata.at("who") != "consumer" || back.tensors.at("c").to_vector<float>() != want)
    return fail("the safetensors round trip changed the data");

  // A saved function, loaded and run.
  f.get_concrete(a, b).save((dir / "f").string());
  const sc::Tensor loaded_out = sc::load_function((dir / "f").string())(a, b);
  const std::vector<float> loaded = loaded_out.to_vector<float>();
  if (loaded != staged) return fail("the saved function gives other numbers");

  std::puts("stagecraft consumer: ok");
  return 0;
}
