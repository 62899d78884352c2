// sc::compile(generic_lambda): calling the result with Tensors instantiates the lambda with
// staged placeholders, so the whole graph is the lambda's deduced return type, then binds the
// tensors and evaluates it as one fused loop. g.graph(x, ...) lowers the type to the runtime IR
// (graph/ir.hpp) by tracing its op-by-op form; sc::grad<I>(g) is the compiled derivative.
#pragma once
#include <array>
#include <functional>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "../graph/function.hpp"
#include "api.hpp"
#include "grad.hpp"

namespace stagecraft {

template <class F, unsigned DS = staging::default_set>
class Compiled;

namespace staging {
/// The body of a compiled function's traced form (its GPU path): N tensors in, the expression's
/// value out. Not a template of the expression, so every compiled function of N arguments
/// shares one sc::function type (instantiating sc::function once per expression cost about a
/// second of -O2 compile time each).
template <int N>
struct TracedBody {
  std::function<Tensor(const std::array<Tensor, N>&)> run;
  template <class... T>
    requires(sizeof...(T) == N)
  Tensor operator()(const T&... ts) const {
    return run(std::array<Tensor, N>{Tensor(ts)...});
  }
};

/// The derivative of sum(f(args...)) with respect to argument I, as a staged function.
template <int I, class F>
struct GradFn {
  F f;
  // constrained, so Compiled::takes<N>() asks the function itself rather than instantiating this
  template <class... X>
    requires std::is_invocable_v<const F&, const X&...>
  auto operator()(const X&... x) const {
    static_assert(I < static_cast<int>(sizeof...(X)), "stagecraft: sc::grad<I>: I is not an argument of the function");
    const auto e = f(x...);
    return wrap(make_grad<I>(e.node));
  }
  /// make_grad drops a sum at the root (the sum of a sum is the sum), and its axes with it: for
  /// an elementwise operand, check them as the forward sum does (an axis out of range or named
  /// twice is eager's ShapeError). An operand with a materialized op would have to be computed
  /// to know its shape: there the axes are not checked.
  template <int N, unsigned DS>
  void check(const std::array<Tensor, N>& args, const std::source_location& loc) const {
    if constexpr (requires { f.template check<N, DS>(args, loc); }) f.template check<N, DS>(args, loc);
    const auto e = [&]<int... K>(std::integer_sequence<int, K...>) {
      return f(staged<Arg<K>>{}...);
    }(std::make_integer_sequence<int, N>{});
    using E = typename decltype(e)::node_type;
    if constexpr (sum_root<E>::value) check_forward<N, DS>(std::get<0>(e.node.args), args, loc);
    else check_forward<N, DS>(e.node, args, loc);
    if constexpr (sum_root<E>::value) check_sum_axes<N, DS>(e.node, args, loc);
    check_argument<N>(args, loc);
  }
  /// As the tape, which refuses an integer or bool source after running the forward (the
  /// derivative would be computed in the argument's dtype, truncated): each derivative's argument
  /// (of grad<I>(grad<J>(g)): I and J).
  template <int N>
  void check_argument(const std::array<Tensor, N>& args, const std::source_location& loc) const {
    if constexpr (requires { f.template check_argument<N>(args, loc); }) f.template check_argument<N>(args, loc);
    const Tensor& x = args[static_cast<std::size_t>(I)];
    if (!is_floating(x.dtype()))
      detail::fail<DTypeError>("grad", loc, "argument ", I, " has dtype ", name(x.dtype()),
                               "; gradients exist only for floating-point arguments");
  }
  template <int N, unsigned DS, class S>
  static void check_sum_axes(const S& sum, const std::array<Tensor, N>& args, const std::source_location& loc) {
    const auto& inner = std::get<0>(sum.args);
    if constexpr (!has_mat<std::remove_cvref_t<decltype(inner)>>()) {
      if (sum.m.axes.empty()) return;
      Shape shape;
      if (!own_shape<N>(inner, Env<N, DS>{args, loc}, shape)) return;  // the gradient raises it
      bool mask[max_rank];
      ops::reduced_mask(Shape(sum.m.axes), shape, "sum", loc, mask);
    }
  }
  /// Arguments of different floating dtypes: the derivative by a tape over the forward run op by
  /// op, so each op's adjoint is in its result's dtype as the tape computes it (the derivative
  /// expression's weak seed would compute d/dy of x * y + y for x f32 and y f64 as x + 1 in f32,
  /// then widen it). False where the arguments share a dtype (or one is an integer): the fused
  /// derivative then has the tape's dtypes.
  template <int N, unsigned DS>
  bool by_tape(const std::array<Tensor, N>& args, const std::source_location& loc, Tensor& out) const {
    if constexpr (N < 2) {
      (void)args, (void)loc, (void)out;
      return false;  // one argument, one dtype (the tape is not instantiated)
    } else {
      bool mixed = false, floating = true;
      for (const Tensor& t : args) {
        mixed = mixed || t.dtype() != args[0].dtype();
        floating = floating && is_floating(t.dtype());
      }
      if (!mixed || !floating) return false;
      std::array<Tensor, N> xs = args;
      xs[I] = reshape(xs[I], xs[I].shape(), loc);  // its own handle: the same tensor passed twice is two arguments
      GradientTape tape;
      tape.watch(xs[I], loc);
      // a derivative of a derivative: the inner one by its own tape, recorded on this one (nested
      // tapes), so every order has the tape's dtypes
      Tensor y;
      if constexpr (requires { f.template by_tape<N, DS>(xs, loc, y); }) {
        f.template by_tape<N, DS>(xs, loc, y);
      } else {
        const auto e = [&]<int... K>(std::integer_sequence<int, K...>) {
          return f(staged<Arg<K>>{}...);
        }(std::make_integer_sequence<int, N>{});
        y = staging::run<N>(e.node, Env<N, DS>{xs, loc});
      }
      require_floating(y.dtype(), loc);
      out = tape.gradient(y, xs[I], loc);
      return true;
    }
  }
  /// The errors a tape raises before it differentiates, which the derivative alone would not
  /// show: an op of the forward whose shapes do not broadcast or whose dtypes it refuses (the
  /// forward then runs op by op, so the op raises its own error), and a result that is not
  /// floating. A forward with a materialized op is left to the gradient, which computes it.
  template <int N, unsigned DS, class X>
  static void check_forward(const X& x, const std::array<Tensor, N>& args, const std::source_location& loc) {
    if constexpr (!has_mat<X>() && !X::weak) {
      const Env<N, DS> env{args, loc};
      Shape shape;
      bool ok = own_shape<N>(x, env, shape);
      DType out = args[0].dtype();
      bool one_dtype = true;  // the dtype is known without running the forward where every argument has one
      for (const Tensor& t : args) one_dtype = one_dtype && t.dtype() == out;
      if (ok && one_dtype) {
        visit_dtype(out, [&](auto tag) {
          constexpr DType D = dtype_of<typename decltype(tag)::type>();
          if constexpr (X::template valid<D>()) out = X::template dtype<D>();
          else ok = false;
        });
      }
      if (!ok) out = eager_of<N>(x, env, make_slots<N>(x, env)).dtype();  // raises the op's error
      else if (!one_dtype) return;
      require_floating(out, loc);
    }
  }
  static void require_floating(DType result, const std::source_location& loc) {
    if (!is_floating(result))
      detail::fail<DTypeError>("grad", loc, "the result has dtype ", name(result),
                               "; only floating-point results are differentiable");
  }
};
}  // namespace staging

/// A function compiled at compile time (see sc::compile); DS: the dtypes its fused loop is
/// instantiated for (one bit per DType, all by default).
template <class F, unsigned DS>
class Compiled {
 public:
  explicit Compiled(F f, std::source_location loc = std::source_location::current()) : f_(std::move(f)), loc_(loc) {}

