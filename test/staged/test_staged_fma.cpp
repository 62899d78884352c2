// sc::compile's fused loop gives eager's bits even where the compiler contracts a product and a
// sum into one fused multiply-add: this file is built with -mfma, where GCC contracts by default,
// so one op's product and the next op's sum would fuse unless the loop rounds each op's result
// where eager does (staged/expr.hpp, rounded()). Before that, 19% of the elements of a f64
// x * y + z differed in the last bit. Also built with -fno-delete-null-pointer-checks, under which
// GCC compares no two variables' addresses in a constant expression (the shared sub-expression
// search once did: staged/cse.hpp).
#include <catch2/catch.hpp>
#include <stagecraft/stagecraft.hpp>

#include <cstddef>
#include <vector>

#include "testing.hpp"

namespace {

template <class F>
void same_bits(const F& f, const char* what, sc::DType d) {
  const sc::Tensor x = sc::random::uniform({4099}, -2.0, 2.0, 1, d), y = sc::random::uniform({4099}, -2.0, 2.0, 2, d),
                   z = sc::random::uniform({4099}, -2.0, 2.0, 3, d);
  const sc::Tensor eager = f(x, y, z), fused = sc::compile(f)(x, y, z);
  const std::vector<double> e = eager.to_vector<double>(), s = fused.to_vector<double>();
  std::size_t differ = 0;
  for (std::size_t i = 0; i < e.size(); ++i) differ += e[i] != s[i];
  INFO(what << " in " << sc::name(d) << ": " << differ << " of " << e.size() << " elements differ");
  CHECK(differ == 0);
}

}  // namespace

TEST_CASE("sc::compile: the fused loop gives eager's bits where the compiler would contract into FMAs",
          "[staged][fma]") {
#if defined(__FMA__) && (defined(__x86_64__) || defined(__i386__))
  if (!__builtin_cpu_supports("fma")) {
    WARN("this CPU has no FMA: nothing to check");
    return;
  }
#endif
  for (const sc::DType d : {sc::f32, sc::f64}) {
    same_bits([](auto x, auto y, auto z) { return x * y + z; }, "x * y + z", d);
    same_bits([](auto x, auto y, auto z) { return z - x * y; }, "z - x * y", d);
    same_bits([](auto x, auto y, auto z) { return sc::square(x) - y * z; }, "square(x) - y * z", d);
    same_bits([](auto x, auto y, auto) { return x * 3.f + y * 0.5f; }, "weak scalars", d);
    same_bits([](auto x, auto y, auto z) { return sc::tanh(x * y + z) * x - z / (1 + sc::exp(-x)); }, "a chain", d);
    same_bits([](auto x, auto y, auto z) { return sc::tanh(x * y) * sc::tanh(x * y) + z / sc::exp(x); }, "shared tanh", d);
  }
}

TEST_CASE("sc::function: fused chains give eager's bits where the compiler would contract into FMAs", "[staged][fma]") {
  // A traced program's chains (graph/fused_chain.hpp) keep the running value in registers from one
  // op to the next: each link's result is pinned, so no product and sum fuse into one FMA. (GCC 12
  // contracts within a basic block only and each link is a case of its own in a switch, so today
  // these pass without the pin too: they guard the links' code against a change that would put two
  // ops in one block, such as chains specialized to straight-line code.)
#if defined(__FMA__) && (defined(__x86_64__) || defined(__i386__))
  if (!__builtin_cpu_supports("fma")) {
    WARN("this CPU has no FMA: nothing to check");
    return;
  }
#endif
  const auto traced = [](auto f) {
    return [f](const sc::Tensor& x, const sc::Tensor& y, const sc::Tensor& z) {
      return sc::function([f](const sc::Tensor& a, const sc::Tensor& b, const sc::Tensor& c) { return f(a, b, c); })(x, y, z);
    };
  };
  for (const sc::DType d : {sc::f32, sc::f64}) {
    const sc::Tensor x = sc::random::uniform({4099}, -2.0, 2.0, 1, d), y = sc::random::uniform({4099}, -2.0, 2.0, 2, d),
                     z = sc::random::uniform({4099}, -2.0, 2.0, 3, d);
    const auto check = [&](auto f, const char* what) {
      const std::vector<double> e = f(x, y, z).template to_vector<double>(), s = traced(f)(x, y, z).template to_vector<double>();
      std::size_t differ = 0;
      for (std::size_t i = 0; i < e.size(); ++i) differ += e[i] != s[i];
      INFO(what << " in " << sc::name(d) << ": " << differ << " of " << e.size() << " elements differ");
      CHECK(differ == 0);
    };
    check([](const sc::Tensor& a, const sc::Tensor& b, const sc::Tensor& c) { return a * b + c; }, "x * y + z");
    check([](const sc::Tensor& a, const sc::Tensor& b, const sc::Tensor& c) { return c - a * b; }, "z - x * y");
    check([](const sc::Tensor& a, const sc::Tensor&, const sc::Tensor& c) { return a * 3.f + 0.5f - c; }, "weak scalars");
    check([](const sc::Tensor& a, const sc::Tensor& b, const sc::Tensor&) { return sc::sum(a * b + 1.f); }, "a sum");
  }
}
