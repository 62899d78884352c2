// The fused elementwise evaluator (graph/fused_kernel.hpp) against the eager ops, op by op:
// single ops, random chains, broadcasting, in-place outputs, tile and SIMD boundaries.
// (Only the headers it uses: the evaluator must build without the rest of the graph layer.)
#include <catch2/catch.hpp>
#include <stagecraft/backend/cpu/parallel.hpp>
#include <stagecraft/core/creation.hpp>
#include <stagecraft/fwd.hpp>
#include <stagecraft/graph/fused_kernel.hpp>
#include <stagecraft/ops/broadcast_to.hpp>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "fused_testing.hpp"
#include "testing.hpp"

namespace {

namespace g = sc::graph;
using sc::ops::OpId;
using sctest::Rng;

OpId op(std::string_view name) {
  const sc::ops::OpInfo* info = sc::ops::find_op(name);
  REQUIRE(info != nullptr);
  return info->id;
}

// ---- the eager reference: each op through dispatch, by id (a table from the op list) -------
template <class Op>
sc::Tensor eager_call(const sc::Tensor& a, const sc::Tensor& b) {
  namespace f = g::detail_fused;
  const auto loc = std::source_location::current();
  if constexpr (f::keeps_dtype<Op, float>() || f::keeps_dtype<Op, std::int32_t>()) {
    if constexpr (Op::arity == 1) return sc::detail::dispatch<Op>({&a, 1}, {}, loc);
    else return sc::detail::dispatch2<Op>(a, b, {}, loc);
  } else {
    (void)a, (void)b, (void)loc;
    FAIL("not an elementwise op");
    return {};
  }
}
using EagerFn = sc::Tensor (*)(const sc::Tensor&, const sc::Tensor&);
constexpr std::array<EagerFn, sc::ops::num_ops> eager_table = {{
#define TEST_EAGER(S) &eager_call<sc::ops::S>,
    STAGECRAFT_OP_LIST(TEST_EAGER)
#undef TEST_EAGER
}};

/// The program run op by op through the eager ops, each output broadcast to out_shape.
std::vector<sc::Tensor> eager_run(const g::FusedProgram& p, const std::vector<sc::Tensor>& in) {
  std::vector<sc::Tensor> regs = in;
  for (const g::FusedInstr& c : p.code)
    regs.push_back(eager_table[static_cast<std::size_t>(c.op)](regs[c.a], c.b >= 0 ? regs[c.b] : sc::Tensor()));
  std::vector<sc::Tensor> out;
  for (int r : p.outputs) out.push_back(regs[r].shape() == p.out_shape ? regs[r] : sc::broadcast_to(regs[r], p.out_shape));
  return out;
}

/// The program through run_fused, into outputs filled with a poison value first.
std::vector<sc::Tensor> fused_run(const g::FusedProgram& p, const std::vector<sc::Tensor>& in) {
  std::vector<sc::Tensor> out;
  for (std::size_t j = 0; j < p.outputs.size(); ++j) out.push_back(sc::full(p.out_shape, -7.0, p.dtype));
  g::run_fused(p, in, out);
  return out;
}

// ---- data and comparisons ------------------------------------------------------------------
/// n values of T: floats in [-3, 3), integers in [-4, 4].
template <class T>
std::vector<T> values(std::int64_t n, std::uint64_t seed) {
  Rng r(seed);
  std::vector<T> v(static_cast<std::size_t>(n));
  for (T& x : v) {
    if constexpr (std::is_floating_point_v<T>) x = static_cast<T>(-3 + 6 * r.uniform());
    else x = static_cast<T>(static_cast<int>(r.next() % 9) - 4);
  }
  return v;
}
template <class T>
sc::Tensor make(const sc::Shape& s, std::uint64_t seed) {
  return sc::tensor(values<T>(s.numel(), seed), s);
}

/// got equals want bit for bit (the eager loops send a last partial batch through the same
/// padded SIMD rule the fused evaluator uses), except that a NaN matches any NaN: when both
/// operands of an op are NaNs the result is one of them, and which depends on the operand order the
/// kernel uses (the eager broadcast loops swap a commutative op's operands), and some SIMD forms
/// (f32 exp, tanh, log) give a NaN of the other sign.
template <class T>
void check_matches(const sc::Tensor& got, const sc::Tensor& want) {
  REQUIRE(got.shape() == want.shape());
  REQUIRE(got.dtype() == want.dtype());
  const std::vector<T> a = got.to_vector<T>(), b = want.to_vector<T>();
  const std::size_t n = a.size();
  std::size_t bad = 0, first = n;
  const auto nan = [](T v) { return v != v; };
  for (std::size_t i = 0; i < n; ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0 && !(nan(a[i]) && nan(b[i])) && bad++ == 0) first = i;
  INFO("elements that differ: " << bad << " of " << n << "; first at " << first << ": fused "
                                << (first < n ? +a[first] : T()) << " eager " << (first < n ? +b[first] : T()));
  CHECK(bad == 0);
}

template <class T>
void check_program(const g::FusedProgram& p, const std::vector<sc::Tensor>& in) {
  const std::vector<sc::Tensor> got = fused_run(p, in), want = eager_run(p, in);
  REQUIRE(got.size() == want.size());
  for (std::size_t j = 0; j < got.size(); ++j) {
    INFO("output " << j);
    check_matches<T>(got[j], want[j]);
  }
}

/// Every op fusible over dtype d, in op-list order.
std::vector<OpId> fusible_ops(sc::DType d) {
  std::vector<OpId> ops;
  for (int i = 0; i < sc::ops::num_ops; ++i)
    if (g::fusible(static_cast<OpId>(i), d)) ops.push_back(static_cast<OpId>(i));
  return ops;
}

std::string name_of(OpId id) { return std::string(sc::ops::op_info(id).name); }

using sctest::fused::prepare_error;

}  // namespace