  Tensor operator()(Operand a) const { return call<1>({a.t}, a.loc); }
  Tensor operator()(Operand a, const Tensor& b) const { return call<2>({a.t, b}, a.loc); }
  Tensor operator()(Operand a, const Tensor& b, const Tensor& c) const { return call<3>({a.t, b, c}, a.loc); }
  Tensor operator()(Operand a, const Tensor& b, const Tensor& c, const Tensor& d) const {
    return call<4>({a.t, b, c, d}, a.loc);
  }
  Tensor operator()(Operand a, const Tensor& b, const Tensor& c, const Tensor& d, const Tensor& e) const {
    return call<5>({a.t, b, c, d, e}, a.loc);
  }
  Tensor operator()(Operand a, const Tensor& b, const Tensor& c, const Tensor& d, const Tensor& e,
                    const Tensor& f) const {
    return call<6>({a.t, b, c, d, e, f}, a.loc);
  }

  /// The staged expression the function builds from N placeholder arguments: its type is the
  /// graph (`decltype(g.expression<2>())`).
  template <int N>
  auto expression() const {
    return [&]<int... I>(std::integer_sequence<int, I...>) {
      return f_(staged<staging::Arg<I>>{}...);
    }(std::make_integer_sequence<int, N>{});
  }

  /// The graph lowered to the runtime IR for arguments like xs (shapes and dtypes): printing,
  /// DOT, saving and the GPU path read it.
  template <class... T>
    requires(sizeof...(T) > 0 && (std::convertible_to<const T&, const Tensor&> && ...))
  graph::Graph graph(const T&... xs) const {
    return concrete(xs...).graph();
  }
  /// The graph for the arguments of the latest call (StagingError before the first call).
  graph::Graph graph(std::source_location loc = std::source_location::current()) const {
    std::vector<Tensor> like;
    {
      std::lock_guard<std::mutex> lock(last_->mu);
      for (const auto& [shape, dtype] : last_->specs) like.push_back(zeros(shape, dtype));
    }
    if (like.empty())
      detail::fail<StagingError>("compile", loc, "graph() needs example arguments before the first call: "
                                             "write g.graph(x, ...)");
    return graph_for(like, std::make_integer_sequence<int, 6>{});
  }
  /// The traced function (graph, plan, save) of the expression for arguments like xs.
  template <class... T>
  ConcreteFunction concrete(const T&... xs) const {
    // the graph's nodes carry the line that called sc::compile
    auto body = [f = f_, loc = loc_](const auto&... ts) -> Tensor {
      const detail::LocOverride at(loc);
      return run_body<static_cast<int>(sizeof...(T))>(f, {Tensor(ts)...}, loc);
    };
    return function(body, "compiled").get_concrete(Tensor(xs)...);
  }

