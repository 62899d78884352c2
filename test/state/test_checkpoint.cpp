// sc::Checkpoint: tracked objects, restore reports, corrupt files, names, atomic saves.
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <stagecraft/stagecraft.hpp>
#include <stagecraft/state/checkpoint.hpp>
#include <stagecraft/state/safetensors.hpp>

#include "checkpoint_testing.hpp"

namespace {

struct Model {
  sc::Variable kernel{filled<float>({3, 2}), "kernel"};
  sc::Variable bias{filled<float>({2}), "bias"};
  std::vector<std::pair<std::string, sc::Variable>> named_variables() const {
    return {{"dense/kernel", kernel}, {"dense/bias", bias}};
  }
};

/// Like an optimizer: slots appear at the first step, after the checkpoint tracked it.
struct Opt {
  std::vector<std::pair<std::string, sc::Variable>> slots;
  std::vector<std::pair<std::string, sc::Variable>> named_variables() const { return slots; }
};

template <class T>
concept CanTrack = requires(sc::Checkpoint c, T& x) { c.track("x", x); };
template <class T>
concept CanTrackTemporary = requires(sc::Checkpoint c) { c.track("x", T{}); };
static_assert(sc::HasNamedVariables<Model> && sc::HasNamedVariables<Opt>);
static_assert(!sc::HasNamedVariables<int>);
static_assert(CanTrack<Model> && CanTrack<sc::Variable>);
static_assert(!CanTrackTemporary<Model> && !CanTrackTemporary<sc::Variable>);

std::vector<float> values(const sc::Variable& v) { return v.value().to_vector<float>(); }

}  // namespace

TEST_CASE("Checkpoint saves and restores tracked objects and variables", "[checkpoint]") {
  TempDir dir;
  Model m;
  Opt opt;
  sc::Variable step(sc::scalar(std::int64_t{7}), "step", false);
  sc::Checkpoint ck;
  ck.track("model", m);
  ck.track("opt", opt);
  ck.track("step", step);
  CHECK(ck.tracked() == std::vector<std::string>{"model", "opt", "step"});
  opt.slots.emplace_back("m/dense/kernel", sc::Variable(sc::full({3, 2}, 0.25f)));  // created after track()

  const fs::path p = dir / "ck.safetensors";
  ck.save(p);
  const auto f = sc::load_safetensors(p);
  std::vector<std::string> keys;
  for (const auto& [k, t] : f.tensors) keys.push_back(k);
  CHECK(keys == std::vector<std::string>{"model/dense/bias", "model/dense/kernel", "opt/m/dense/kernel", "step"});
  CHECK(f.metadata.at("format") == "stagecraft.checkpoint");

  const sc::Tensor kernel0 = m.kernel.value(), bias0 = m.bias.value();  // holds NaN: compare bytes
  m.kernel.assign(sc::zeros({3, 2}));
  m.bias.assign(sc::ones({2}));
  opt.slots[0].second.assign(sc::zeros({3, 2}));
  step.assign(sc::scalar(std::int64_t{100}));
  ck.restore(p);
  CHECK(same_bytes(m.kernel.value(), kernel0));
  CHECK(same_bytes(m.bias.value(), bias0));
  CHECK(values(opt.slots[0].second) == std::vector<float>(6, 0.25f));
  CHECK(step.value().item<std::int64_t>() == 7);
  CHECK(step.dtype() == sc::i64);
  CHECK_FALSE(step.trainable());

  // Objects are looked up at save time: a variable handle replaced after track() is the one saved.
  step = sc::Variable(sc::scalar(std::int64_t{9}), "step");
  ck.save(p);
  CHECK(sc::load_safetensors(p).tensors.at("step").item<std::int64_t>() == 9);
}

