// SGD (plain, momentum, Nesterov) and Adam against hand-computed updates, slot naming and
// the restore-by-name workflow, the step as tensor ops on the counter and learning-rate
// variables (what a traced step needs), tiny regressions trained to low loss, every error path.
#include <catch2/catch.hpp>
#include <stagecraft/stagecraft.hpp>
#include <stagecraft/nn/layers.hpp>
#include <stagecraft/optim/adam.hpp>
#include <stagecraft/optim/sgd.hpp>
#include <stagecraft/state/module.hpp>

#include "files.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <array>
#include <limits>
#include <cmath>
#include <filesystem>
#include <map>
#include <string>
#include <type_traits>
#include <vector>

#include <unistd.h>

#include "testing.hpp"

namespace {

using sctest::check_close;
using sctest::error_of;

std::string at_line(int line) { return "test_optim.cpp:" + std::to_string(line); }

using Vec = std::vector<double>;

/// The gradient of step t (1-based) for a variable of n elements: varied signs and sizes.
Vec grad_at(int t, std::size_t n, double salt) {
  Vec g(n);
  for (std::size_t i = 0; i < n; ++i) g[i] = std::sin(1.3 * double(i + 1) * t + salt) * (1.0 + 0.5 * double(i));
  return g;
}

/// TensorFlow's SGD, by loops: velocity = mu*velocity - lr*g; w += velocity (or the Nesterov
/// form w += mu*velocity - lr*g); plain w -= lr*g when mu = 0.
void sgd_reference(Vec& w, Vec& vel, const Vec& g, double lr, double mu, bool nesterov) {
  for (std::size_t i = 0; i < w.size(); ++i) {
    if (mu == 0) {
      w[i] -= lr * g[i];
      continue;
    }
    vel[i] = mu * vel[i] - lr * g[i];
    w[i] += nesterov ? mu * vel[i] - lr * g[i] : vel[i];
  }
}

/// Adam as in the paper (Algorithm 1, with the bias correction folded into the step size
/// and eps added to sqrt(v) — TensorFlow's "epsilon hat"), by loops.
void adam_reference(Vec& w, Vec& m, Vec& v, const Vec& g, int t, double lr, double b1, double b2, double eps) {
  const double lr_t = lr * std::sqrt(1 - std::pow(b2, t)) / (1 - std::pow(b1, t));
  for (std::size_t i = 0; i < w.size(); ++i) {
    m[i] = b1 * m[i] + (1 - b1) * g[i];
    v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
    w[i] -= lr_t * m[i] / (std::sqrt(v[i]) + eps);
  }
}

/// Two variables (a matrix and a vector) and their reference copies.
struct Problem {
  sc::Variable w, b;
  Vec rw, rb;
  explicit Problem(sc::DType dt)
      : w(sc::tensor(Vec{0.5, -1.0, 2.0, 0.25, 0.0, -3.0}, sc::Shape{2, 3}).astype(dt), "w"),
        b(sc::tensor(Vec{0.1, -0.2, 0.3}).astype(dt), "b"),
        rw{0.5, -1.0, 2.0, 0.25, 0.0, -3.0},
        rb{0.1, -0.2, 0.3} {}
  std::vector<sc::Tensor> grads(int t) const {
    return {sc::tensor(grad_at(t, 6, 0.0), sc::Shape{2, 3}).astype(w.dtype()),
            sc::tensor(grad_at(t, 3, 1.0)).astype(b.dtype())};
  }
};

struct Tiny : sc::Module {
  sc::nn::Dense l1, l2;
  explicit Tiny(std::uint64_t seed) : l1(3, 4, seed), l2(4, 2, seed + 1) { add({{"l1", l1}, {"l2", l2}}); }
};

/// f32 gradients for each of vs at step t.
std::vector<sc::Tensor> grads_for(const std::vector<sc::Variable>& vs, int t) {
  std::vector<sc::Tensor> g;
  for (std::size_t i = 0; i < vs.size(); ++i)
    g.push_back(sc::tensor(grad_at(t, std::size_t(vs[i].numel()), double(i)), vs[i].shape()).astype(sc::f32));
  return g;
}

/// Adam with its per-step rate visible: step_size() is lr_t of the step `iterations` holds.
struct ProbeAdam : sc::optim::Adam {
  using sc::optim::Adam::Adam;
  double lr_t() { return step_size(std::source_location::current()).item<double>(); }
};

using sctest::TempDir;

}  // namespace

TEST_CASE("SGD: plain, momentum and Nesterov updates match hand-computed values", "[optim][sgd]") {
  struct Cfg { double lr, mu; bool nesterov; };
  for (const Cfg c : {Cfg{0.1, 0.0, false}, Cfg{0.05, 0.9, false}, Cfg{0.05, 0.9, true}, Cfg{0.2, 0.5, true}})
    for (sc::DType dt : {sc::f32, sc::f64}) {
      INFO("lr " << c.lr << " momentum " << c.mu << " nesterov " << c.nesterov << " " << sc::name(dt));
      const double tol = dt == sc::f32 ? 2e-6 : 1e-13;
      Problem p(dt);
      sc::optim::SGD opt(c.lr, c.mu, c.nesterov);
      CHECK(opt.iterations() == 0);
      Vec vw(6, 0.0), vb(3, 0.0);
      for (int t = 1; t <= 3; ++t) {
        opt.apply(p.grads(t), {p.w, p.b});
        sgd_reference(p.rw, vw, grad_at(t, 6, 0.0), c.lr, c.mu, c.nesterov);
        sgd_reference(p.rb, vb, grad_at(t, 3, 1.0), c.lr, c.mu, c.nesterov);
        check_close(p.w.value().to_vector<double>(), p.rw, tol);
        check_close(p.b.value().to_vector<double>(), p.rb, tol);
        CHECK(p.w.dtype() == dt);
        CHECK(opt.iterations() == t);
      }
      const auto named = opt.named_variables();
      if (c.mu == 0) {
        REQUIRE(named.size() == 1);  // no slots without momentum
      } else {
        REQUIRE(named.size() == 3);
        CHECK(named[1].first == "velocity/0:w");
        CHECK(named[2].first == "velocity/1:b");
        check_close(opt.slot(p.w, "velocity").value().to_vector<double>(), vw, tol);
        check_close(named[2].second.value().to_vector<double>(), vb, tol);
        CHECK(!named[1].second.trainable());
      }
      CHECK(named[0].first == "iterations");
      CHECK(named[0].second.dtype() == sc::i64);
      CHECK(named[0].second.value().item<std::int64_t>() == 3);
    }
}

