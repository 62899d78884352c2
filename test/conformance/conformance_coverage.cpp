// Coverage guarantee: every op in the registry (op_list.hpp) has conformance entries, reached
// with its own arity, and differentiable ops are checked in both f32 and f64.
#include <catch2/catch.hpp>

#include <stagecraft/ops/registry.hpp>

#include <set>

#include "conformance.hpp"

namespace {

std::vector<conf::OpEntry> all_entries() {
  std::vector<conf::OpEntry> all;
  for (auto* table : {&conf::elementwise_table, &conf::reduce_table, &conf::layout_table, &conf::nn_table,
                      &conf::creation_table})
    for (conf::OpEntry& e : (*table)()) all.push_back(std::move(e));
  return all;
}

}  // namespace

TEST_CASE("conformance coverage: every registered op has an entry", "[conformance][coverage]") {
  const std::vector<conf::OpEntry> all = all_entries();
  for (const sc::ops::OpInfo& info : sc::ops::op_registry) {
    INFO("op '" << info.name << "' (OpId " << static_cast<int>(info.id) << ", arity " << info.arity
                << "): add an entry for it to a table in test/conformance/");
    bool found = false, direct = false, f32 = false, f64 = false;
    for (const conf::OpEntry& e : all) {
      if (e.op != info.name) continue;
      found = true;
      for (const conf::Case& c : e.cases) {
        // At least one case calls it with exactly its inputs (not only scalar or list forms).
        direct |= info.arity < 0 ? c.in.size() >= 2 : static_cast<int>(c.in.size()) == info.arity;
        for (const conf::In& in : c.in) {
          f32 |= in.dtype == sc::f32;
          f64 |= in.dtype == sc::f64;
        }
      }
    }
    CHECK(found);
    CHECK(direct);
    if (info.differentiable) {
      CHECK(f32);
      CHECK(f64);
    }
  }
}

TEST_CASE("conformance coverage: entries name registered ops or known composites", "[conformance][coverage]") {
  // Composites are written with other ops (no registry line); they still get entries.
  const std::set<std::string> composites = {"mean",    "logsumexp",   "expand_dims", "squeeze",      "flatten", "stack",
                                            "softmax", "log_softmax", "cross_entropy"};
  for (const conf::OpEntry& e : all_entries()) {
    INFO("entry op '" << e.op << "' via " << e.api);
    CHECK((sc::ops::find_op(e.op) != nullptr || composites.count(e.op) == 1));
    CHECK(!e.cases.empty());
  }
}

TEST_CASE("op registry mirrors the op structs", "[conformance][coverage]") {
  STATIC_REQUIRE(sc::ops::op_registry.size() == static_cast<std::size_t>(sc::ops::num_ops));
  STATIC_REQUIRE(sc::ops::op_info(sc::ops::OpId::Add).name == "add");
  STATIC_REQUIRE(sc::ops::op_info(sc::ops::OpId::Where).arity == 3);
  STATIC_REQUIRE(sc::ops::op_info(sc::ops::OpId::Concat).arity == -1);
  STATIC_REQUIRE(!sc::ops::op_info(sc::ops::OpId::ArgMax).differentiable);
  STATIC_REQUIRE(sc::ops::op_info(sc::ops::OpId::MatMul).differentiable);
  CHECK(sc::ops::find_op("max_pool2d") == &sc::ops::op_info(sc::ops::OpId::MaxPool2d));
  CHECK(sc::ops::find_op("no_such_op") == nullptr);
}

TEST_CASE("op registry: the elementwise kind of every op", "[conformance][coverage]") {
  using sc::ops::ElementwiseKind, sc::ops::OpId, sc::ops::op_info;
  STATIC_REQUIRE(op_info(OpId::Tanh).elementwise == ElementwiseKind::unary_floating);
  STATIC_REQUIRE(op_info(OpId::Neg).elementwise == ElementwiseKind::unary_numeric);
  STATIC_REQUIRE(op_info(OpId::LogicalNot).elementwise == ElementwiseKind::predicate);
  STATIC_REQUIRE(op_info(OpId::Add).elementwise == ElementwiseKind::arithmetic);
  STATIC_REQUIRE(op_info(OpId::Pow).elementwise == ElementwiseKind::arithmetic);
  STATIC_REQUIRE(op_info(OpId::Div).elementwise == ElementwiseKind::floating);
  STATIC_REQUIRE(op_info(OpId::NotEqual).elementwise == ElementwiseKind::compare);
  STATIC_REQUIRE(op_info(OpId::LogicalOr).elementwise == ElementwiseKind::logical);
  STATIC_REQUIRE(op_info(OpId::Where).elementwise == ElementwiseKind::where);
  STATIC_REQUIRE(op_info(OpId::Cast).elementwise == ElementwiseKind::cast);
  STATIC_REQUIRE(op_info(OpId::Sum).elementwise == ElementwiseKind::none);
  STATIC_REQUIRE(op_info(OpId::MatMul).elementwise == ElementwiseKind::none);
  // The conformance table of elementwise ops holds exactly the ops with a kind, and the kinds
  // agree with arity and differentiability.
  std::set<std::string> table;
  for (const conf::OpEntry& e : conf::elementwise_table()) table.insert(e.op);
  for (const sc::ops::OpInfo& info : sc::ops::op_registry) {
    INFO("op '" << info.name << "'");
    const ElementwiseKind k = info.elementwise;
    CHECK((k != ElementwiseKind::none) == (table.count(std::string(info.name)) == 1));
    if (sc::ops::unary_family(k) || k == ElementwiseKind::cast) CHECK(info.arity == 1);
    if (sc::ops::binary_family(k)) CHECK(info.arity == 2);
    if (k == ElementwiseKind::where) CHECK(info.arity == 3);
    if (sc::ops::bool_result(k)) CHECK_FALSE(info.differentiable);
  }
}
