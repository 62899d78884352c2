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

#include <string>
#include <vector>

namespace {

namespace g = sc::graph;
using sc::ops::OpId;

/// Adam's update program over `shape` and dtype d (optim/fused.hpp's pattern, made concrete).
g::FusedProgram adam_over(const sc::Shape& shape, sc::DType d) {
  g::FusedProgram p = sc::optim::fused::adam_program();
  p.dtype = d;
  p.out_shape = shape;
  for (sc::Shape& s : p.input_shapes) s = s.rank() == 0 ? sc::Shape{} : shape;
  return p;
}

struct AdamInputs {
  sc::Tensor g, m, v, w, c1, c2, eps, lr;
  AdamInputs(const sc::Shape& shape, sc::DType d, std::uint64_t seed)
      : g(sc::cast(sc::random::normal(shape, seed), d)),
        m(sc::cast(sc::random::normal(shape, seed + 1), d)),
        v(sc::cast(sc::square(sc::random::normal(shape, seed + 2)), d)),
        w(sc::cast(sc::random::normal(shape, seed + 3), d)),
        c1(sc::cast(sc::scalar(0.1), d)),
        c2(sc::cast(sc::scalar(0.001), d)),
        eps(sc::cast(sc::scalar(1e-7), d)),
        lr(sc::cast(sc::scalar(0.01), d)) {}
  /// In the fusion pass's order (optim::fused::adam_program).
  std::vector<sc::Tensor> list() const { return {g, m, c1, v, c2, eps, lr, w}; }
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
  q.code[10] = {OpId::Div, 16, 17};  // operands swapped
  CHECK(differs(q));
  q = p;
  q.outputs = {10, 19};  // m not written out
  CHECK(differs(q));
  q = p;
  q.reduction = g::FusedReduction{OpId::Sum, 19, 8, sc::Shape{16}};
  CHECK(differs(q));
  q = p;
  q.dtype = sc::i32;
  CHECK(differs(q));
  g::fused_specializations() = false;
  CHECK(differs(p));
  g::fused_specializations() = true;
}
