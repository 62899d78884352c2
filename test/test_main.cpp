// The one Catch2 main, compiled once and linked into every test executable. Catch2 v2 generates it
// from its single header; v3 is a compiled library whose Session is declared in its own header.
#if STAGECRAFT_CATCH2_MAJOR >= 3
#include <catch2/catch_session.hpp>
#else
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#endif

#include <cstdlib>

#include <stagecraft/backend/cpu/parallel.hpp>

int main(int argc, char* argv[]) {
  // The tests' tensors are small: split loops as finely as their grains allow, so that the
  // threaded paths run (the library's default gives each thread 64 times more work), unless
  // STAGECRAFT_GRAIN_SCALE says otherwise.
  if (std::getenv("STAGECRAFT_GRAIN_SCALE") == nullptr) stagecraft::set_parallel_grain_scale(1);
  return Catch::Session().run(argc, argv);
}
