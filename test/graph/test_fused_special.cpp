// Specialized kernels of fused programs (graph/fused_special.hpp): Adam's update, the one the
// optimizer registers, against the tile evaluator and the eager fused update, bit for bit, in place
// too; programs of another shape keep the evaluator.
#include <catch2/catch.hpp>
#include <stagecraft/core/creation.hpp>
#include <stagecraft/fwd.hpp>
#include <stagecraft/graph/fused_kernel.hpp>
#include <stagecraft/ops/cast.hpp>
#include <stagecraft/ops/unary.hpp>
#include <stagecraft/optim/fused.hpp>

#include <atomic>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace g = sc::graph;
using sc::ops::OpId;

/// Adam's update program over `shape` and dtype d (optim/fused.hpp's pattern, made concrete).
g::FusedProgram adam_over(const sc::Shape& shape, sc::DType d) {
  sc::optim::fused::register_adam_program();  // as Adam's constructor does
  g::FusedProgram p = sc::optim::fused::adam_program();
  p.dtype = d;
  p.out_shape = shape;
  for (sc::Shape& s : p.input_shapes) s = s.rank() == 0 ? sc::Shape{} : shape;
  return p;
}

struct AdamInputs {
  sc::Tensor g, m, v, w, c1, tiny, c2, eps, lr;
  AdamInputs(const sc::Shape& shape, sc::DType d, std::uint64_t seed)
      : g(sc::cast(sc::random::normal(shape, seed), d)),
        m(sc::cast(sc::random::normal(shape, seed + 1), d)),
        v(sc::cast(sc::square(sc::random::normal(shape, seed + 2)), d)),
        w(sc::cast(sc::random::normal(shape, seed + 3), d)),
        c1(sc::cast(sc::scalar(0.1), d)),
        // the smallest normal number, below which the moments are flushed (optim::fused::flush_subnormal)
        tiny(sc::cast(sc::scalar(d == sc::f32 ? double(std::numeric_limits<float>::min()) : std::numeric_limits<double>::min()), d)),
        c2(sc::cast(sc::scalar(0.001), d)),
        eps(sc::cast(sc::scalar(1e-7), d)),
        lr(sc::cast(sc::scalar(0.01), d)) {}
  /// In the fusion pass's order (optim::fused::adam_program).
  std::vector<sc::Tensor> list() const { return {g, m, c1, tiny, v, c2, eps, lr, w}; }
};

std::vector<sc::Tensor> fresh(const sc::Shape& shape, sc::DType d) {
  return {sc::zeros(shape, d), sc::zeros(shape, d), sc::zeros(shape, d)};
}

/// Runs p prepared with specializations on or off; returns the outputs as doubles.
std::vector<std::vector<double>> run(const g::FusedProgram& p, const std::vector<sc::Tensor>& in,
                                     std::vector<sc::Tensor> out, bool special) {
  g::fused_specializations() = special;
  const g::PreparedFused pf = g::prepare(p);
  g::fused_specializations() = true;
  CHECK((pf.special != nullptr) == special);
  g::run(pf, in, out);
  std::vector<std::vector<double>> r;
  for (const sc::Tensor& t : out) r.push_back(t.to_vector<double>());
  return r;
}

}  // namespace

TEMPLATE_TEST_CASE("fused special: Adam's update program runs its kernel, the evaluator's bits, in place too",
                   "[fused][special]", float, double) {
  const sc::DType d = sc::dtype_of<TestType>();
  for (const sc::Shape& shape : {sc::Shape{37, 29}, sc::Shape{5}, sc::Shape{4096}}) {  // SIMD tails, threads
    const g::FusedProgram p = adam_over(shape, d);
    const g::SpecialKernel* k = g::find_special(p);
    REQUIRE(k != nullptr);
    CHECK(std::string(k->name) == "adam");
    const AdamInputs a(shape, d, 10);
    const auto evaluated = run(p, a.list(), fresh(shape, d), false);
    const auto special = run(p, a.list(), fresh(shape, d), true);
    CHECK(special == evaluated);

    // The eager fused update (what opt.apply runs eagerly) gives the same bits.
    sc::Variable w(a.w, "w"), m(a.m, "m"), v(a.v, "v");
    sc::optim::fused::adam(a.g, w, m, v, a.lr, 0.1, 0.001, 1e-7);
    CHECK(m.value().to_vector<double>() == special[0]);
    CHECK(v.value().to_vector<double>() == special[1]);
    CHECK(w.value().to_vector<double>() == special[2]);

    // In place: m written over g's buffer, v over v's, w over w's.
    const AdamInputs b(shape, d, 10);
    const auto in_place = run(p, b.list(), {b.g, b.v, b.w}, true);
    CHECK(in_place == special);
  }
}

