// The one Catch2 main, compiled once and linked into every test executable. Catch2 v2 generates it
// from its single header; v3 is a compiled library whose Session is declared in its own header.
#if STAGECRAFT_CATCH2_MAJOR >= 3
#include <catch2/catch_session.hpp>
#else
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#endif

int main(int argc, char* argv[]) { return Catch::Session().run(argc, argv); }