TEST_CASE("Adam: updates with bias correction match hand-computed values", "[optim][adam]") {
  struct Cfg { double lr, b1, b2, eps; };
  for (const Cfg c : {Cfg{1e-3, 0.9, 0.999, 1e-7}, Cfg{0.1, 0.8, 0.99, 1e-3}, Cfg{0.05, 0.0, 0.5, 0.0}})
    for (sc::DType dt : {sc::f32, sc::f64}) {
      INFO("lr " << c.lr << " beta1 " << c.b1 << " beta2 " << c.b2 << " eps " << c.eps << " " << sc::name(dt));
      const double tol = dt == sc::f32 ? 2e-6 : 1e-12;
      Problem p(dt);
      sc::optim::Adam opt(c.lr, c.b1, c.b2, c.eps);
      Vec mw(6, 0.0), vw(6, 0.0), mb(3, 0.0), vb(3, 0.0);
      for (int t = 1; t <= 3; ++t) {
        opt.apply(p.grads(t), {p.w, p.b});
        adam_reference(p.rw, mw, vw, grad_at(t, 6, 0.0), t, c.lr, c.b1, c.b2, c.eps);
        adam_reference(p.rb, mb, vb, grad_at(t, 3, 1.0), t, c.lr, c.b1, c.b2, c.eps);
        check_close(p.w.value().to_vector<double>(), p.rw, tol);
        check_close(p.b.value().to_vector<double>(), p.rb, tol);
      }
      check_close(opt.slot(p.w, "m").value().to_vector<double>(), mw, tol);
      check_close(opt.slot(p.w, "v").value().to_vector<double>(), vw, tol);
      check_close(opt.slot(p.b, "m").value().to_vector<double>(), mb, tol);
      check_close(opt.slot(p.b, "v").value().to_vector<double>(), vb, tol);
      std::vector<std::string> names;
      for (const auto& [n, v] : opt.named_variables()) names.push_back(n);
      CHECK(names == std::vector<std::string>{"iterations", "m/0:w", "v/0:w", "m/1:b", "v/1:b"});
    }
  // The defaults are the contract's: Adam(lr = 1e-3), TensorFlow's betas and epsilon.
  sc::optim::Adam d;
  CHECK(d.learning_rate() == 1e-3);
  CHECK(d.beta1() == 0.9);
  CHECK(d.beta2() == 0.999);
  CHECK(d.epsilon() == 1e-7);
  sc::optim::SGD s(0.5);
  CHECK(s.momentum() == 0);
  CHECK(!s.nesterov());
}

namespace {

/// Runs `steps` steps of a fresh optimizer made by make() on a copy of `init`, with gradients
/// grad_at(t), and returns the variable's values: fused (eager default), composite (fused
/// updates off) or traced (the step inside sc::function, where only ops may run).
enum class Path { fused, composite, traced };
template <class MakeOpt>
Vec run_steps(MakeOpt make, const sc::Tensor& init, int steps, Path path) {
  sc::Variable w(init, "w");
  auto opt = make();
  opt.build({w});
  const bool was = sc::optim::fused::enabled;
  sc::optim::fused::enabled = path != Path::composite;
  auto traced = sc::function([&](sc::Tensor g) {
    opt.apply({g}, {w});
    return w.value();
  });
  for (int t = 1; t <= steps; ++t) {
    const sc::Tensor g = sc::tensor(grad_at(t, std::size_t(init.numel()), 0.5), init.shape()).astype(init.dtype());
    if (path == Path::traced) traced(g);
    else opt.apply({g}, {w});
  }
  sc::optim::fused::enabled = was;
  return w.value().to_vector<double>();
}

/// The largest |got - want| / max(|want|, 1).
double max_rel_error(const Vec& got, const Vec& want) {
  REQUIRE(got.size() == want.size());
  double e = 0;
  for (std::size_t i = 0; i < got.size(); ++i)
    e = std::max(e, std::fabs(got[i] - want[i]) / std::max(std::fabs(want[i]), 1.0));
  return e;
}

}  // namespace

