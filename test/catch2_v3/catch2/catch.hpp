// Catch2 v3 under the v2 spelling: on the include path only when CMake finds Catch2 3.x (Ubuntu
// 24.04, Debian 13), so the tests keep `#include <catch2/catch.hpp>` and the v2 names for both
// majors. v3 split the single header into a compiled library, moved every matcher into
// Catch::Matchers (v2 also had them in Catch) and renamed the string `Contains` to
// `ContainsSubstring` (v3's `Matchers::Contains` is the range matcher: a string would be searched
// for an element equal to the argument).
#pragma once
#include <catch2/catch_all.hpp>

#include <string>

#if !defined(STAGECRAFT_CATCH2_MAJOR) || STAGECRAFT_CATCH2_MAJOR < 3
#error "test/catch2_v3 is for Catch2 v3 only: test/CMakeLists.txt puts it on the include path then"
#endif

using Catch::Approx;  // v2 declared Approx in the global namespace

namespace Catch {
/// v2's string matcher Catch::Contains: the message contains `s`.
inline Matchers::StringContainsMatcher Contains(const std::string& s, CaseSensitive cs = CaseSensitive::Yes) {
  return Matchers::ContainsSubstring(s, cs);
}
using Matchers::EndsWith;
using Matchers::MatcherBase;
using Matchers::StartsWith;
}  // namespace Catch