  /// Whether the function takes N staged arguments.
  template <int N>
  static constexpr bool takes() {
    return []<int... I>(std::integer_sequence<int, I...>) {
      return std::is_invocable_v<const F&, staged<staging::Arg<I>>...>;
    }(std::make_integer_sequence<int, N>{});
  }

  /// The line that called sc::compile (the lowered graph's nodes carry it).
  std::source_location location() const { return loc_; }

  /// The generic function this was compiled from.
  const F& function_object() const { return f_; }

 private:
  template <int... K>
  graph::Graph graph_for(const std::vector<Tensor>& like, std::integer_sequence<int, K...>) const {
    graph::Graph out;
    auto one = [&]<int N>(std::integral_constant<int, N>) {
      if constexpr (takes<N>()) {
        if (like.size() == static_cast<std::size_t>(N))
          out = [&]<int... I>(std::integer_sequence<int, I...>) { return graph(like[I]...); }(std::make_integer_sequence<int, N>{});
      }
    };
    (one(std::integral_constant<int, K + 1>{}), ...);
    return out;
  }

  template <int N>
  Tensor call(std::array<Tensor, N> args, const std::source_location& loc) const {
    if constexpr (!takes<N>()) {
      static_assert(takes<N>(), "stagecraft: sc::compile: the function does not take this many tensors");
      return Tensor();
    } else {
      return call_bound<N>(std::move(args), loc);
    }
  }
  template <int N>
  Tensor call_bound(std::array<Tensor, N> args, const std::source_location& loc) const {
    using E = decltype(expression<N>());
    if constexpr (!staging::Staged<E>) {
      static_assert(staging::Staged<E>,
                    "stagecraft: sc::compile: the function must return a staged expression of its "
                    "arguments (it returned something else)");
      return Tensor();
    } else {
      return call_staged<N, E>(std::move(args), loc);
    }
  }
  template <int N, class E>
  Tensor call_staged(std::array<Tensor, N> args, const std::source_location& loc) const {
    static_assert(staging::arg_count<typename E::node_type>::value <= N,
                  "stagecraft: sc::compile: the expression reads more arguments than the call passes");
    for (int k = 0; k < N; ++k) detail::require_defined(args[static_cast<std::size_t>(k)], "compile", loc);
    if constexpr (requires { f_.template check<N, DS>(args, loc); }) f_.template check<N, DS>(args, loc);
    {
      std::lock_guard<std::mutex> lock(last_->mu);
      last_->specs.resize(N);
      for (int k = 0; k < N; ++k) {
        const Tensor& t = args[static_cast<std::size_t>(k)];
        last_->specs[static_cast<std::size_t>(k)] = {t.shape(), t.dtype()};
      }
    }
    if constexpr (by_tape_able<N>()) {
      Tensor out;
      if (f_.template by_tape<N, DS>(args, loc, out)) return out;
    }
#if defined(STAGECRAFT_WITH_CUDA)
    // On a GPU the graph runs as a traced function: its fused groups become generated kernels
    // (graph/cuda_fused.hpp), one launch each, instead of a launch per op. Not under a tape (it
    // must see the ops) or inside a trace (the ops stage themselves into it). Only in CUDA builds:
    // instantiating the traced function costs every file with an sc::compile most of its compile
    // time (a 16-op expression and its gradient at -O2: about 4x), and without the kernels no
    // tensor lives on a GPU.
    // Under nvcc the expression is a templated kernel instead (staged/cuda_kernel.hpp), which the
    // evaluator below launches.
    if constexpr ((DS & staging::nvcc_kernels) == 0) {
      const detail::Context& ctx = detail::context();
      if (SC_UNLIKELY(args[0].device().is_cuda()) && ctx.tapes == nullptr && ctx.trace == nullptr)
        return call_traced<N>(args);
    }
#endif
    const auto e = expression<N>();
    return staging::run<N>(e.node, staging::Env<N, DS>{std::move(args), loc});
  }