TEST_CASE("fusible: elementwise ops that keep the dtype, nothing else", "[fused]") {
  for (sc::DType d : {sc::f32, sc::f64})
    for (const char* n : {"add", "sub", "mul", "div", "pow", "maximum", "minimum", "neg", "abs", "exp", "log",
                          "sqrt", "tanh", "sigmoid", "relu", "square", "sign", "sin", "cos"}) {
      INFO(n << " over " << sc::name(d));
      CHECK(g::fusible(op(n), d));
    }
  for (sc::DType d : {sc::i32, sc::i64}) {
    for (const char* n : {"add", "sub", "mul", "pow", "maximum", "minimum", "neg", "abs", "relu", "square", "sign"})
      CHECK(g::fusible(op(n), d));
    for (const char* n : {"div", "exp", "log", "sqrt", "tanh", "sigmoid", "sin", "cos"})  // these return floats
      CHECK_FALSE(g::fusible(op(n), d));
  }
  for (sc::DType d : {sc::f32, sc::f64, sc::i32, sc::i64, sc::boolean})
    for (const char* n : {"less", "less_equal", "greater", "greater_equal", "equal", "not_equal", "logical_and",
                          "logical_or", "logical_not", "where", "cast", "sum", "matmul", "reshape", "broadcast_to"}) {
      INFO(n << " over " << sc::name(d));
      CHECK_FALSE(g::fusible(op(n), d));
    }
  CHECK(fusible_ops(sc::boolean).empty());
  CHECK_FALSE(g::fusible(static_cast<OpId>(sc::ops::num_ops), sc::f32));
  for (OpId id : fusible_ops(sc::f32)) CHECK((sc::ops::op_info(id).arity == 1 || sc::ops::op_info(id).arity == 2));
}

TEMPLATE_TEST_CASE("every fusible op alone equals the eager op", "[fused]", float, double, std::int32_t, std::int64_t) {
  using T = TestType;
  const sc::DType d = sc::dtype_of<T>();
  // (a program of few scratch slots, as these, runs tiles twice as long: both edges are tried)
  const std::int64_t tile = g::detail_fused::tile_elems<T>;
  const std::vector<OpId> ops = fusible_ops(d);
  REQUIRE(!ops.empty());
  for (std::int64_t n : {std::int64_t{1}, std::int64_t{7}, std::int64_t{67}, tile - 1, tile, tile + 1, 2 * tile - 1,
                         2 * tile, 2 * tile + 1, 3 * tile + 5, std::int64_t{100003}}) {
    const sc::Tensor x = make<T>({n}, 1), y = make<T>({n}, 2), s = make<T>({}, 3);
    for (OpId id : ops) {
      INFO(name_of(id) << " over " << sc::name(d) << ", n = " << n);
      if (sc::ops::op_info(id).arity == 1) {
        check_program<T>({d, {n}, {{n}}, {{id, 0}}, {1}}, {x});
        continue;
      }
      check_program<T>({d, {n}, {{n}, {n}}, {{id, 0, 1}}, {2}}, {x, y});
      check_program<T>({d, {n}, {{n}, {}}, {{id, 0, 1}}, {2}}, {x, s});   // a weak scalar on the right
      check_program<T>({d, {n}, {{}, {n}}, {{id, 0, 1}}, {2}}, {s, y});   // ... and on the left
      check_program<T>({d, {n}, {{n}}, {{id, 0, 0}}, {1}}, {x});          // one register twice
    }
  }
}

namespace {
/// A random program of `len` instructions over inputs x, y [R,C], s [] and, with `broadcast`,
/// w [C] and col [R,1]: each instruction reads one of the last few registers (so values chain)
/// and any other register.
template <class T>
g::FusedProgram random_program(int len, std::int64_t R, std::int64_t C, bool broadcast, std::uint64_t seed) {
  const sc::DType d = sc::dtype_of<T>();
  std::vector<OpId> ops;
  for (OpId id : fusible_ops(d)) {
    const std::string n = name_of(id);
    // Integer chains: no products, which overflow (undefined behaviour in the scalar rule).
    if (!std::is_floating_point_v<T> && (n == "mul" || n == "square" || n == "pow")) continue;
    // xsimd's sin and cos choose their argument reduction per batch (by the batch's largest
    // lane), so a lane's value depends on its neighbours; values of a broadcast input are
    // batched differently by the eager op (over the input's own shape): close, not bitwise.
    if (broadcast && (n == "sin" || n == "cos")) continue;
    ops.push_back(id);
  }
  g::FusedProgram p{d, {R, C}, {{R, C}, {R, C}, {}}, {}, {}};
  if (broadcast) p.input_shapes.insert(p.input_shapes.end(), {{C}, {R, 1}});
  const int nin = static_cast<int>(p.input_shapes.size());
  Rng r(seed);
  for (int k = 0; k < len; ++k) {
    const int nreg = nin + k;
    const OpId id = ops[r.next() % ops.size()];
    const int a = k == 0 ? static_cast<int>(r.next() % nin) : nreg - 1 - static_cast<int>(r.next() % std::min(3, k));
    const int b = static_cast<int>(r.next() % nreg);
    p.code.push_back({id, a, sc::ops::op_info(id).arity == 2 ? b : -1});
  }
  p.outputs = {nin + len - 1, nin + static_cast<int>(r.next() % len)};
  return p;
}
}  // namespace

TEMPLATE_TEST_CASE("chains of 2 to 16 ops equal the eager ops step by step", "[fused]", float, double, std::int32_t,
                   std::int64_t) {
  using T = TestType;
  // Extents are multiples of 64, so no eager loop has a scalar tail and every element must match.
  for (auto [R, C] : {std::pair<std::int64_t, std::int64_t>{64, 64}, {512, 128}})
    for (bool broadcast : {false, true}) {
      std::vector<sc::Tensor> in = {make<T>({R, C}, 11), make<T>({R, C}, 12), make<T>({}, 13)};
      if (broadcast) in.insert(in.end(), {make<T>({C}, 14), make<T>({R, 1}, 15)});
      for (int len = 2; len <= 16; ++len)
        for (std::uint64_t seed = 0; seed < 6; ++seed) {
          const g::FusedProgram p = random_program<T>(len, R, C, broadcast, seed * 100 + static_cast<std::uint64_t>(len));
          std::string code;
          for (const g::FusedInstr& c : p.code) {
            // appended piece by piece: GCC 12 at -O3 warns falsely (-Wrestrict) inside "," + std::string
            code += name_of(c.op) + "(" + std::to_string(c.a);
            if (c.b >= 0) code.append(",").append(std::to_string(c.b));
            code += ") ";
          }
          INFO("[" << R << "," << C << "] " << code);
          check_program<T>(p, in);
        }
    }
}