TEST_CASE("fused special: programs of another shape stay in the tile evaluator", "[fused][special]") {
  const sc::Shape shape{16, 8};
  const g::FusedProgram p = adam_over(shape, sc::f32);
  REQUIRE(g::find_special(p) != nullptr);
  auto differs = [](g::FusedProgram q) { return g::find_special(q) == nullptr; };
  g::FusedProgram q = p;
  q.input_shapes[1] = sc::Shape{8};  // m broadcast over the rows
  CHECK(differs(q));
  q = p;
  q.input_shapes[2] = shape;  // 1 - beta1 per element
  CHECK(differs(q));
  q = p;
  q.code.back().op = OpId::Add;  // w + step
  CHECK(differs(q));
  q = p;
  q.code[20] = {OpId::Div, 27, 28};  // operands swapped
  CHECK(differs(q));
  q = p;
  q.outputs = {25, 30};  // m not written out
  CHECK(differs(q));
  q = p;
  q.reduction = g::FusedReduction{OpId::Sum, 30, 8, sc::Shape{16}};
  CHECK(differs(q));
  q = p;
  q.dtype = sc::i32;
  CHECK(differs(q));
  g::fused_specializations() = false;
  CHECK(differs(p));
  g::fused_specializations() = true;
}

TEST_CASE("fused special: a name registers once, from any thread, and a kernel keeps its address",
          "[fused][special]") {
  sc::optim::fused::register_adam_program();
  const g::FusedProgram adam = adam_over(sc::Shape{8}, sc::f32);
  const g::SpecialKernel* k = g::find_special(adam);
  REQUIRE(k != nullptr);
  CHECK_FALSE(g::register_special({"adam", g::FusedProgram{}, nullptr}));  // the first stays

  // Programs of input n negated five times, registered by 8 threads at once (16 names, each
  // twice). Their kernel is right, should another test of this binary make such a program.
  auto neg = [](int n) {
    g::FusedProgram p;
    p.input_shapes = std::vector<sc::Shape>(static_cast<std::size_t>(n) + 1, sc::Shape{1});
    p.code = {{OpId::Neg, n, -1}};
    for (int i = 1; i < 5; ++i) p.code.push_back({OpId::Neg, n + i, -1});
    p.outputs = {n + 5};
    return p;
  };
  auto run_neg = +[](std::span<const sc::Tensor> in, std::span<sc::Tensor> out) {
    const sc::Tensor& x = in.back();
    for (std::int64_t i = 0; i < x.numel(); ++i)
      if (x.dtype() == sc::f32)
        static_cast<float*>(out[0].raw_data())[i] = -static_cast<const float*>(x.raw_data())[i];
      else
        static_cast<double*>(out[0].raw_data())[i] = -static_cast<const double*>(x.raw_data())[i];
  };
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v;
    for (int i = 0; i < 16; ++i) v.push_back("test_neg_" + std::to_string(i));
    return v;
  }();
  std::atomic<int> added{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 16; ++i) {
        const int n = (i + 2 * t) % 16;
        if (g::register_special({names[static_cast<std::size_t>(n)].c_str(), neg(n), run_neg})) ++added;
      }
    });
  for (std::thread& th : threads) th.join();
  CHECK(added == 16);
  CHECK(g::find_special(adam) == k);  // not moved by the 16 registrations after it
  g::FusedProgram p = neg(3);
  p.dtype = sc::f32;
  p.out_shape = sc::Shape{8};
  for (sc::Shape& s : p.input_shapes) s = sc::Shape{8};
  const g::SpecialKernel* n3 = g::find_special(p);
  REQUIRE(n3 != nullptr);
  CHECK(std::string(n3->name) == "test_neg_3");
}
