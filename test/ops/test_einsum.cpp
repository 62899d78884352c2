// einsum against a plain loop over every assignment of the labels (written here), across
// contractions, batches, transposes, diagonals, traces, chains of three, broadcasting, '...' and
// implicit outputs, in every numeric dtype; gradients by central differences, traced equal to
// eager, and errors.
#include <catch2/catch.hpp>
#include <stagecraft/stagecraft.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "testing.hpp"

using sctest::error_of;

namespace {

/// The einsum of xs by definition: for every assignment of the labels (letters, "->" explicit),
/// the output entry gets the product of the operands' entries (a label's extent is the largest
/// among its axes; an extent of 1 broadcasts).
std::vector<double> by_loops(const std::string& eq, const std::vector<sc::Tensor>& xs, std::vector<std::int64_t>& out_shape) {
  const std::size_t arrow = eq.find("->");
  std::vector<std::string> terms;
  std::string cur;
  for (const char c : eq.substr(0, arrow)) {
    if (c == ',') {
      terms.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  terms.push_back(cur);
  const std::string out = eq.substr(arrow + 2);
  std::map<char, std::int64_t> size;
  std::vector<std::vector<double>> vals;
  for (std::size_t k = 0; k < xs.size(); ++k) {
    vals.push_back(xs[k].to_vector<double>());
    for (std::size_t a = 0; a < terms[k].size(); ++a)
      size[terms[k][a]] = std::max(size[terms[k][a]], xs[k].shape()[static_cast<int>(a)]);
  }
  std::vector<char> labels;
  for (const auto& [l, n] : size) labels.push_back(l);
  out_shape.clear();
  std::int64_t out_n = 1;
  for (const char l : out) {
    out_shape.push_back(size[l]);
    out_n *= size[l];
  }
  std::vector<double> y(static_cast<std::size_t>(out_n), 0.0);
  std::map<char, std::int64_t> at;
  bool empty = false;
  for (const char l : labels) {
    at[l] = 0;
    empty = empty || size[l] == 0;
  }
  while (!empty) {
    double prod = 1;
    for (std::size_t k = 0; k < xs.size(); ++k) {
      std::int64_t off = 0;
      for (std::size_t a = 0; a < terms[k].size(); ++a) {
        const std::int64_t e = xs[k].shape()[static_cast<int>(a)];
        off = off * e + (e == 1 ? 0 : at[terms[k][a]]);
      }
      prod *= vals[k][static_cast<std::size_t>(off)];
    }
    std::int64_t o = 0;
    for (const char l : out) o = o * size[l] + at[l];
    y[static_cast<std::size_t>(o)] += prod;
    std::size_t d = 0;  // the next assignment, like an odometer
    for (; d < labels.size(); ++d) {
      if (++at[labels[d]] < size[labels[d]]) break;
      at[labels[d]] = 0;
    }
    if (d == labels.size()) break;
  }
  return y;
}

sc::Tensor values(sc::Shape s, sc::DType d, std::uint64_t seed) {
  const sc::Tensor x = sctest::uniform_tensor(s, seed, -2.0, 2.0);
  return sc::is_floating(d) ? x.astype(d) : (x * 2).astype(d);
}

void check_against_loops(const std::string& eq, const std::vector<sc::Tensor>& xs, double tol) {
  std::vector<std::int64_t> shape;
  const std::vector<double> want = by_loops(eq, xs, shape);
  const sc::Tensor got = sc::einsum(eq, xs);
  CHECK(got.shape() == sc::Shape(shape.begin(), shape.end()));
  const std::vector<double> g = got.to_vector<double>();
  REQUIRE(g.size() == want.size());
  for (std::size_t i = 0; i < g.size(); ++i) {
    INFO("element " << i);
    CHECK(g[i] == Approx(want[i]).margin(tol).epsilon(tol));
  }
}

struct Case {
  std::string eq;
  std::vector<sc::Shape> shapes;
};
const std::vector<Case> cases = {
    {"ij,jk->ik", {{3, 4}, {4, 5}}},
    {"ij,kj->ik", {{3, 4}, {5, 4}}},                      // b transposed (a flag)
    {"ji,jk->ik", {{4, 3}, {4, 5}}},                      // a transposed (a flag)
    {"ji,kj->ki", {{4, 3}, {5, 4}}},                      // the output's order differs
    {"bij,bjk->bik", {{2, 3, 4}, {2, 4, 5}}},
    {"bij,bkj->bki", {{2, 3, 4}, {2, 5, 4}}},
    {"bhqd,bhkd->bhqk", {{2, 2, 3, 4}, {2, 2, 5, 4}}},  // attention scores
    {"bhqk,bhkd->bqhd", {{2, 2, 3, 5}, {2, 2, 5, 4}}},
    {"i,i->", {{6}, {6}}},
    {"i,j->ij", {{3}, {4}}},
    {"bi,bi->b", {{3, 5}, {3, 5}}},
    {"ij,ij->ij", {{3, 4}, {3, 4}}},
    {"ijk,jil->kl", {{2, 3, 4}, {3, 2, 5}}},
    {"ij,jk,kl->il", {{2, 3}, {3, 4}, {4, 5}}},
    {"ab,bc,ca->", {{3, 4}, {4, 5}, {5, 3}}},
    {"i,i,i->i", {{5}, {5}, {5}}},
    {"ij,k->ijk", {{2, 3}, {4}}},
    {"ij,jk->", {{3, 4}, {4, 5}}},
    {"ij->ji", {{3, 4}}},
    {"ij->", {{3, 4}}},
    {"ijk->kj", {{2, 3, 4}}},
    {"ii->i", {{4, 4}}},
    {"ii->", {{4, 4}}},
    {"iji->j", {{3, 5, 3}}},
    {"aab,bc->ac", {{3, 3, 4}, {4, 2}}},
    {"bij,bjk->bik", {{1, 3, 4}, {5, 4, 2}}},  // b broadcast from 1
    {"ij,jk->ik", {{3, 1}, {4, 5}}},            // j broadcast from 1
    {"ij,jk->ik", {{0, 4}, {4, 5}}},            // empty
    {"ij,jk->ik", {{3, 0}, {0, 5}}},            // an empty contraction: zeros
};

}  // namespace

TEST_CASE("einsum equals a loop over the labels, in every numeric dtype", "[einsum]") {
  for (const sc::DType d : {sc::f32, sc::f64, sc::i32, sc::i64})
    for (std::size_t c = 0; c < cases.size(); ++c) {
      INFO(sc::name(d) << " '" << cases[c].eq << "'");
      std::vector<sc::Tensor> xs;
      for (std::size_t k = 0; k < cases[c].shapes.size(); ++k) xs.push_back(values(cases[c].shapes[k], d, 10 * c + k));
      check_against_loops(cases[c].eq, xs, d == sc::f32 ? 1e-5 : 1e-12);
      CHECK(sc::einsum(cases[c].eq, xs).dtype() == d);
    }
}

TEST_CASE("einsum: '...', implicit outputs and the one-by-one form", "[einsum]") {
  const sc::Tensor a = values({2, 3, 4}, sc::f64, 1), b = values({2, 4, 5}, sc::f64, 2);
  const std::vector<double> bmm = sc::einsum("bij,bjk->bik", {a, b}).to_vector<double>();
  CHECK(sc::einsum("...ij,...jk->...ik", a, b).to_vector<double>() == bmm);
  CHECK(sc::einsum("...ij,...jk", a, b).to_vector<double>() == bmm);  // implicit: '...' first, then i, k
  CHECK(sc::einsum(" b i j , b j k -> b i k ", a, b).to_vector<double>() == bmm);
  // '...' right-aligned and broadcast: [2, 1, 3, 4] x [5, 4, 6] -> [2, 5, 3, 6]
  const sc::Tensor c = values({2, 1, 3, 4}, sc::f64, 3), d = values({5, 4, 6}, sc::f64, 4);
  const sc::Tensor e = sc::einsum("...ij,...jk->...ik", c, d);
  CHECK(e.shape() == sc::Shape{2, 5, 3, 6});
  CHECK(e.to_vector<double>() == sc::matmul(c, d).to_vector<double>());
  CHECK(sc::einsum("...i->...", c).to_vector<double>() == sc::sum(c, {-1}).to_vector<double>());
  CHECK(sc::einsum("i...->...", c).shape() == sc::Shape{1, 3, 4});
  CHECK(sc::einsum("...ij->ij", c).to_vector<double>() == sc::sum(c, {0, 1}).to_vector<double>());  // '...' summed
  // implicit outputs: labels seen once, alphabetically (capitals first)
  const sc::Tensor m = values({3, 4}, sc::f64, 5);
  CHECK(sc::einsum("ba", m).to_vector<double>() == sc::transpose(m).to_vector<double>());
  CHECK(sc::einsum("ij,jk", m, values({4, 2}, sc::f64, 6)).shape() == sc::Shape{3, 2});
  CHECK(sc::einsum("Ba", m).shape() == sc::Shape{3, 4});
  const sc::Tensor sq = values({4, 4}, sc::f64, 7);
  double trace = 0;
  for (int i = 0; i < 4; ++i) trace += sq.to_vector<double>()[static_cast<std::size_t>(i * 5)];
  CHECK(sc::einsum("ii", sq).item<double>() == Approx(trace).epsilon(1e-14));
  // mixed dtypes promote as matmul does
  CHECK(sc::einsum("ij,jk->ik", m.astype(sc::f32), values({4, 2}, sc::i32, 8)).dtype() == sc::f32);
}

TEST_CASE("einsum: gradients by central differences, traced equal to eager", "[einsum][grad]") {
  for (const Case& c : {Case{"ij,jk->ik", {{3, 4}, {4, 2}}}, Case{"ji,kj->ki", {{4, 3}, {2, 4}}},
                        Case{"bhqd,bhkd->bhqk", {{2, 2, 3, 4}, {2, 2, 2, 4}}}, Case{"ab,bc,ca->", {{2, 3}, {3, 4}, {4, 2}}},
                        Case{"iji->j", {{3, 2, 3}}}, Case{"aab,bc->ac", {{3, 3, 2}, {2, 4}}},
                        Case{"bij,bjk->bik", {{1, 3, 2}, {3, 2, 2}}}, Case{"ijk->kj", {{2, 3, 2}}}}) {
    INFO("'" << c.eq << "'");
    std::vector<sc::Tensor> xs;
    for (std::size_t k = 0; k < c.shapes.size(); ++k) xs.push_back(values(c.shapes[k], sc::f64, 40 + k));
    const auto f = [&](const std::vector<sc::Tensor>& in) { return sc::einsum(c.eq, in); };
    const auto r = sc::check_gradients(f, xs);
    INFO(r.report);
    CHECK(r.ok);
    auto traced = sc::function([&](const std::vector<sc::Tensor>& in) { return sc::einsum(c.eq, in); });
    CHECK(traced(xs).to_vector<double>() == f(xs).to_vector<double>());
  }
}

TEST_CASE("einsum: errors name einsum, the equation, the shapes and the user's line", "[einsum][errors]") {
  const sc::Tensor a = sc::ones({2, 3}), b = sc::ones({4, 5});
  int line = __LINE__ + 1;
  std::string msg = error_of<sc::ShapeError>([&] { (void)sc::einsum("ij,jk->ik", a, b); });
  CHECK_THAT(msg, Catch::Contains("[einsum]") && Catch::Contains("'ij,jk->ik'") && Catch::Contains("label 'j'") &&
                      Catch::Contains("[2, 3], [4, 5]") && Catch::Contains("test_einsum.cpp:" + std::to_string(line)));
  line = __LINE__ + 1;
  msg = error_of<sc::ShapeError>([&] { (void)sc::einsum("ijk->i", {a}); });
  CHECK_THAT(msg, Catch::Contains("[einsum]") && Catch::Contains("rank 2") &&
                      Catch::Contains("test_einsum.cpp:" + std::to_string(line)));
  msg = error_of<sc::ValueError>([&] { (void)sc::einsum("ij,jk->ik", a); });
  CHECK_THAT(msg, Catch::Contains("[einsum]") && Catch::Contains("2 input terms for 1 operands"));
  msg = error_of<sc::ValueError>([&] { (void)sc::einsum("i1->i", a); });
  CHECK_THAT(msg, Catch::Contains("'1' is not a label"));
  msg = error_of<sc::ValueError>([&] { (void)sc::einsum("ij->k", a); });
  CHECK_THAT(msg, Catch::Contains("output label 'k' is in no input term"));
  msg = error_of<sc::ValueError>([&] { (void)sc::einsum("ij->ii", a); });
  CHECK_THAT(msg, Catch::Contains("output label 'i' twice"));
  msg = error_of<sc::ValueError>([&] { (void)sc::einsum("...i...->i", a); });
  CHECK_THAT(msg, Catch::Contains("'...' twice"));
  msg = error_of<sc::ValueError>([&] { (void)sc::einsum("ij->i->j", a); });
  CHECK_THAT(msg, Catch::Contains("'->' twice"));
  msg = error_of<sc::DTypeError>([&] { (void)sc::einsum("i->", sc::tensor({true, false})); });
  CHECK_THAT(msg, Catch::Contains("[einsum]") && Catch::Contains("bool"));
  msg = error_of<sc::ValueError>([&] { (void)sc::einsum("->", std::vector<sc::Tensor>{}); });
  CHECK_THAT(msg, Catch::Contains("at least one operand"));
}