namespace {
/// tanh(x*a + b)*c - x/(1 + exp(-x)): registers x=0 a=1 b=2 c=3 one=4, result 13.
g::FusedProgram nine_op_chain(sc::DType d, sc::Shape out, sc::Shape abc) {
  return {d, out, {out, abc, abc, abc, {}},
          {{op("mul"), 0, 1}, {op("add"), 5, 2}, {op("tanh"), 6}, {op("mul"), 7, 3}, {op("neg"), 0},
           {op("exp"), 9}, {op("add"), 4, 10}, {op("div"), 0, 11}, {op("sub"), 8, 12}},
          {13}};
}
}  // namespace

TEMPLATE_TEST_CASE("the 9-op chain matches a plain loop and the eager ops", "[fused]", float, double) {
  using T = TestType;
  const sc::DType d = sc::dtype_of<T>();
  const std::int64_t tile = g::detail_fused::tile_elems<T>;
  // (with a, b, c scalars the program has few scratch slots and tiles twice as long; where it is
  // one chain over inputs in place, chain_tile_bytes long)
  const std::int64_t chain_tile = g::detail_fused::chain_tile_bytes / static_cast<std::int64_t>(sizeof(T));
  for (std::int64_t n : {std::int64_t{0}, std::int64_t{1}, std::int64_t{7}, tile - 1, tile + 1, 2 * tile - 1,
                         2 * tile + 1, chain_tile - 1, chain_tile + 1, 2 * chain_tile + 3, std::int64_t{100000}})
    for (bool scalars : {false, true}) {
      INFO("n = " << n << (scalars ? ", a b c scalars" : ", a b c tensors"));
      const sc::Shape abc = scalars ? sc::Shape{} : sc::Shape{n};
      const std::vector<sc::Tensor> in = {make<T>({n}, 1), make<T>(abc, 2), make<T>(abc, 3), make<T>(abc, 4),
                                          sc::full({}, 1.0, d)};
      const g::FusedProgram p = nine_op_chain(d, {n}, abc);
      const std::vector<T> got = fused_run(p, in)[0].template to_vector<T>();
      const std::vector<T> x = in[0].to_vector<T>(), a = in[1].to_vector<T>(), b = in[2].to_vector<T>(),
                           c = in[3].to_vector<T>();
      REQUIRE(got.size() == static_cast<std::size_t>(n));
      for (std::size_t i = 0; i < got.size(); ++i) {
        const std::size_t j = scalars ? 0 : i;
        const double xi = x[i], want = std::tanh(xi * a[j] + b[j]) * c[j] - xi / (1 + std::exp(-xi));
        INFO("element " << i);
        CHECK(got[i] == Approx(want).epsilon(std::is_same_v<T, float> ? 2e-6 : 1e-13).margin(std::is_same_v<T, float> ? 2e-6 : 1e-13));
      }
      check_program<T>(p, in);
    }
}

TEMPLATE_TEST_CASE("broadcast inputs: rows, columns, scalars, rank 0 and empty outputs", "[fused]", float, double) {
  using T = TestType;
  const sc::DType d = sc::dtype_of<T>();
  const OpId add = op("add"), mul = op("mul"), sub = op("sub"), mx = op("maximum"), tanh = op("tanh");
  // (out, inputs): the output shape and four inputs broadcast to it.
  const std::vector<std::pair<sc::Shape, std::vector<sc::Shape>>> cases = {
      {{5, 7}, {{5, 7}, {7}, {5, 1}, {}}},
      {{128, 256}, {{128, 256}, {256}, {128, 1}, {1, 256}}},
      {{300, 257}, {{257}, {300, 1}, {1}, {300, 257}}},           // rows that straddle tiles
      {{3, 4, 5}, {{3, 4, 5}, {4, 1}, {3, 1, 5}, {1, 1, 1}}},      // a column of a 3-D output
      {{2, 3, 1, 4}, {{3, 1, 1}, {2, 1, 1, 4}, {4}, {2, 3, 1, 4}}},
      {{64, 1000}, {{1000}, {64, 1}, {}, {1, 1000}}},              // no input of the output's shape
      {{1, 1, 9}, {{9}, {1, 9}, {1, 1, 1}, {1, 1, 9}}},
  };
  for (const auto& [out, shapes] : cases) {
    INFO("output " << out);
    std::vector<sc::Tensor> in;
    for (std::size_t i = 0; i < shapes.size(); ++i) in.push_back(make<T>(shapes[i], 20 + i));
    // ((in0 + in1) * in2 - in3), max with in1, tanh of that, and every input itself as an output.
    const g::FusedProgram p{d, out, shapes, {{add, 0, 1}, {mul, 4, 2}, {sub, 5, 3}, {mx, 6, 1}, {tanh, 7}},
                            {8, 6, 0, 1, 2, 3}};
    check_program<T>(p, in);
  }
  SECTION("rank-0 output: the scalar rule, as the eager ops on one element") {
    const std::vector<sc::Tensor> in = {make<T>({}, 1), make<T>({}, 2)};
    const g::FusedProgram p{d, {}, {{}, {}}, {{mul, 0, 1}, {tanh, 2}, {add, 3, 0}}, {4, 3}};
    const auto got = fused_run(p, in), want = eager_run(p, in);
    CHECK(got[0].shape() == sc::Shape{});
    CHECK(got[0].item<T>() == want[0].item<T>());
    CHECK(got[1].item<T>() == want[1].item<T>());
  }
  SECTION("one-element inputs against a larger output") {
    const std::vector<sc::Tensor> in = {make<T>({1}, 1), make<T>({1, 1}, 2), make<T>({2, 37}, 3)};
    const g::FusedProgram p{d, {2, 37}, {{1}, {1, 1}, {2, 37}}, {{tanh, 0}, {mul, 3, 1}, {add, 4, 2}}, {5, 4, 3}};
    check_program<T>(p, in);
  }
  SECTION("empty outputs") {
    const std::vector<sc::Tensor> in = {make<T>({0, 5}, 1), make<T>({5}, 2), make<T>({}, 3)};
    const g::FusedProgram p{d, {0, 5}, {{0, 5}, {5}, {}}, {{add, 0, 1}, {mul, 3, 2}}, {4}};
    const auto got = fused_run(p, in);
    CHECK(got[0].shape() == sc::Shape{0, 5});
  }
}