TEST_CASE("optimizers: the fused CPU update equals the composite ops bit for bit", "[optim][fused]") {
  // Small (scalar loop only), odd-sized (SIMD body and tail) and big (split across threads).
  for (std::int64_t n : {6, 1003, 300007})
    for (sc::DType dt : {sc::f32, sc::f64}) {
      const sc::Tensor init = sc::tensor(grad_at(0, std::size_t(n), 2.0), sc::Shape{n}).astype(dt);
      const double tol = dt == sc::f32 ? 1e-5 : 1e-12;
      auto check = [&](const std::string& what, auto make, auto reference) {
        INFO(what << " n " << n << " " << sc::name(dt));
        const Vec fused = run_steps(make, init, 5, Path::fused);
        const Vec composite = run_steps(make, init, 5, Path::composite);
        const Vec traced = run_steps(make, init, 5, Path::traced);
        CHECK(fused == composite);  // the same roundings, op by op
        CHECK(max_rel_error(traced, composite) <= tol);
        CHECK(max_rel_error(fused, reference) <= tol);  // a plain loop in double
      };
      struct S { double lr, mu; bool nesterov; };
      for (const S c : {S{0.1, 0.0, false}, S{0.05, 0.9, false}, S{0.05, 0.9, true}}) {
        Vec w = init.to_vector<double>(), vel(w.size(), 0.0);
        for (int t = 1; t <= 5; ++t) sgd_reference(w, vel, grad_at(t, w.size(), 0.5), c.lr, c.mu, c.nesterov);
        check("SGD mu " + std::to_string(c.mu) + (c.nesterov ? " nesterov" : ""),
              [c] { return sc::optim::SGD(c.lr, c.mu, c.nesterov); }, w);
      }
      struct A { double lr, b1, b2, eps; };
      for (const A c : {A{1e-3, 0.9, 0.999, 1e-7}, A{0.05, 0.0, 0.5, 0.0}}) {
        Vec w = init.to_vector<double>(), m(w.size(), 0.0), v(w.size(), 0.0);
        for (int t = 1; t <= 5; ++t) adam_reference(w, m, v, grad_at(t, w.size(), 0.5), t, c.lr, c.b1, c.b2, c.eps);
        check("Adam b1 " + std::to_string(c.b1), [c] { return sc::optim::Adam(c.lr, c.b1, c.b2, c.eps); }, w);
      }
    }
}

TEST_CASE("optimizers: moments are stored with subnormals flushed to zero, fused, composite and traced alike",
          "[optim][fused]") {
  // Under zero gradients Adam's m *= beta1 each step and ended at the smallest subnormal, where
  // m * beta1 rounds back to m: every later step then paid the CPU's subnormal assists (235K such
  // elements: 40x slower on an Intel Xeon). Each moment is now stored as x * sign(relu(|x| - the
  // smallest normal)): a subnormal becomes a zero of its sign, in the fused loop, the composite ops,
  // a traced step run op by op (a small variable) and a traced step run by the specialized kernel
  // (a big one), bit for bit.
  const auto bits = [](const Vec& v) {
    std::vector<std::uint64_t> b(v.size());
    std::memcpy(b.data(), v.data(), v.size() * sizeof(double));
    return b;
  };
  for (sc::DType dt : {sc::f32, sc::f64}) {
    const double tiny = dt == sc::f32 ? double(std::numeric_limits<float>::denorm_min()) : std::numeric_limits<double>::denorm_min();
    const double normal_min = dt == sc::f32 ? double(std::numeric_limits<float>::min()) : std::numeric_limits<double>::min();
    const double small = dt == sc::f32 ? 1e-39 : 1e-310;  // subnormal, not the smallest
    for (std::int64_t n : {1003, 3001}) {  // op by op when traced; one specialized group
      INFO(sc::name(dt) << " n " << n);
      Vec m0(static_cast<std::size_t>(n)), v0(static_cast<std::size_t>(n));
      for (std::size_t i = 0; i < m0.size(); ++i) {
        const double vals[] = {tiny, -small, 0.25, 0.0, normal_min, -normal_min * 1.05};
        m0[i] = vals[i % 6];
        v0[i] = vals[(i + 1) % 6] < 0 ? -vals[(i + 1) % 6] : vals[(i + 1) % 6];
      }
      const sc::Tensor g = sc::zeros({n}, dt);
      const auto run = [&](Path path) {
        sc::Variable w(sc::tensor(grad_at(1, std::size_t(n), 0.0), sc::Shape{n}).astype(dt), "w");
        sc::optim::Adam opt(1e-3);
        opt.build({w});
        opt.slot(w, "m").assign(sc::tensor(m0, sc::Shape{n}).astype(dt));
        opt.slot(w, "v").assign(sc::tensor(v0, sc::Shape{n}).astype(dt));
        const bool was = sc::optim::fused::enabled;
        sc::optim::fused::enabled = path != Path::composite;
        auto traced = sc::function([&](sc::Tensor gt) {
          opt.apply({gt}, {w});
          return w.value();
        });
        if (path == Path::traced) {
          traced(g);
          if (n == 3001) CHECK(traced.get_concrete(g).stats().plan.specialized == (sc::graph::fused_specializations() ? 1 : 0));
        } else {
          opt.apply({g}, {w});
        }
        sc::optim::fused::enabled = was;
        return std::array<Vec, 3>{opt.slot(w, "m").value().to_vector<double>(), opt.slot(w, "v").value().to_vector<double>(),
                                  w.value().to_vector<double>()};
      };
      const auto fused = run(Path::fused), traced = run(Path::traced), composite = run(Path::composite);
      for (std::size_t k = 0; k < 3; ++k) {
        CHECK(bits(fused[k]) == bits(composite[k]));
        CHECK(bits(traced[k]) == bits(composite[k]));
      }
      for (std::size_t i = 0; i < std::size_t(n); ++i) {
        INFO("element " << i << ": m " << m0[i]);
        const double m = fused[0][i], v = fused[1][i];
        if (i % 6 < 2) {  // m * 0.9 subnormal: a zero of its sign (once stuck at the smallest subnormal)
          CHECK(m == 0.0);
          CHECK(std::signbit(m) == std::signbit(m0[i]));
        } else if (i % 6 == 4 || i % 6 == 5) {
          CHECK(m == 0.0);  // normal before, subnormal after * 0.9
        } else {
          CHECK((m == 0.0) == (m0[i] == 0.0));
        }
        CHECK(!(v != 0.0 && std::fabs(v) <= normal_min));  // no subnormal v
      }
    }
    // SGD's velocity likewise, fused and composite
    const auto sgd_velocity = [&](bool fused_on) {
      sc::Variable w(sc::ones({9}, dt), "w");
      sc::optim::SGD sgd(0.1, 0.9);
      sgd.build({w});
      sgd.slot(w, "velocity").assign(sc::tensor(Vec{1, tiny, -tiny, small, -small, normal_min, 0, -1, 2 * normal_min}).astype(dt));
      const bool was = sc::optim::fused::enabled;
      sc::optim::fused::enabled = fused_on;
      sgd.apply({sc::zeros({9}, dt)}, {w});
      sc::optim::fused::enabled = was;
      return sgd.slot(w, "velocity").value().to_vector<double>();
    };
    const Vec vel = sgd_velocity(true);
    CHECK(bits(vel) == bits(sgd_velocity(false)));
    for (std::size_t i = 1; i < 7; ++i) CHECK(vel[i] == 0.0);
    CHECK(vel[0] == sc::tensor(Vec{0.9}).astype(dt).item<double>());
    CHECK(vel[8] != 0.0);  // 1.8 x the smallest normal: still normal
  }
}