  /// Whether F is a derivative that may differentiate by a tape (GradFn::by_tape).
  template <int N>
  static constexpr bool by_tape_able() {
    return requires(const F& f, const std::array<Tensor, N>& a, const std::source_location& l, Tensor& t) {
      f.template by_tape<N, DS>(a, l, t);
    };
  }
  /// The function's result as a call computes it, for a trace (concrete, graph): a derivative with
  /// arguments of different floating dtypes by its tape, so the lowered graph is the tape's ops and
  /// runs with the call's bits; else the expression run op by op.
  template <int N>
  static Tensor run_body(const F& f, const std::array<Tensor, N>& args, const std::source_location& loc) {
    if constexpr (requires { f.template check_argument<N>(args, loc); }) f.template check_argument<N>(args, loc);
    if constexpr (by_tape_able<N>()) {
      Tensor out;
      if (f.template by_tape<N, DS>(args, loc, out)) return out;
    }
    const auto e = [&]<int... I>(std::integer_sequence<int, I...>) {
      return f(staged<staging::Arg<I>>{}...);
    }(std::make_integer_sequence<int, N>{});
    return staging::run<N>(e.node, staging::Env<N, DS>{args, loc});
  }
  /// The expression over N arguments (run_body) as a function body for sc::function, behind a
  /// std::function: every compiled function of N arguments shares one sc::function type, so a
  /// file instantiates the tracing machinery once per argument count, not once per expression.
  template <int N>
  staging::TracedBody<N> traced_body() const {
    return {[f = f_, loc = loc_](const std::array<Tensor, N>& ts) -> Tensor {
      const detail::LocOverride at(loc);  // the graph's nodes carry the line that called sc::compile
      return run_body<N>(f, ts, loc);
    }};
  }
  /// Runs the N-argument graph as a traced function, made once and kept (it caches its traces).
  /// Its errors name the line of sc::compile, which every node of the graph carries.
  template <int N>
  Tensor call_traced(const std::array<Tensor, N>& args) const {
    using Fn = Function<staging::TracedBody<N>>;
    std::shared_ptr<Fn> fn;
    {
      std::lock_guard<std::mutex> lock(last_->mu);
      auto& slot = last_->traced[static_cast<std::size_t>(N)];
      if (!slot) slot = std::make_shared<Fn>(function(traced_body<N>(), "compiled"));
      fn = std::static_pointer_cast<Fn>(slot);
    }
    return [&]<int... I>(std::integer_sequence<int, I...>) -> Tensor {
      return (*fn)(args[static_cast<std::size_t>(I)]...);
    }(std::make_integer_sequence<int, N>{});
  }

  struct Last {
    std::mutex mu;
    std::vector<std::pair<Shape, DType>> specs;  // the latest call's arguments, for graph()
    std::array<std::shared_ptr<void>, 7> traced;  // per argument count: the traced function (GPU calls)
  };
  F f_;
  std::source_location loc_;
  std::shared_ptr<Last> last_ = std::make_shared<Last>();
};

namespace staging {
template <DType... Ds>
constexpr unsigned dtype_set() {
  if constexpr (sizeof...(Ds) == 0) return default_set;
  else return ((1u << static_cast<unsigned>(Ds)) | ...) | this_file_kernels;
}
}  // namespace staging

/// Compiles a generic function at compile time: calling the result with Tensors instantiates it
/// with staged placeholders (the graph is its return type) and evaluates the graph fused.
/// `sc::compile<sc::f32>(f)` (any list of dtypes) instantiates the fused loop for those dtypes
/// only, which compiles faster; tensors of another dtype then run op by op, with the same numbers.
template <DType... Ds, class F>
Compiled<std::decay_t<F>, staging::dtype_set<Ds...>()> compile(F&& f,
                                                               std::source_location loc = std::source_location::current()) {
  return Compiled<std::decay_t<F>, staging::dtype_set<Ds...>()>(std::forward<F>(f), loc);
}

/// The derivative of the sum of g's output with respect to argument I, itself compiled (so
/// sc::grad<0>(sc::grad<0>(g)) is the second derivative).
template <int I, class F, unsigned DS>
Compiled<staging::GradFn<I, F>, DS> grad(const Compiled<F, DS>& g) {
  static_assert(I >= 0, "stagecraft: sc::grad<I>: I is an argument index");
  return Compiled<staging::GradFn<I, F>, DS>(staging::GradFn<I, F>{g.function_object()}, g.location());
}

}  // namespace stagecraft