TEMPLATE_TEST_CASE("an output may share its buffer with an input of the same shape", "[fused]", float, double) {
  using T = TestType;
  const sc::DType d = sc::dtype_of<T>();
  const std::int64_t tile = g::detail_fused::tile_elems<T>;
  for (std::int64_t n : {std::int64_t{7}, tile + 3, std::int64_t{200000}}) {
    INFO("n = " << n);
    std::vector<sc::Tensor> in = {make<T>({n}, 1), make<T>({n}, 2), make<T>({n}, 3), make<T>({n}, 4),
                                  sc::full({}, 1.0, d)};
    const g::FusedProgram p = nine_op_chain(d, {n}, {n});  // reads x (input 0) in its first and last steps
    const std::vector<T> want = fused_run(p, in)[0].template to_vector<T>();
    const std::vector<T> x0 = in[0].to_vector<T>(), c0 = in[3].to_vector<T>();
    SECTION("into x") {
      std::vector<sc::Tensor> out = {in[0]};
      g::run_fused(p, in, out);
      CHECK(in[0].to_vector<T>() == want);
    }
    SECTION("into c, with x copied out too, and the result written twice") {
      g::FusedProgram q = p;
      q.outputs = {13, 0, 13, 3};
      std::vector<sc::Tensor> out = {in[3], sc::zeros({n}, d), in[0], sc::zeros({n}, d)};
      g::run_fused(q, in, out);
      CHECK(out[0].to_vector<T>() == want);
      CHECK(out[1].to_vector<T>() == x0);
      CHECK(out[2].to_vector<T>() == want);
      CHECK(out[3].to_vector<T>() == c0);
    }
  }
  SECTION("a broadcast input may not share the output's memory") {
    std::vector<T> buf(20);
    const sc::Tensor whole = sc::from_blob(buf.data(), {4, 5}, d), row = sc::from_blob(buf.data(), {5}, d);
    std::vector<sc::Tensor> out = {whole};
    const g::FusedProgram p{d, {4, 5}, {{5}}, {{op("neg"), 0}}, {1}};
    CHECK_THROWS_WITH(g::run_fused(p, {&row, 1}, out), Catch::Contains("[fused] input 0 is broadcast"));
  }
}

TEST_CASE("a prepared program runs many times, on one thread or all", "[fused]") {
  const g::FusedProgram p = nine_op_chain(sc::f32, {50000}, {});
  const g::PreparedFused pf = g::prepare(p);
  for (std::uint64_t seed = 1; seed <= 3; ++seed) {
    const std::vector<sc::Tensor> in = {make<float>({50000}, seed), make<float>({}, seed + 1),
                                        make<float>({}, seed + 2), make<float>({}, seed + 3), sc::full({}, 1.0, sc::f32)};
    std::vector<sc::Tensor> out = {sc::zeros({50000})};
    g::run(pf, in, out);
    const auto want = eager_run(p, in);
    check_matches<float>(out[0], want[0]);
    std::vector<sc::Tensor> out1 = {sc::zeros({50000})};
    {
      const sctest::ThreadCount one(1);
      g::run(pf, in, out1);
    }
    CHECK(out1[0].to_vector<float>() == out[0].to_vector<float>());
    for (std::int64_t tile : {1, 100, 64, 100000}) {  // any tile size gives the same elements
      g::PreparedFused q = pf;
      q.tile = tile;
      std::vector<sc::Tensor> out2 = {sc::zeros({50000})};
      g::run(q, in, out2);
      INFO("tile " << tile);
      CHECK(out2[0].to_vector<float>() == out[0].to_vector<float>());
    }
  }
}

// A program's grain is its ops' costs summed (1 for add, 8 for exp or an integer pow, 64 for a
// 64-bit mod: the grains their eager loops take, ops::Binary::grain_of), down to the heavy grain.
TEST_CASE("a program's parallel grain: its ops' costs summed, the eager loops' grains alone", "[fused][threads]") {
  namespace cpu = sc::backend::cpu;
  STATIC_REQUIRE(sc::ops::Add::grain_of<float>() == cpu::grain_cheap);
  STATIC_REQUIRE(sc::ops::Pow::grain_of<float>() == cpu::grain_costly);     // SIMD forms (general: by exponent)
  STATIC_REQUIRE(sc::ops::Pow::grain_of<std::int32_t>() == cpu::grain_costly);  // squarings on batches
  STATIC_REQUIRE(sc::ops::Mod::grain_of<std::int64_t>() == cpu::grain_heavy);  // an integer division a lane
  STATIC_REQUIRE(sc::ops::Mod::grain_of<std::int32_t>() ==
                 (sc::rules::math::divides_in_double<std::int32_t> ? cpu::grain_costly : cpu::grain_heavy));
  const auto grain = [](sc::DType d, std::vector<g::FusedInstr> code) {
    const int last = static_cast<int>(code.size()) + 1;
    return g::prepare(g::FusedProgram{d, {1000}, {{1000}, {1000}}, std::move(code), {last}}).grain;
  };
  CHECK(grain(sc::f32, {{op("add"), 0, 1}}) == cpu::grain_cheap);
  CHECK(grain(sc::f32, {{op("exp"), 0}}) == cpu::grain_costly);
  CHECK(grain(sc::f32, {{op("exp"), 0}, {op("exp"), 2}, {op("exp"), 3}}) == cpu::grain_cheap / 24);
  CHECK(grain(sc::i64, {{op("mod"), 0, 1}}) == cpu::grain_heavy);
  CHECK(grain(sc::i32, {{op("pow"), 0, 1}, {op("add"), 2, 0}}) == cpu::grain_cheap / 9);
}