TEST_CASE("optimizers: the fused update keeps tensors immutable and the slots exact", "[optim][fused]") {
  sc::Variable w(sc::tensor(Vec{1, 2, 3, 4, 5}).astype(sc::f32), "w");
  const sc::Tensor before = w.value();
  sc::optim::Adam fused_opt(0.1), composite_opt(0.1);
  sc::Variable w2(sc::tensor(Vec{1, 2, 3, 4, 5}).astype(sc::f32), "w");
  const sc::Tensor g = sc::tensor(Vec{0.5, -1, 2, 0, 3}).astype(sc::f32);
  fused_opt.apply({g}, {w});
  sc::optim::fused::enabled = false;
  composite_opt.apply({g}, {w2});
  sc::optim::fused::enabled = true;
  CHECK(before.to_vector<double>() == Vec{1, 2, 3, 4, 5});  // a value read before the step is unchanged
  // Eager CPU tensors of the variable's dtype take the fused path (so the tests above compare it).
  CHECK(sc::optim::fused::eligible(g, w, nullptr, 0, sc::scalar(0.1f)));
  CHECK(!sc::optim::fused::eligible(g, w, nullptr, 0, sc::scalar(0.1)));  // lr of another dtype
  CHECK(w.value().to_vector<double>() == w2.value().to_vector<double>());
  for (const char* slot : {"m", "v"})
    CHECK(fused_opt.slot(w, slot).value().to_vector<double>() == composite_opt.slot(w2, slot).value().to_vector<double>());
  // Gradients of another dtype are converted first, then the fused update runs.
  fused_opt.apply({g.astype(sc::f64)}, {w});
  sc::optim::fused::enabled = false;
  composite_opt.apply({g.astype(sc::f64)}, {w2});
  sc::optim::fused::enabled = true;
  CHECK(w.dtype() == sc::f32);
  CHECK(w.value().to_vector<double>() == w2.value().to_vector<double>());
}

TEST_CASE("optimizer: learning rate, skipped gradients, dtypes, no tape recording", "[optim]") {
  Problem p(sc::f32);
  sc::optim::SGD opt(0.1);
  opt.set_learning_rate(0.5);
  CHECK(opt.learning_rate() == 0.5);
  const auto g = p.grads(1);
  opt.apply({sc::Tensor(), g[1]}, {p.w, p.b});  // an undefined gradient skips its variable
  CHECK(p.w.value().to_vector<double>() == p.rw);
  Vec vel;
  sgd_reference(p.rb, vel, grad_at(1, 3, 1.0), 0.5, 0, false);
  check_close(p.b.value().to_vector<double>(), p.rb, 2e-6);
  CHECK(opt.iterations() == 1);

  // f64 gradients for an f32 variable are converted: the variable keeps its dtype.
  opt.apply({g[0].astype(sc::f64), g[1]}, {p.w, p.b});
  CHECK(p.w.dtype() == sc::f32);
  CHECK(p.b.dtype() == sc::f32);

  // Nothing an optimizer does is recorded, even when the gradients are watched.
  sc::optim::Adam adam(0.1);
  sc::GradientTape tape;
  const sc::Tensor gw = g[0], gb = g[1];
  tape.watch(gw);
  tape.watch(gb);
  const sc::Tensor y = gw * 2.f;
  REQUIRE(tape.size() == 1);
  adam.apply({gw, gb}, {p.w, p.b});
  CHECK(tape.size() == 1);

  STATIC_REQUIRE(!std::is_copy_constructible_v<sc::optim::Adam>);
  STATIC_REQUIRE(std::is_move_constructible_v<sc::optim::Adam>);
  sc::optim::Adam moved = std::move(adam);
  CHECK(moved.iterations() == 1);
  CHECK(moved.named_variables().size() == 5);
}

