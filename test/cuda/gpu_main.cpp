// Catch2 main of the GPU tests: without a CUDA device each test exits with SC_SKIP_RETURN_CODE (77;
// 4 with Catch2 v3, whose test discovery sets that), which CTest reports as skipped, after saying
// why. Listing the tests needs no device.
#if STAGECRAFT_CATCH2_MAJOR >= 3
#include <catch2/catch_session.hpp>
#else
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#endif
#include <stagecraft/backend/cuda/runtime.hpp>

#include <iostream>

int main(int argc, char* argv[]) {
  Catch::Session session;
  if (const int rc = session.applyCommandLine(argc, argv)) return rc;
  const Catch::ConfigData& c = session.configData();
#if STAGECRAFT_CATCH2_MAJOR >= 3
  const bool listing = c.listTests || c.listTags || c.listReporters;  // v3 has no --list-test-names-only
#else
  const bool listing = c.listTests || c.listTestNamesOnly || c.listTags || c.listReporters;
#endif
  if (!listing && !stagecraft::cuda::is_available()) {
    std::cout << "SKIPPED: no CUDA device (" << (stagecraft::cuda::built ? "none found" : "built without CUDA")
              << "); these tests run on a machine with a GPU\n";
    return SC_SKIP_RETURN_CODE;
  }
  return session.run();
}
