// Catch2 main of the GPU tests: without a CUDA device each test exits with code 77, which CTest
// reports as skipped (SKIP_RETURN_CODE), after saying why. Listing the tests needs no device.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <stagecraft/backend/cuda/runtime.hpp>

#include <iostream>

int main(int argc, char* argv[]) {
  Catch::Session session;
  if (const int rc = session.applyCommandLine(argc, argv)) return rc;
  const Catch::ConfigData& c = session.configData();
  const bool listing = c.listTests || c.listTestNamesOnly || c.listTags || c.listReporters;
  if (!listing && !stagecraft::cuda::is_available()) {
    std::cout << "SKIPPED: no CUDA device (" << (stagecraft::cuda::built ? "none found" : "built without CUDA")
              << "); these tests run on a machine with a GPU\n";
    return 77;
  }
  return session.run();
}