TEST_CASE("optimizer: slots follow variables, in the order first seen", "[optim]") {
  Problem p(sc::f64);
  sc::Variable c(sc::ones({2}, sc::f64), "c");
  sc::optim::Adam opt(0.1);
  opt.build({p.w, p.b});
  CHECK(opt.named_variables().size() == 5);
  CHECK(opt.slot(p.b, "m").value().to_vector<double>() == Vec{0, 0, 0});
  CHECK(opt.iterations() == 0);
  opt.build({p.w, p.b});  // idempotent
  CHECK(opt.named_variables().size() == 5);

  // A subset, in another order, plus a new variable: each keeps its own slots.
  const sc::Tensor gb = sc::tensor(grad_at(1, 3, 1.0)), gc = sc::ones({2}, sc::f64);
  opt.apply({gc, gb}, {c, p.b});
  CHECK(p.w.value().to_vector<double>() == p.rw);  // untouched
  Vec m(3, 0), v(3, 0);
  adam_reference(p.rb, m, v, grad_at(1, 3, 1.0), 1, 0.1, 0.9, 0.999, 1e-7);
  check_close(p.b.value().to_vector<double>(), p.rb, 1e-12);
  check_close(opt.slot(p.b, "m").value().to_vector<double>(), m, 1e-12);
  const auto named = opt.named_variables();
  REQUIRE(named.size() == 7);
  CHECK(named[5].first == "m/2:c");
  CHECK(named[6].first == "v/2:c");
  CHECK(opt.slot(p.w, "v").value().to_vector<double>() == Vec(6, 0.0));
}

TEST_CASE("optimizer: state restored by name continues the same run", "[optim][checkpoint]") {
  // What sc::Checkpoint does: match named_variables() of a freshly built model and optimizer.
  Tiny a(1), b(2);
  sc::optim::Adam oa(0.05), ob(0.05);
  const auto va = a.trainable_variables(), vb = b.trainable_variables();
  const auto grads = [](const std::vector<sc::Variable>& vs, int t) {
    std::vector<sc::Tensor> g;
    for (std::size_t i = 0; i < vs.size(); ++i)
      g.push_back(sc::tensor(grad_at(t, std::size_t(vs[i].numel()), double(i)), vs[i].shape()).astype(sc::f32));
    return g;
  };
  oa.apply(grads(va, 1), va);
  oa.apply(grads(va, 2), va);
  ob.build(vb);
  auto restore = [](const auto& from, const auto& to) {
    const auto src = from.named_variables(), dst = to.named_variables();
    REQUIRE(src.size() == dst.size());
    for (std::size_t i = 0; i < src.size(); ++i) {
      REQUIRE(src[i].first == dst[i].first);
      auto target = dst[i].second;
      target.assign(src[i].second.value());
    }
  };
  restore(a, b);
  restore(oa, ob);
  CHECK(ob.iterations() == 2);
  oa.apply(grads(va, 3), va);
  ob.apply(grads(vb, 3), vb);
  for (std::size_t i = 0; i < va.size(); ++i)
    CHECK(va[i].value().to_vector<float>() == vb[i].value().to_vector<float>());
}

TEST_CASE("optimizer: the step counter advances by an op on its variable", "[optim][staging]") {
  // apply() reads the counter only as a tensor: under a recording tape it records nothing,
  // and the counter variable gets a new value each step (the old tensor is left as it was).
  Problem p(sc::f64);
  sc::optim::Adam opt(0.1);
  const sc::Variable& it = opt.iterations_variable();
  CHECK(it.name() == "iterations");
  CHECK(it.dtype() == sc::i64);
  CHECK(it.shape() == sc::Shape{});
  CHECK(!it.trainable());
  const sc::Tensor before = it.value();
  sc::GradientTape tape(/*persistent=*/true);
  tape.watch(p.w);
  for (int t = 1; t <= 3; ++t) {
    opt.apply(p.grads(t), {p.w, p.b});
    CHECK(tape.size() == 0);
    CHECK(opt.iterations() == t);
    CHECK(it.value().dtype() == sc::i64);
  }
  CHECK(before.item<std::int64_t>() == 0);
  CHECK(!it.value().same(before));

  // The counter variable is the only source of t: set it (as a restore, or a traced step at
  // its second call, would find it) and the bias correction follows.
  ProbeAdam a(0.1, 0.9, 0.999, 1e-7), ref(0.1, 0.9, 0.999, 1e-7);
  Problem pa(sc::f64), pr(sc::f64);
  sc::Variable counter = a.iterations_variable();
  counter.assign(sc::scalar<std::int64_t>(41));
  a.apply(pa.grads(1), {pa.w, pa.b});
  CHECK(a.iterations() == 42);
  CHECK(a.lr_t() == Approx(0.1 * std::sqrt(1 - std::pow(0.999, 42)) / (1 - std::pow(0.9, 42))).epsilon(1e-15));
  Vec mw(6, 0.0), vw(6, 0.0);
  adam_reference(pr.rw, mw, vw, grad_at(1, 6, 0.0), 42, 0.1, 0.9, 0.999, 1e-7);
  check_close(pa.w.value().to_vector<double>(), pr.rw, 1e-12);
}

TEST_CASE("optimizer: a variable first stepped on a later trace names build()", "[optim][staging]") {
  // Its slots would be variables made on a later trace: the error named Variable and the slot
  // ('velocity/0:w') and suggested init_scope, which cannot reach the optimizer's slots.
  Problem p(sc::f32);
  sc::optim::SGD sgd(0.1, 0.9);
  int line = 0;
  auto step = sc::function([&](sc::Tensor g) {
    if (g.shape()[0] == 3) {
      line = __LINE__ + 1;
      sgd.apply({g}, {p.b});
    }
    return g;
  });
  step(sc::ones({2}));
  std::string msg = error_of<sc::StagingError>([&] { (void)step(sc::ones({3})); });
  CHECK_THAT(msg, Catch::Contains("[SGD::build]") && Catch::Contains("'b'") && Catch::Contains("build(vars)") &&
                      Catch::Contains(at_line(line)));
  CHECK(sgd.named_variables().size() == 1);
  // Built before the first call, the same step traces and runs on any trace.
  sc::optim::SGD built(0.1, 0.9);
  built.build({p.b});
  auto step2 = sc::function([&](sc::Tensor g) {
    if (g.shape()[0] == 3) built.apply({g}, {p.b});
    return g;
  });
  step2(sc::ones({2}));
  step2(sc::ones({3}));
  CHECK(built.iterations() == 1);
  // Without slots (plain SGD) nothing is created, and a later first step is fine.
  sc::optim::SGD plain(0.1);
  auto step3 = sc::function([&](sc::Tensor g) {
    if (g.shape()[0] == 3) plain.apply({g}, {p.b});
    return g;
  });
  step3(sc::ones({2}));
  step3(sc::ones({3}));
  CHECK(plain.iterations() == 1);
}