TEST_CASE("integer and bool programs", "[fused]") {
  SECTION("i32: integer pow on batches, sign, mul, abs, sub") {
    const std::vector<sc::Tensor> in = {make<std::int32_t>({1000}, 1), make<std::int32_t>({1000}, 2),
                                        sc::full({}, 3.0, sc::i32)};
    const g::FusedProgram p{sc::i32, {1000}, {{1000}, {1000}, {}},
                            {{op("pow"), 0, 2}, {op("sign"), 1}, {op("mul"), 3, 4}, {op("abs"), 5}, {op("sub"), 6, 0}},
                            {7}};
    check_program<std::int32_t>(p, in);
  }
  SECTION("bool: no instruction, but inputs copied and broadcast to outputs") {
    const sc::Tensor a = sc::tensor({true, false, true}), b = sc::tensor({{true}, {false}});
    const g::FusedProgram p{sc::boolean, {2, 3}, {{3}, {2, 1}}, {}, {0, 1}};
    std::vector<sc::Tensor> out = {sc::zeros({2, 3}, sc::boolean), sc::zeros({2, 3}, sc::boolean)};
    g::run_fused(p, std::vector<sc::Tensor>{a, b}, out);
    CHECK(out[0].to_vector<bool>() == std::vector<bool>{true, false, true, true, false, true});
    CHECK(out[1].to_vector<bool>() == std::vector<bool>{true, true, true, false, false, false});
  }
}

TEST_CASE("invalid programs and tensors are named errors", "[fused][errors]") {
  const OpId add = op("add"), neg = op("neg");
  CHECK_THAT(prepare_error({sc::f32, {4}, {{4}}, {{add, 0, 1}}, {1}}), Catch::Contains("instruction 0: an operand"));
  CHECK_THAT(prepare_error({sc::f32, {4}, {{4}}, {{neg, 0, 0}}, {1}}), Catch::Contains("neg takes 1 operand"));
  CHECK_THAT(prepare_error({sc::f32, {4}, {{4}}, {{add, 0}}, {1}}), Catch::Contains("add takes 2 operand"));
  CHECK_THAT(prepare_error({sc::f32, {4}, {{4}}, {{op("less"), 0, 0}}, {1}}),
             Catch::Contains("op 'less' is not an elementwise op that keeps the dtype f32"));
  CHECK_THAT(prepare_error({sc::i32, {4}, {{4}}, {{op("exp"), 0}}, {1}}),
             Catch::Contains("'exp' is not an elementwise op that keeps the dtype i32"));
  CHECK_THAT(prepare_error({sc::f32, {4}, {{3}}, {{neg, 0}}, {1}}), Catch::Contains("input 0 of shape [3] does not broadcast"));
  CHECK_THAT(prepare_error({sc::f32, {4}, {{4, 1}}, {}, {0}}), Catch::Contains("does not broadcast to the output shape [4]"));
  CHECK_THAT(prepare_error({sc::f32, {4}, {{4}}, {{neg, 0}}, {2}}), Catch::Contains("output register 2 does not exist"));

  const g::FusedProgram p{sc::f32, {4}, {{4}}, {{neg, 0}}, {1}};
  std::vector<sc::Tensor> out = {sc::zeros({4})};
  CHECK_THROWS_AS(g::run_fused(p, std::vector<sc::Tensor>{sc::zeros({4}, sc::f64)}, out), sc::DTypeError);
  CHECK_THROWS_AS(g::run_fused(p, std::vector<sc::Tensor>{sc::zeros({5})}, out), sc::ShapeError);
  CHECK_THROWS_AS(g::run_fused(p, std::vector<sc::Tensor>{}, out), sc::ValueError);
  std::vector<sc::Tensor> wrong = {sc::zeros({2, 2})};
  CHECK_THROWS_WITH(g::run_fused(p, std::vector<sc::Tensor>{sc::zeros({4})}, wrong),
                    Catch::Contains("[fused] output 0 has shape [2, 2], the program expects [4]"));
}

// ---- a reduction as the consumer ------------------------------------------------------------

namespace {

/// The reference: reg's values (from the eager ops) reduced over the trailing `inner` elements by
/// plain loops in long double (sum) or by comparisons (max, min; NaN wins).
template <class T>
std::vector<T> reduce_reference(const std::vector<T>& x, std::int64_t inner, OpId rop) {
  std::vector<T> out;
  for (std::size_t r0 = 0; r0 < x.size(); r0 += static_cast<std::size_t>(inner)) {
    long double s = 0;
    T m = x[r0];
    for (std::int64_t k = 0; k < inner; ++k) {
      const T v = x[r0 + static_cast<std::size_t>(k)];
      s += v;
      if (std::isnan(v) || std::isnan(m)) m = std::isnan(m) ? m : v;
      else if (rop == op("max") ? v > m : v < m) m = v;
    }
    out.push_back(rop == op("sum") ? static_cast<T>(s) : m);
  }
  return out;
}

/// p's elementwise outputs equal the eager ops bit for bit; its reduction equals the reference
/// (max/min exactly, sums within rounding of the row's absolute sum).
template <class T>
void check_reduction(const g::FusedProgram& p, const std::vector<sc::Tensor>& in) {
  const g::FusedReduction& rd = *p.reduction;
  std::vector<sc::Tensor> out;
  for (std::size_t j = 0; j < p.outputs.size(); ++j) out.push_back(sc::full(p.out_shape, -7.0, p.dtype));
  out.push_back(sc::full(rd.out_shape, -7.0, p.dtype));
  g::run_fused(p, in, out);
  g::FusedProgram q = p;  // the reduced register's values, through the eager ops
  q.reduction.reset();
  q.outputs.push_back(rd.reg);
  const std::vector<sc::Tensor> want = eager_run(q, in);
  for (std::size_t j = 0; j < p.outputs.size(); ++j) check_matches<T>(out[j], want[j]);
  const std::vector<T> x = want.back().to_vector<T>();
  const std::vector<T> ref = reduce_reference<T>(x, rd.inner, rd.op);
  const std::vector<T> got = out.back().to_vector<T>();
  REQUIRE(got.size() == ref.size());
  for (std::size_t r = 0; r < ref.size(); ++r) {
    INFO("row " << r << " of " << ref.size() << ", inner " << rd.inner);
    if (rd.op == op("sum")) {
      double abs_sum = 0;
      for (std::int64_t k = 0; k < rd.inner; ++k) abs_sum += std::fabs(static_cast<double>(x[r * rd.inner + k]));
      const double eps = std::is_same_v<T, float> ? 1e-6 : 1e-14;
      CHECK(std::fabs(static_cast<double>(got[r]) - static_cast<double>(ref[r])) <= eps * (abs_sum + 1));
    } else {
      CHECK((std::memcmp(&got[r], &ref[r], sizeof(T)) == 0 || (std::isnan(got[r]) && std::isnan(ref[r]))));
    }
  }
}

}  // namespace

