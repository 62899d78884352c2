// sc::Module: path names and registration order over nested modules, every registration
// error, shared and owned members, and copy/move being compile errors.
#include <catch2/catch.hpp>
#include <stagecraft/stagecraft.hpp>
#include <stagecraft/nn/layers.hpp>
#include <stagecraft/state/module.hpp>

#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "testing.hpp"

namespace {

using sctest::error_of;

std::string at_line(int line) { return "test_module.cpp:" + std::to_string(line); }

std::vector<std::string> names_of(const sc::Module& m) {
  std::vector<std::string> out;
  for (const auto& [n, v] : m.named_variables()) out.push_back(n);
  return out;
}

struct Encoder : sc::Module {
  sc::nn::Dense l1{4, 8}, l2{8, 3};
  Encoder() { add({{"l1", l1}, {"l2", l2}}); }
};

struct Model : sc::Module {
  Encoder encoder;
  sc::nn::Dense head{3, 2};
  sc::Variable scale{sc::ones({1}), "scale"};
  sc::Variable steps{sc::zeros({}, sc::i64), "steps", /*trainable=*/false};
  Model() {
    add("encoder", encoder);
    add("steps", steps);  // non-trainable, registered before the others on purpose
    add("head", head);
    add("scale", scale);
  }
};

}  // namespace

TEST_CASE("module: nested path names in registration order", "[module]") {
  Model m;
  const std::vector<std::string> want{"encoder/l1/kernel", "encoder/l1/bias", "encoder/l2/kernel", "encoder/l2/bias",
                                      "steps",             "head/kernel",     "head/bias",         "scale"};
  CHECK(names_of(m) == want);
  const auto named = m.named_variables();
  CHECK(named[0].second.same(m.encoder.l1.kernel));
  CHECK(named[3].second.same(m.encoder.l2.bias));
  CHECK(named[4].second.same(m.steps));
  CHECK(named[7].second.same(m.scale));
  CHECK(named[0].second.shape() == sc::Shape{4, 8});

  const auto all = m.variables();
  REQUIRE(all.size() == 8);
  for (std::size_t i = 0; i < all.size(); ++i) CHECK(all[i].same(named[i].second));

  const auto tr = m.trainable_variables();
  REQUIRE(tr.size() == 7);  // "steps" is not trainable
  CHECK(tr[3].same(m.encoder.l2.bias));
  CHECK(tr[4].same(m.head.kernel));
  CHECK(tr[6].same(m.scale));
  CHECK(m.num_parameters() == 4 * 8 + 8 + 8 * 3 + 3 + 3 * 2 + 2 + 1 + 1);
  CHECK(m.num_parameters(/*trainable_only=*/true) == m.num_parameters() - 1);

  // The order is the registration order, not alphabetical, and the same on every call.
  sc::Module z;
  sc::Variable b(sc::ones({2}), "b"), a(sc::ones({3}), "a");
  z.add("zeta", b);
  z.add("alpha", a);
  CHECK(names_of(z) == std::vector<std::string>{"zeta", "alpha"});
  CHECK(names_of(m) == names_of(m));
}

TEST_CASE("module: layers are modules with kernel and bias", "[module]") {
  sc::nn::Dense d(2, 3, 1);
  CHECK(names_of(d) == std::vector<std::string>{"kernel", "bias"});
  sc::nn::Conv2D c(1, 2, 3, 1, 0, 1);
  CHECK(names_of(c) == std::vector<std::string>{"kernel", "bias"});
  sc::nn::LSTMCell l(2, 3, 1);
  CHECK(names_of(l) == std::vector<std::string>{"kernel", "recurrent_kernel", "bias"});
  CHECK(d.kernel.name() == "kernel");
}