TEST_CASE("optimizer: the learning rate is a variable, set between steps it takes effect", "[optim]") {
  for (sc::DType dt : {sc::f32, sc::f64}) {
    INFO(sc::name(dt));
    const double tol = dt == sc::f32 ? 2e-6 : 1e-13;
    // SGD with momentum: the rate scales the gradient inside the velocity update.
    Problem p(dt);
    sc::optim::SGD sgd(0.1, 0.9);
    const sc::Variable& lr = sgd.learning_rate_variable();
    CHECK(lr.name() == "learning_rate");
    CHECK(lr.dtype() == sc::f64);
    CHECK(lr.shape() == sc::Shape{});
    CHECK(!lr.trainable());
    CHECK(lr.value().item<double>() == 0.1);
    Vec vw(6, 0.0), vb(3, 0.0);
    const double rates[] = {0.1, 0.02, 0.0, 0.3};
    for (int t = 1; t <= 4; ++t) {
      sgd.set_learning_rate(rates[t - 1]);
      CHECK(sgd.learning_rate() == rates[t - 1]);
      sgd.apply(p.grads(t), {p.w, p.b});
      sgd_reference(p.rw, vw, grad_at(t, 6, 0.0), rates[t - 1], 0.9, false);
      sgd_reference(p.rb, vb, grad_at(t, 3, 1.0), rates[t - 1], 0.9, false);
      check_close(p.w.value().to_vector<double>(), p.rw, tol);
      check_close(p.b.value().to_vector<double>(), p.rb, tol);
    }

    // Adam: the rate enters lr_t. Assigning the variable a tensor (what a schedule inside a
    // traced step does) is the same as set_learning_rate, and learning_rate() reads it back.
    Problem q(dt);
    sc::optim::Adam adam(0.05);
    Vec mw(6, 0.0), v(6, 0.0), mb(3, 0.0), vb2(3, 0.0);
    for (int t = 1; t <= 4; ++t) {
      const double r = 0.05 / t;
      if (t % 2) adam.set_learning_rate(r);
      else sc::Variable(adam.learning_rate_variable()).assign(sc::scalar(r));
      CHECK(adam.learning_rate() == r);
      adam.apply(q.grads(t), {q.w, q.b});
      adam_reference(q.rw, mw, v, grad_at(t, 6, 0.0), t, r, 0.9, 0.999, 1e-7);
      adam_reference(q.rb, mb, vb2, grad_at(t, 3, 1.0), t, r, 0.9, 0.999, 1e-7);
      check_close(q.w.value().to_vector<double>(), q.rw, tol);
      check_close(q.b.value().to_vector<double>(), q.rb, tol);
    }
  }
  // A rejected rate leaves the variable as it was.
  sc::optim::SGD sgd(0.25);
  CHECK_THROWS_AS(sgd.set_learning_rate(-1), sc::ValueError);
  CHECK_THROWS_AS(sgd.set_learning_rate(INFINITY), sc::ValueError);
  CHECK(sgd.learning_rate() == 0.25);
}

TEST_CASE("Adam: lr_t from the counter variable matches the host formula over 50 steps", "[optim][adam]") {
  struct Cfg { double lr, b1, b2, eps; };
  for (const Cfg c : {Cfg{1e-3, 0.9, 0.999, 1e-7}, Cfg{0.1, 0.8, 0.99, 1e-3}, Cfg{0.05, 0.0, 0.5, 0.0},
                      Cfg{0.02, 0.5, 0.0, 1e-8}, Cfg{0.01, 0.0, 0.0, 1e-8}}) {
    INFO("lr " << c.lr << " beta1 " << c.b1 << " beta2 " << c.b2 << " eps " << c.eps);
    Problem p(sc::f64);
    ProbeAdam opt(c.lr, c.b1, c.b2, c.eps);
    Vec mw(6, 0.0), vw(6, 0.0), mb(3, 0.0), vb(3, 0.0);
    for (int t = 1; t <= 50; ++t) {
      INFO("step " << t);
      opt.apply(p.grads(t), {p.w, p.b});
      // The same std::pow, in the same order, in f64: beta = 0 gives 0^t = 0 exactly.
      const double want = c.lr * std::sqrt(1 - std::pow(c.b2, t)) / (1 - std::pow(c.b1, t));
      CHECK(opt.lr_t() == Approx(want).epsilon(1e-15).margin(0));
      adam_reference(p.rw, mw, vw, grad_at(t, 6, 0.0), t, c.lr, c.b1, c.b2, c.eps);
      adam_reference(p.rb, mb, vb, grad_at(t, 3, 1.0), t, c.lr, c.b1, c.b2, c.eps);
      // With beta2 = 0 the weights are left out: v + (g² - v) is not exactly g² (the
      // reference's form is), and a tiny g turns that last-bit difference into ~1e-10 in the
      // step. A property of the moment update's form, not of lr_t, checked exactly above.
      if (c.b2 == 0) continue;
      check_close(p.w.value().to_vector<double>(), p.rw, 1e-12);
      check_close(p.b.value().to_vector<double>(), p.rb, 1e-12);
    }
    CHECK(opt.iterations() == 50);
  }
}