TEST_CASE("Checkpoint::restore reports missing and unexpected keys and mismatches together", "[checkpoint]") {
  TempDir dir;
  Model m;
  Opt opt;
  opt.slots.emplace_back("velocity", sc::Variable(sc::zeros({2})));
  sc::Checkpoint ck;
  ck.track("model", m);
  ck.track("opt", opt);
  const fs::path p = dir / "ck.safetensors";
  ck.save(p);

  // A different model: an extra variable, a reshaped one, a retyped one, no optimizer.
  struct Other {
    sc::Variable kernel{sc::zeros({2, 3}), "kernel"};
    sc::Variable bias{sc::zeros({2}, sc::f64), "bias"};
    sc::Variable extra{sc::zeros({1}), "extra"};
    std::vector<std::pair<std::string, sc::Variable>> named_variables() const {
      return {{"dense/kernel", kernel}, {"dense/bias", bias}, {"extra", extra}};
    }
  } other;
  sc::Checkpoint ck2;
  ck2.track("model", other);
  CHECK_THROWS_MATCHES(
      ck2.restore(p), sc::IOError,
      Has("[Checkpoint::restore]") && Has("nothing was restored") && Has("missing keys (1): model/extra") &&
          Has("unexpected keys (1): opt/velocity") && Has("shape/dtype mismatches (2)") &&
          Has("model/dense/kernel is f32 [3, 2] in the file, f32 [2, 3] in the variable") &&
          Has("model/dense/bias is f32 [2] in the file, f64 [2] in the variable") && Has("test_checkpoint.cpp"));
  CHECK(other.kernel.value().to_vector<float>() == std::vector<float>(6, 0.f));
  CHECK(other.bias.value().to_vector<double>() == std::vector<double>(2, 0.0));

  // Only one thing wrong: the matching variables are still left alone (all or nothing).
  Model m2;
  m2.kernel.assign(sc::zeros({3, 2}));
  sc::Variable lone(sc::zeros({5}));
  sc::Checkpoint ck3;
  ck3.track("model", m2);
  ck3.track("opt", opt);
  ck3.track("lone", lone);
  CHECK_THROWS_MATCHES(ck3.restore(p), sc::IOError, Has("missing keys (1): lone") && !Has("unexpected"));
  CHECK(values(m2.kernel) == std::vector<float>(6, 0.f));
}

TEST_CASE("Checkpoint::restore into an optimizer that has no slots yet says to build it first", "[checkpoint]") {
  TempDir dir;
  const fs::path p = dir / "ck.safetensors";
  Model m;
  sc::optim::Adam adam(0.1);
  const std::vector<sc::Variable> vars{m.kernel, m.bias};
  adam.apply({sc::full({3, 2}, 1.f), sc::full({2}, 1.f)}, vars);
  sc::Checkpoint ck;
  ck.track("model", m);
  ck.track("opt", adam);
  ck.save(p);

  // a new run: the model and a fresh optimizer, whose slots its first apply() would make
  Model m2;
  sc::optim::Adam fresh(0.1);
  sc::Checkpoint ck2;
  ck2.track("model", m2);
  ck2.track("opt", fresh);
  CHECK_THROWS_MATCHES(ck2.restore(p), sc::IOError,
                       Has("unexpected keys (4): opt/m/0:kernel") && Has("'opt' has not made the state") &&
                           Has("call build(vars) on it") && Has("test_checkpoint.cpp"));
  // the fix the message names
  fresh.build({m2.kernel, m2.bias});
  ck2.restore(p);
  CHECK(values(fresh.slot(m2.kernel, "m")) == values(adam.slot(m.kernel, "m")));
  CHECK(fresh.iterations() == 1);
  // the hint comes with whatever else is wrong, and only when a trackee that builds lacks keys
  sc::optim::Adam other(0.1);
  sc::Variable lone(sc::zeros({5}));
  sc::Checkpoint ck3;
  ck3.track("opt", other);
  ck3.track("lone", lone);
  CHECK_THROWS_MATCHES(ck3.restore(p), sc::IOError, Has("missing keys (1): lone") && Has("'opt' has not made") &&
                                                        Has("unexpected keys (6)"));
  sc::Checkpoint ck4;
  ck4.track("model", m2);
  ck4.track("lone", lone);
  CHECK_THROWS_MATCHES(ck4.restore(p), sc::IOError, Has("missing keys (1): lone") && !Has("has not made"));
}