TEST_CASE("module: members are read by reference", "[module]") {
  struct Holder : sc::Module {
    sc::Variable w;  // registered while still empty, given a value later
    int line = 0;
    Holder() { line = __LINE__; add("w", w); }
  } h;
  const std::string msg = error_of<sc::ValueError>([&] { (void)h.named_variables(); });
  // The error names the add() call that registered the empty variable.
  CHECK_THAT(msg, Catch::Contains("[Module]") && Catch::Contains("'w'") && Catch::Contains("empty") &&
                      Catch::Contains(at_line(h.line)));
  h.w = sc::Variable(sc::full({2}, 3.f), "w");
  const auto vs = h.variables();
  REQUIRE(vs.size() == 1);
  CHECK(vs[0].same(h.w));
  h.w = sc::Variable(sc::full({5}, 1.f), "w2");  // a reassigned member is seen on the next walk
  CHECK(h.variables()[0].shape() == sc::Shape{5});
}

TEST_CASE("module: a shared layer is listed once, under its first path", "[module]") {
  sc::nn::Dense shared(2, 2, 7);
  sc::Module m;
  sc::Module inner;
  inner.add("s", shared);
  m.add("first", shared);
  m.add("inner", inner);
  CHECK(names_of(m) == std::vector<std::string>{"first/kernel", "first/bias"});
  CHECK(m.trainable_variables().size() == 2);
}

TEST_CASE("module: owned variables and sub-modules", "[module]") {
  sc::Module m;
  sc::Variable& s = m.add("scale", sc::Variable(sc::ones({3}), "scale"));
  auto& l = m.emplace<sc::nn::Dense>("proj", 3, 2, std::uint64_t{5});
  CHECK(l.out_features() == 2);
  CHECK(names_of(m) == std::vector<std::string>{"scale", "proj/kernel", "proj/bias"});
  const auto vs = m.variables();
  CHECK(vs[0].same(s));
  CHECK(vs[1].same(l.kernel));
  // Many owned members: the kept references stay valid as the storage grows.
  for (int i = 0; i < 40; ++i) m.add("v" + std::to_string(i), sc::Variable(sc::full({1}, float(i)), "v"));
  CHECK(s.shape() == sc::Shape{3});
  CHECK(m.variables().size() == 43);
  CHECK(m.variables()[42].value().item<float>() == 39.f);
}

TEST_CASE("module: registration errors", "[module][errors]") {
  sc::Module m;
  sc::nn::Dense d(2, 2, 1);
  sc::Variable v(sc::ones({1}), "v");
  m.add("l1", d);

  int line = __LINE__ + 1;
  std::string msg = error_of<sc::ValueError>([&] { m.add("l1", v); });
  CHECK_THAT(msg, Catch::Contains("[Module::add]") && Catch::Contains("'l1'") &&
                      Catch::Contains("already registered") && Catch::Contains(at_line(line)));

  line = __LINE__ + 1;
  msg = error_of<sc::ValueError>([&] { m.add({{"x", v}, {"x", d}}); });
  CHECK_THAT(msg, Catch::Contains("'x'") && Catch::Contains("already registered") && Catch::Contains(at_line(line)));

  line = __LINE__ + 1;
  msg = error_of<sc::ValueError>([&] { m.add("", v); });
  CHECK_THAT(msg, Catch::Contains("[Module::add]") && Catch::Contains("empty") && Catch::Contains(at_line(line)));

  line = __LINE__ + 1;
  msg = error_of<sc::ValueError>([&] { m.add("a/b", v); });
  CHECK_THAT(msg, Catch::Contains("'a/b'") && Catch::Contains("'/'") && Catch::Contains(at_line(line)));

  line = __LINE__ + 1;
  msg = error_of<sc::ValueError>([&] { m.add("me", m); });
  CHECK_THAT(msg, Catch::Contains("cannot contain itself") && Catch::Contains(at_line(line)));

  line = __LINE__ + 1;
  msg = error_of<sc::ValueError>([&] { m.emplace<sc::nn::Dense>("l1", 2, 2); });
  CHECK_THAT(msg, Catch::Contains("already registered") && Catch::Contains(at_line(line)));  // was module.hpp's
  line = __LINE__ + 1;
  msg = error_of<sc::ValueError>([&] { m.emplace<sc::nn::Dense>(std::string("p/q"), 2, 2); });
  CHECK_THAT(msg, Catch::Contains("'p/q'") && Catch::Contains(at_line(line)));

  // A layer's own constructor error named module.hpp (its defaulted line is inside emplace).
  const std::size_t vars = m.named_variables().size();
  line = __LINE__ + 1;
  msg = error_of<sc::ValueError>([&] { m.emplace<sc::nn::Dense>("bad", 0, 2); });
  CHECK_THAT(msg, Catch::Contains("[Dense]") && Catch::Contains(at_line(line)));
  line = __LINE__ + 1;
  msg = error_of<sc::ValueError>([&] { m.emplace<sc::nn::Conv2D>("badc", 1, 2, 3, /*stride=*/0); });
  CHECK_THAT(msg, Catch::Contains("[Conv2D]") && Catch::Contains(at_line(line)));
  CHECK(m.named_variables().size() == vars);  // nothing was registered
  m.emplace<sc::nn::Dense>("bad", 1, 2);      // and the name is free

  // A cycle through two modules is found when walking, naming the add() that closed it.
  sc::Module a, b;
  a.add("b", b);
  line = __LINE__ + 1;
  b.add("a", a);
  msg = error_of<sc::ValueError>([&] { (void)a.named_variables(); });
  CHECK_THAT(msg, Catch::Contains("'b/a'") && Catch::Contains("cycle") && Catch::Contains(at_line(line)));
}