TEST_CASE("optimizer: a checkpoint round-trip of the state continues the same run", "[optim][checkpoint]") {
  TempDir dir;
  const auto file = dir.path / "run.safetensors";
  Tiny a(1), b(2);
  sc::optim::Adam oa(0.05), ob(0.05);
  const auto va = a.trainable_variables(), vb = b.trainable_variables();
  for (int t = 1; t <= 3; ++t) oa.apply(grads_for(va, t), va);
  sc::Checkpoint save;
  save.track("model", a);
  save.track("opt", oa);
  save.save(file);

  // The file holds the counter and the slots, not the learning rate (see named_variables()).
  std::vector<std::string> opt_keys;
  for (const auto& [k, t] : sc::load_safetensors(file).tensors)
    if (k.rfind("opt/", 0) == 0) opt_keys.push_back(k);
  CHECK(opt_keys.size() == 1 + 2 * va.size());
  CHECK(std::count(opt_keys.begin(), opt_keys.end(), "opt/iterations") == 1);
  CHECK(std::count(opt_keys.begin(), opt_keys.end(), "opt/learning_rate") == 0);

  ob.build(vb);
  ob.set_learning_rate(0.05);
  sc::Checkpoint load;
  load.track("model", b);
  load.track("opt", ob);
  load.restore(file);
  CHECK(ob.iterations() == 3);
  CHECK(ob.learning_rate() == 0.05);
  for (int t = 4; t <= 5; ++t) {
    oa.apply(grads_for(va, t), va);
    ob.apply(grads_for(vb, t), vb);
  }
  CHECK(ob.iterations() == 5);
  for (std::size_t i = 0; i < va.size(); ++i)
    CHECK(va[i].value().to_vector<float>() == vb[i].value().to_vector<float>());
  for (std::size_t i = 0; i < va.size(); ++i)
    CHECK(oa.slot(va[i], "v").value().to_vector<float>() == ob.slot(vb[i], "v").value().to_vector<float>());
}