TEMPLATE_TEST_CASE("a reduction consumes the program's register tile by tile", "[fused][reduce]", float, double) {
  using T = TestType;
  const sc::DType d = sc::dtype_of<T>();
  // tanh(x * a) - b, reduced over trailing axes: rows shorter than a tile, rows of many tiles
  // and several reduction chunks, one row (a full reduction), a broadcast input.
  struct Case {
    sc::Shape shape, b_shape;
    std::int64_t inner;
  };
  const std::vector<Case> cases = {
      {{64, 10}, {64, 10}, 10},         {{64, 10}, {10}, 640},         {{3, 5000}, {3, 1}, 5000},
      {{2, 40000}, {2, 40000}, 40000}, {{100000}, {1}, 100000},       {{4, 3, 700}, {3, 700}, 2100},
      {{5, 7}, {5, 7}, 7},              {{1, 1}, {1, 1}, 1},
  };
  std::uint64_t seed = 40;
  for (const Case& c : cases)
    for (const char* rname : {"sum", "max", "min"}) {
      const std::vector<sc::Tensor> in = {make<T>(c.shape, ++seed), make<T>(c.shape, ++seed), make<T>(c.b_shape, ++seed)};
      g::FusedProgram p{d, c.shape, {c.shape, c.shape, c.b_shape}, {{op("mul"), 0, 1}, {op("tanh"), 3}, {op("sub"), 4, 2}}, {}};
      sc::Shape rows_shape;
      std::int64_t rows = c.shape.numel() / c.inner;
      rows_shape.push_back(rows);
      p.reduction = g::FusedReduction{op(rname), 5, c.inner, rows_shape};
      INFO(rname << " over " << c.inner << " trailing elements of " << c.shape);
      check_reduction<T>(p, in);
      p.outputs = {3, 5};  // the reduced register written out as well, and another one
      check_reduction<T>(p, in);
    }
}

TEST_CASE("a fused max or min propagates NaN like the eager reduction", "[fused][reduce]") {
  std::vector<float> x(3000, 1.f);
  x[1700] = std::nanf("");
  const sc::Tensor in = sc::tensor(x, sc::Shape{3, 1000});
  for (const char* rname : {"max", "min"}) {
    g::FusedProgram p{sc::f32, {3, 1000}, {{3, 1000}}, {{op("neg"), 0}}, {}};
    p.reduction = g::FusedReduction{op(rname), 1, 1000, {3}};
    std::vector<sc::Tensor> out = {sc::zeros({3})};
    g::run_fused(p, std::vector<sc::Tensor>{in}, out);
    const auto r = out[0].to_vector<float>();
    CHECK(r[0] == -1.f);
    CHECK(std::isnan(r[1]));
    CHECK(r[2] == -1.f);
  }
}

TEST_CASE("a max or min of sin or cos over rows off the batch boundaries gives eager's bits", "[fused][reduce]") {
  // xsimd reduces a batch's sin and cos arguments by the method its largest |x| needs, so a lane's
  // last bit depends on its neighbours: rows of 3 or 5 reduced tile by tile from their own start
  // would batch other elements together than the eager op's flat loop.
  for (std::int64_t n : {40, 513, 3000}) {
    for (std::int64_t w : {3, 5}) {
      std::vector<float> x(static_cast<std::size_t>(n * w));
      for (std::size_t i = 0; i < x.size(); ++i) x[i] = i % 11 == 0 ? 1e30f : (i % 7 == 3 ? 3e9f : std::sin(float(i)) * 3);
      const sc::Tensor in = sc::tensor(x, sc::Shape{n, w});
      for (const char* uname : {"sin", "cos"}) {
        const sc::Tensor u = eager_table[static_cast<std::size_t>(op(uname))](in, sc::Tensor());
        for (const char* rname : {"max", "min"}) {
          g::FusedProgram p{sc::f32, {n, w}, {{n, w}}, {{op(uname), 0}}, {}};
          p.reduction = g::FusedReduction{op(rname), 1, w, {n}};
          std::vector<sc::Tensor> out = {sc::zeros({n})};
          g::run_fused(p, std::vector<sc::Tensor>{in}, out);
          const std::vector<float> got = out[0].to_vector<float>();
          const std::vector<float> want = (std::string_view(rname) == "max" ? sc::max(u, {-1}) : sc::min(u, {-1})).to_vector<float>();
          INFO(rname << "(" << uname << ") over rows of " << w << ", " << n << " rows");
          CHECK(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0);
        }
      }
    }
  }
}

TEST_CASE("a reduction's results do not depend on the thread count", "[fused][reduce]") {
  const std::vector<sc::Tensor> in = {make<float>({300000}, 5)};
  g::FusedProgram p{sc::f32, {300000}, {{300000}}, {{op("exp"), 0}}, {}};
  p.reduction = g::FusedReduction{op("sum"), 1, 300000, {}};
  std::vector<float> got;
  sctest::at_threads({1, 2, 3}, [&](int) {
    std::vector<sc::Tensor> out = {sc::zeros({})};
    g::run_fused(p, in, out);
    got.push_back(out[0].item<float>());
  });
  CHECK(got[0] == got[1]);
  CHECK(got[0] == got[2]);
}

TEST_CASE("invalid reductions are named errors", "[fused][reduce][errors]") {
  g::FusedProgram p{sc::f32, {4, 6}, {{4, 6}}, {{op("neg"), 0}}, {}};
  p.reduction = g::FusedReduction{op("sum"), 1, 6, {4}};
  CHECK(prepare_error(p) == "no error");
  p.reduction->op = op("neg");
  CHECK_THAT(prepare_error(p), Catch::Contains("a reduction is sum, max or min"));
  p.reduction->op = op("sum");
  p.reduction->inner = 5;
  CHECK_THAT(prepare_error(p), Catch::Contains("a reduction over 5 trailing elements of [4, 6] cannot give shape [4]"));
  p.reduction->inner = 6;
  p.reduction->reg = 9;
  CHECK_THAT(prepare_error(p), Catch::Contains("the reduced register 9 does not exist"));
  p.reduction->reg = 1;
  g::FusedProgram q{sc::f32, {4, 6}, {{1}}, {{op("neg"), 0}}, {}};
  q.reduction = g::FusedReduction{op("sum"), 1, 6, {4}};
  CHECK_THAT(prepare_error(q), Catch::Contains("the reduced register is one value"));
  g::FusedProgram ints{sc::i32, {4}, {{4}}, {{op("neg"), 0}}, {}};
  ints.reduction = g::FusedReduction{op("sum"), 1, 4, {}};
  CHECK_THAT(prepare_error(ints), Catch::Contains("floating dtypes only"));
  // The reduction's output tensor is checked like the others.
  std::vector<sc::Tensor> out = {sc::zeros({5})};
  CHECK_THROWS_AS(g::run_fused(p, std::vector<sc::Tensor>{sc::zeros({4, 6})}, out), sc::ShapeError);
  std::vector<sc::Tensor> none;
  CHECK_THROWS_AS(g::run_fused(p, std::vector<sc::Tensor>{sc::zeros({4, 6})}, none), sc::ValueError);
}