TEST_CASE("module: add(a, b) inside a module's methods is still the tensor op", "[module]") {
  struct Residual : sc::Module {
    sc::nn::Dense l{2, 2, std::uint64_t{3}};
    Residual() { add("l", l); }
    sc::Tensor operator()(const sc::Tensor& x) const { return add(add(l(x), x), 1.f); }
  } r;
  const sc::Tensor x = sc::tensor({{1.f, 2.f}});
  const auto want = sc::add(sc::add(r.l(x), x), 1.f).to_vector<float>();
  CHECK(r(x).to_vector<float>() == want);
  CHECK(sc::Module::add(2.f, x).to_vector<float>() == std::vector<float>{3.f, 4.f});
}

TEST_CASE("module: copying or moving is a compile error", "[module]") {
  STATIC_REQUIRE(!std::is_copy_constructible_v<sc::Module>);
  STATIC_REQUIRE(!std::is_move_constructible_v<sc::Module>);
  STATIC_REQUIRE(!std::is_copy_assignable_v<Model>);
  STATIC_REQUIRE(!std::is_copy_constructible_v<Model>);
  STATIC_REQUIRE(!std::is_move_constructible_v<sc::nn::Dense>);
  // Guaranteed elision still lets a factory return a module by value.
  const auto make = [] { return Encoder(); };
  const Encoder e = make();
  CHECK(e.trainable_variables().size() == 4);
}

TEST_CASE("module: a model built twice after manual_seed gets identical weights", "[module][seed]") {
  sc::manual_seed(0);
  Model a;
  sc::manual_seed(0);
  Model b;
  Model c;  // no reseed: the stream has moved on
  const auto va = a.variables(), vb = b.variables(), vc = c.variables();
  REQUIRE(va.size() == vb.size());
  bool any_differs = false;
  for (std::size_t i = 0; i < va.size(); ++i) {
    CHECK(va[i].value().to_vector<double>() == vb[i].value().to_vector<double>());
    any_differs = any_differs || va[i].value().to_vector<double>() != vc[i].value().to_vector<double>();
  }
  CHECK(any_differs);
  // Layers of one model draw different seeds.
  CHECK(a.encoder.l1.kernel.value().to_vector<float>() != a.encoder.l2.kernel.value().to_vector<float>());
  sc::manual_seed(1);
  Model d;
  CHECK(d.encoder.l1.kernel.value().to_vector<float>() != a.encoder.l1.kernel.value().to_vector<float>());
}
