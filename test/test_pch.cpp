// The owner of the tests' precompiled header (test/CMakeLists.txt: stagecraft_test_pch); the
// header itself is the umbrella and Catch2, which CMake includes ahead of this file.
namespace stagecraft_test_pch {}