TEST_CASE("inputs read through windows of larger tensors (absorbed slices) equal plain loops", "[fused][window]") {
  // out = (A + B) * Cw * s: A a [R, C] window of a larger tensor, Cw a one-row window broadcast
  // over the rows, s one element of a third; the reference walks the parents by hand.
  constexpr std::int64_t R = 37, C = 45;
  std::vector<float> pa((R + 3) * (C + 5)), b(R * C), pc(4 * (C + 2)), ps(9);
  Rng r(21);
  for (auto* v : {&pa, &b, &pc, &ps})
    for (float& x : *v) x = static_cast<float>(static_cast<int>(r.next() % 2001) - 1000) / 64.f;
  const sc::Tensor ta = sc::tensor(pa, sc::Shape{R + 3, C + 5}), tb = sc::tensor(b, sc::Shape{R, C}),
                   tc = sc::tensor(pc, sc::Shape{4, C + 2}), ts = sc::tensor(ps, sc::Shape{3, 3});
  g::FusedProgram p{sc::f32, {R, C}, {{R, C}, {R, C}, {1, C}, {1, 1}}, {}, {}};
  p.code = {{OpId::Add, 0, 1}, {OpId::Mul, 4, 2}, {OpId::Mul, 5, 3}};
  p.outputs = {6, 4};
  p.windows = {{{R + 3, C + 5}, {2, 3}}, {}, {{4, C + 2}, {1, 2}}, {{3, 3}, {2, 1}}};
  std::vector<float> want(R * C), sum(R * C);
  for (std::int64_t i = 0; i < R; ++i)
    for (std::int64_t j = 0; j < C; ++j) {
      const float s = pa[(i + 2) * (C + 5) + j + 3] + b[i * C + j];
      sum[i * C + j] = s;
      want[i * C + j] = s * pc[1 * (C + 2) + j + 2] * ps[2 * 3 + 1];
    }
  for (std::int64_t tile : {std::int64_t{0}, std::int64_t{16}, std::int64_t{5}}) {
    INFO("tile " << tile);
    g::PreparedFused pf = g::prepare(p);
    if (tile > 0) pf.tile = tile;
    std::vector<sc::Tensor> out = {sc::zeros({R, C}), sc::zeros({R, C})};
    const std::vector<sc::Tensor> in = {ta, tb, tc, ts};
    g::run(pf, in, out);
    CHECK(out[0].to_vector<float>() == want);
    CHECK(out[1].to_vector<float>() == sum);
  }
  // The tensors passed are the parents: a tensor of the window's shape is an error, as is a
  // window reaching outside its parent.
  std::vector<sc::Tensor> out = {sc::zeros({R, C}), sc::zeros({R, C})};
  const std::vector<sc::Tensor> small = {tb, tb, tc, ts};
  CHECK_THROWS_WITH(g::run_fused(p, small, out), Catch::Contains("input 0"));
  g::FusedProgram bad = p;
  bad.windows[0].begin = {4, 3};
  CHECK_THROWS_WITH(g::prepare(bad), Catch::Contains("is not a window of [40, 50] at [4, 3]"));
  bad.windows.pop_back();
  CHECK_THROWS_WITH(g::prepare(bad), Catch::Contains("3 windows for 4 inputs"));
}

// ---- inputs formed as small products (FusedProduct) ------------------------------------------

namespace {

/// C = op(A) op(B) by plain loops (A [M, K] or [K, M] with ta, B [K, N] or [N, K] with tb), summed in double.
template <class T>
std::vector<double> plain_product(const std::vector<T>& a, const std::vector<T>& b, std::int64_t m, std::int64_t k,
                                  std::int64_t n, bool ta, bool tb) {
  std::vector<double> c(static_cast<std::size_t>(m * n), 0.0);
  for (std::int64_t i = 0; i < m; ++i)
    for (std::int64_t j = 0; j < n; ++j)
      for (std::int64_t t = 0; t < k; ++t)
        c[static_cast<std::size_t>(i * n + j)] += static_cast<double>(a[static_cast<std::size_t>(ta ? t * m + i : i * k + t)]) *
                                                  static_cast<double>(b[static_cast<std::size_t>(tb ? j * k + t : t * n + j)]);
  return c;
}

}  // namespace