TEST_CASE("Checkpoint::restore of a missing, truncated or corrupt file changes nothing", "[checkpoint]") {
  TempDir dir;
  Model m;
  sc::Checkpoint ck;
  ck.track("model", m);
  const fs::path p = dir / "ck.safetensors";
  ck.save(p);
  const std::string bytes = read_bytes(p);
  m.kernel.assign(sc::zeros({3, 2}));

  CHECK_THROWS_MATCHES(ck.restore(dir / "missing"), sc::IOError,
                       Has("[Checkpoint::restore]") && Has("no such file") && Has("test_checkpoint.cpp"));
  write_bytes(dir / "cut", bytes.substr(0, bytes.size() - 1));
  CHECK_THROWS_MATCHES(ck.restore(dir / "cut"), sc::IOError, Has("truncated"));
  std::string bad = bytes;
  bad[12] = '#';
  write_bytes(dir / "bad", bad);
  CHECK_THROWS_MATCHES(ck.restore(dir / "bad"), sc::IOError, Has("is corrupt"));
  CHECK(values(m.kernel) == std::vector<float>(6, 0.f));
}

TEST_CASE("Checkpoint rejects bad names and keys", "[checkpoint]") {
  TempDir dir;
  Model m;
  sc::Variable v(sc::zeros({2}));
  sc::Checkpoint ck;
  ck.track("model", m);
  CHECK_THROWS_MATCHES(ck.track("model", v), sc::ValueError,
                       Has("[Checkpoint::track]") && Has("'model' is already tracked") &&
                           Has("test_checkpoint.cpp"));
  CHECK_THROWS_MATCHES(ck.track("a/b", v), sc::ValueError, Has("contains '/'"));
  CHECK_THROWS_MATCHES(ck.track("", v), sc::ValueError, Has("empty"));
  CHECK(ck.tracked() == std::vector<std::string>{"model"});

  struct Dup {
    sc::Variable a{sc::zeros({1})};
    std::vector<std::pair<std::string, sc::Variable>> named_variables() const { return {{"x", a}, {"x", a}}; }
  } dup;
  sc::Checkpoint ck2;
  ck2.track("d", dup);
  CHECK_THROWS_MATCHES(ck2.save(dir / "f"), sc::ValueError,
                       Has("[Checkpoint::save]") && Has("two variables have the key 'd/x'"));
  CHECK_THROWS_MATCHES(ck2.restore(dir / "f"), sc::IOError, Has("no such file"));

  struct Holes {
    sc::Variable a;
    std::vector<std::pair<std::string, sc::Variable>> named_variables() const { return {{"a", a}}; }
  } holes;
  sc::Checkpoint ck3;
  ck3.track("h", holes);
  CHECK_THROWS_MATCHES(ck3.save(dir / "f"), sc::ValueError, Has("'h/a' is undefined"));
  CHECK(dir.files().empty());
}

TEST_CASE("Checkpoint::save is atomic", "[checkpoint][atomic]") {
  TempDir dir;
  Model m;
  sc::Checkpoint ck;
  ck.track("model", m);
  const fs::path p = dir / "ck.safetensors";
  ck.save(p);
  const std::string old = read_bytes(p);
  m.kernel.assign(sc::zeros({3, 2}));
  sc::detail::safetensors::write_hook = [](std::uint64_t written) {
    if (written > 8) throw std::runtime_error("disk full");
  };
  CHECK_THROWS_MATCHES(ck.save(p), sc::IOError, Has("[Checkpoint::save]") && Has("disk full"));
  sc::detail::safetensors::write_hook = nullptr;
  CHECK(read_bytes(p) == old);
  CHECK(dir.files() == std::vector<std::string>{"ck.safetensors"});
}