TEST_CASE("optimizer: errors", "[optim][errors]") {
  Problem p(sc::f32);
  sc::optim::SGD sgd(0.1);
  sc::optim::Adam adam(0.1);
  const auto g = p.grads(1);

  int line = __LINE__ + 1;
  std::string msg = error_of<sc::ValueError>([&] { sgd.apply({g[0]}, {p.w, p.b}); });
  CHECK_THAT(msg, Catch::Contains("[SGD::apply]") && Catch::Contains("1 gradients for 2 variables") &&
                      Catch::Contains(at_line(line)));

  line = __LINE__ + 1;
  msg = error_of<sc::ShapeError>([&] { adam.apply({g[0], g[0]}, {p.w, p.b}); });
  CHECK_THAT(msg, Catch::Contains("[Adam::apply]") && Catch::Contains("gradient 1 has shape [2, 3]") &&
                      Catch::Contains("variable 1 ('b') has shape [3]") && Catch::Contains(at_line(line)));
  CHECK(adam.iterations() == 0);  // a failed step changes nothing: no step, no slots
  CHECK(adam.named_variables().size() == 1);
  CHECK(p.w.value().to_vector<double>() == p.rw);

  // Nothing to update (no variables, or none with a gradient) would only advance the counter.
  line = __LINE__ + 1;
  msg = error_of<sc::ValueError>([&] { adam.apply({}, {}); });
  CHECK_THAT(msg, Catch::Contains("[Adam::apply] got no variables to apply") && Catch::Contains(at_line(line)));
  msg = error_of<sc::ValueError>([&] { adam.apply({sc::Tensor(), sc::Tensor()}, {p.w, p.b}); });
  CHECK_THAT(msg, Catch::Contains("got no gradients to apply (2 variables, none with a gradient)"));
  CHECK(adam.iterations() == 0);

  // The same variable twice would take two updates in one step (and count one): refused.
  sc::optim::SGD mom(0.1, 0.5);
  line = __LINE__ + 1;
  msg = error_of<sc::ValueError>([&] { mom.apply({g[0], g[1], g[0]}, {p.w, p.b, p.w}); });
  CHECK_THAT(msg, Catch::Contains("[SGD::apply]") && Catch::Contains("'w' is passed twice (at 0 and 2)") &&
                      Catch::Contains(at_line(line)));
  CHECK(mom.iterations() == 0);
  CHECK(p.w.value().to_vector<double>() == p.rw);
  mom.apply({g[0], g[1]}, {p.w, p.b});  // then the same list without the repeat steps as usual
  CHECK(mom.iterations() == 1);
  CHECK_THROWS_AS(mom.apply({g[0], g[0]}, {p.w, p.w}), sc::ValueError);
  CHECK(mom.iterations() == 1);

  sc::Variable n(sc::zeros({2}, sc::i64), "n");
  line = __LINE__ + 1;
  msg = error_of<sc::DTypeError>([&] { sgd.apply({sc::zeros({2}, sc::i64)}, {n}); });
  CHECK_THAT(msg, Catch::Contains("[SGD::build]") && Catch::Contains("'n'") && Catch::Contains("i64") &&
                      Catch::Contains(at_line(line)));
  line = __LINE__ + 1;
  msg = error_of<sc::DTypeError>([&] { adam.build({p.w, n}); });
  CHECK_THAT(msg, Catch::Contains("[Adam::build]") && Catch::Contains(at_line(line)));
  CHECK(adam.named_variables().size() == 1);  // a failed build adds no slots, not even w's
  line = __LINE__ + 1;
  msg = error_of<sc::ValueError>([&] { adam.build({sc::Variable()}); });
  CHECK_THAT(msg, Catch::Contains("[Adam::build]") && Catch::Contains("empty") && Catch::Contains(at_line(line)));

  line = __LINE__ + 1;
  msg = error_of<sc::ValueError>([&] { (void)adam.slot(p.w, "m"); });
  CHECK_THAT(msg, Catch::Contains("[Adam::slot]") && Catch::Contains("'w' has no slots yet") &&
                      Catch::Contains(at_line(line)));
  adam.build({p.w});
  {  // A slot kept while more variables get slots stays valid (it was a reference into the slot
     // list, dangling after the list grew: a heap-use-after-free under ASan).
    const sc::Variable& m = adam.slot(p.w, "m");
    std::vector<sc::Variable> more;
    for (int i = 0; i < 8; ++i) more.emplace_back(sc::ones({2}), "more" + std::to_string(i));
    for (const sc::Variable& v : more) adam.build({v});
    CHECK(m.name() == "m/0:w");
    CHECK(m.same(adam.slot(p.w, "m")));
  }
  line = __LINE__ + 1;
  msg = error_of<sc::ValueError>([&] { (void)adam.slot(p.w, "velocity"); });
  CHECK_THAT(msg, Catch::Contains("no slot named 'velocity'") && Catch::Contains(at_line(line)));

  line = __LINE__ + 1;
  msg = error_of<sc::ValueError>([&] { sc::optim::SGD bad(-0.1); });
  CHECK_THAT(msg, Catch::Contains("learning rate") && Catch::Contains("-0.1") && Catch::Contains(at_line(line)));
  line = __LINE__ + 1;
  msg = error_of<sc::ValueError>([&] { sc::optim::SGD bad(0.1, 1.0); });
  CHECK_THAT(msg, Catch::Contains("[SGD]") && Catch::Contains("momentum must be in [0, 1)") &&
                      Catch::Contains(at_line(line)));
  line = __LINE__ + 1;
  msg = error_of<sc::ValueError>([&] { sc::optim::Adam bad(0.1, 1.0); });
  CHECK_THAT(msg, Catch::Contains("[Adam]") && Catch::Contains("beta1") && Catch::Contains(at_line(line)));
  line = __LINE__ + 1;
  msg = error_of<sc::ValueError>([&] { sc::optim::Adam bad(0.1, 0.9, -0.5); });
  CHECK_THAT(msg, Catch::Contains("beta2") && Catch::Contains(at_line(line)));
  line = __LINE__ + 1;
  msg = error_of<sc::ValueError>([&] { sc::optim::Adam bad(0.1, 0.9, 0.99, -1); });
  CHECK_THAT(msg, Catch::Contains("eps") && Catch::Contains(at_line(line)));
  line = __LINE__ + 1;
  msg = error_of<sc::ValueError>([&] { sgd.set_learning_rate(std::nan("")); });
  CHECK_THAT(msg, Catch::Contains("learning rate") && Catch::Contains(at_line(line)));

  // A gradient that escaped a traced function is refused before the step changes anything (its
  // first op failed after the counter and the variables before it had been updated).
  sc::Tensor escaped;
  auto leak = sc::function([&](sc::Tensor x) {
    escaped = x * 2.f;
    return x;
  });
  leak(sc::ones({3}, p.b.dtype()));
  sc::optim::SGD esc(0.1, 0.5);
  esc.apply({g[0], g[1]}, {p.w, p.b});
  const std::vector<double> w1 = p.w.value().to_vector<double>();
  line = __LINE__ + 1;
  msg = error_of<sc::StagingError>([&] { esc.apply({g[0], escaped}, {p.w, p.b}); });
  CHECK_THAT(msg, Catch::Contains("[SGD::apply]") && Catch::Contains("gradient 1 (for variable 'b') is symbolic") &&
                      Catch::Contains(at_line(line)));
  CHECK(esc.iterations() == 1);
  CHECK(p.w.value().to_vector<double>() == w1);
}

TEST_CASE("optimizers train a tiny regression to low loss", "[optim][train][grad]") {
  // y = x @ w_true + b_true, fitted by a Dense(3, 1) under mean squared error.
  const sc::Tensor x = sc::random::normal({64, 3}, 3);
  const sc::Tensor w_true = sc::tensor({{1.5f}, {-2.f}, {0.5f}});
  const sc::Tensor y = sc::matmul(x, w_true) + 0.75f;
  struct Run { const char* name; std::function<std::unique_ptr<sc::optim::Optimizer>()> make; int steps; };
  const std::vector<Run> runs = {
      {"SGD", [] { return std::make_unique<sc::optim::SGD>(0.1); }, 200},
      {"SGD momentum", [] { return std::make_unique<sc::optim::SGD>(0.05, 0.9); }, 200},
      {"SGD nesterov", [] { return std::make_unique<sc::optim::SGD>(0.05, 0.9, true); }, 200},
      {"Adam", [] { return std::make_unique<sc::optim::Adam>(0.05); }, 400},
  };
  for (const Run& r : runs) {
    INFO(r.name);
    sc::nn::Dense model(3, 1, 17);
    const auto opt = r.make();
    const auto vars = model.trainable_variables();
    const auto loss_fn = [&] { return sc::mean(sc::square(model(x) - y)); };
    const double first = loss_fn().item<float>();
    for (int s = 0; s < r.steps; ++s) {
      sc::GradientTape tape;
      const sc::Tensor loss = loss_fn();
      opt->apply(tape.gradient(loss, vars), vars);
    }
    const double last = loss_fn().item<float>();
    CHECK(first > 0.5);
    CHECK(last < 1e-4);
    CHECK(opt->iterations() == r.steps);
  }
}