TEMPLATE_TEST_CASE("inputs formed as small products, plain or read through windows, equal plain loops",
                   "[fused][product]", float, double) {
  using T = TestType;
  const sc::DType d = sc::dtype_of<T>();
  constexpr std::int64_t M = 3, K = 19, N = 4 * 7;  // the product [3, 28] read as four [3, 7] gate windows
  for (int flags = 0; flags < 4; ++flags) {
    const bool ta = (flags & 1) != 0, tb = (flags & 2) != 0;
    INFO("ta " << ta << " tb " << tb);
    const sc::Shape as = ta ? sc::Shape{K, M} : sc::Shape{M, K}, bs = tb ? sc::Shape{N, K} : sc::Shape{K, N};
    const std::vector<T> av = values<T>(as.numel(), 3 + flags), bv = values<T>(bs.numel(), 7 + flags),
                         xv = values<T>(M * 7, 11);
    const std::vector<double> c = plain_product(av, bv, M, K, N, ta, tb);
    // out = (w0 * w1 + w2) * x - w3, where w_g is window g of the product (columns 7g..7g+6), and
    // a second program reading the whole product [3, 28] plus a row broadcast, its rows summed
    g::FusedProgram p{d, {M, 7}, {{M, 7}, {M, 7}, {M, 7}, {M, 7}, {M, 7}, bs}, {}, {}};
    p.code = {{OpId::Mul, 0, 1}, {OpId::Add, 6, 2}, {OpId::Mul, 7, 4}, {OpId::Sub, 8, 3}};
    p.outputs = {9, 6};
    for (int w = 0; w < 4; ++w) p.windows.push_back({{M, N}, {0, 7 * w}});
    p.windows.resize(6);
    p.products.resize(6);
    for (int w = 0; w < 4; ++w) p.products[static_cast<std::size_t>(w)] = {as, 5, ta, tb, false};
    p.products[5].operand = true;
    const sc::Tensor A = sc::tensor(av, as), B = sc::tensor(bv, bs), X = sc::tensor(xv, sc::Shape{M, 7});
    std::vector<sc::Tensor> out = {sc::full({M, 7}, -7.0, d), sc::full({M, 7}, -7.0, d)};
    g::run_fused(p, std::vector<sc::Tensor>{A, A, A, A, X, B}, out);
    const std::vector<T> got = out[0].to_vector<T>(), prod = out[1].to_vector<T>();
    const double tol = d == sc::f32 ? 1e-4 : 1e-11;
    for (std::int64_t i = 0; i < M; ++i)
      for (std::int64_t j = 0; j < 7; ++j) {
        auto w = [&](int g) { return c[static_cast<std::size_t>(i * N + 7 * g + j)]; };
        const double want = (w(0) * w(1) + w(2)) * static_cast<double>(xv[static_cast<std::size_t>(i * 7 + j)]) - w(3);
        INFO("element " << i << ", " << j);
        CHECK(static_cast<double>(got[static_cast<std::size_t>(i * 7 + j)]) == Approx(want).epsilon(tol).margin(tol));
        CHECK(static_cast<double>(prod[static_cast<std::size_t>(i * 7 + j)]) == Approx(w(0) * w(1)).epsilon(tol).margin(tol));
      }

    g::FusedProgram q{d, {M, N}, {{M, N}, {N}, bs}, {{OpId::Add, 0, 1}}, {3}};
    q.products = {{as, 2, ta, tb, false}, {}, {{}, -1, false, false, true}};
    q.reduction = g::FusedReduction{OpId::Sum, 3, N, sc::Shape{M}};
    const std::vector<T> rv = values<T>(N, 13);
    std::vector<sc::Tensor> out2 = {sc::zeros({M, N}, d), sc::zeros({M}, d)};
    g::run_fused(q, std::vector<sc::Tensor>{A, sc::tensor(rv, sc::Shape{N}), B}, out2);
    const std::vector<T> sum = out2[0].to_vector<T>(), rows = out2[1].to_vector<T>();
    for (std::int64_t i = 0; i < M; ++i) {
      double row = 0;
      for (std::int64_t j = 0; j < N; ++j) {
        const double e = c[static_cast<std::size_t>(i * N + j)] + static_cast<double>(rv[static_cast<std::size_t>(j)]);
        row += e;
        CHECK(static_cast<double>(sum[static_cast<std::size_t>(i * N + j)]) == Approx(e).epsilon(tol).margin(tol));
      }
      CHECK(static_cast<double>(rows[static_cast<std::size_t>(i)]) == Approx(row).epsilon(tol).margin(tol * 10));
    }
  }
}

TEST_CASE("a product is formed as the eager matmul forms it: bit for bit", "[fused][product]") {
  const sc::Tensor A = make<float>({5, 64}, 1), B = make<float>({64, 256}, 2);
  g::FusedProgram p{sc::f32, {5, 256}, {{5, 256}, {64, 256}}, {{OpId::Tanh, 0}}, {2}};
  p.products = {{{5, 64}, 1, false, false, false}, {{}, -1, false, false, true}};
  std::vector<sc::Tensor> out = {sc::zeros({5, 256})};
  g::run_fused(p, std::vector<sc::Tensor>{A, B}, out);
  check_matches<float>(out[0], sc::tanh(sc::matmul(A, B)));
}

TEST_CASE("invalid products are named errors", "[fused][product][errors]") {
  const OpId add = op("add"), neg = op("neg");
  // out [2, 5] = neg(A [2, 3] x B [3, 5])
  g::FusedProgram p{sc::f32, {2, 5}, {{2, 5}, {3, 5}}, {{neg, 0}}, {2}};
  p.products = {{{2, 3}, 1, false, false, false}, {{}, -1, false, false, true}};
  CHECK(prepare_error(p) == "no error");
  g::FusedProgram q = p;
  q.products[0].a = {2, 4};
  CHECK_THAT(prepare_error(q), Catch::Contains("input 0: op([2, 4]) op([3, 5]) is not a product of shape [2, 5]"));
  q = p;
  q.products[0].tb = true;
  CHECK_THAT(prepare_error(q), Catch::Contains("is not a product of shape"));
  q = p;
  q.products[1].operand = false;
  CHECK_THAT(prepare_error(q), Catch::Contains("its operand B (input 1) is not an operand input"));
  q = p;
  q.code = {{add, 0, 1}};
  CHECK_THAT(prepare_error(q), Catch::Contains("instruction 0 reads an operand input"));
  q = p;
  q.outputs = {1};
  CHECK_THAT(prepare_error(q), Catch::Contains("output register 1 is an operand input"));
  q = p;
  q.products.pop_back();
  CHECK_THAT(prepare_error(q), Catch::Contains("1 product entries for 2 inputs"));
  q = p;
  q.dtype = sc::i32;
  CHECK_THAT(prepare_error(q), Catch::Contains("products run over floating dtypes only"));
  // the tensors passed: A in the product's slot, B in the operand's
  std::vector<sc::Tensor> out = {sc::zeros({2, 5})};
  CHECK_THROWS_WITH(g::run_fused(p, std::vector<sc::Tensor>{sc::zeros({2, 5}), sc::zeros({3, 5})}, out),
                    Catch::Contains("input 0"));
  CHECK_NOTHROW(g::run_fused(p, std::vector<sc::Tensor>{sc::zeros({2, 3}), sc::zeros({3, 5})}, out));
}
