// One-pass updates for SGD and Adam: what their composite steps compute (3 to 12 elementwise
// ops, each a pass over memory) in one loop per variable on the CPU, or on a GPU one launch for
// a step's variables (kernels/optim.cu: each op was a launch, 72 of an MLP Adam step's; then one
// per variable), used eagerly when it is safe, and (Adam, CPU) for the fused group a traced
// update becomes (graph/fused_special.hpp).
#pragma once
#include <array>
#include <cmath>
#include <cstdint>
#include <span>
#include <type_traits>
#include <utility>
#include <vector>

#include "../backend/cpu/elementwise.hpp"  // batch<T>: xsimd vectors
#include "../backend/cpu/parallel.hpp"
#include "../backend/cuda/kernels.hpp"
#include "../core/tensor.hpp"
#include "../eager/context.hpp"
#include "../graph/fused_special.hpp"
#include "../ops/binary.hpp"
#include "../ops/unary.hpp"
#include "../state/variable.hpp"

namespace stagecraft::optim::fused {

/// Whether eligible updates run fused (default true). Set it false on a thread to run the
/// composite ops there instead, e.g. to compare the two.
inline thread_local bool enabled = true;

/// True when an update of `var` from g may run as one CPU loop (or one GPU kernel) instead of ops:
/// nothing is being traced (a traced step must stay a graph of ops), no tape could record it
/// (apply() runs under StopRecording, so this only guards a direct call), and var, its n slots and
/// g are concrete tensors of var's floating dtype on var's device (the CPU, or a GPU in a CUDA
/// build; tensors are contiguous), lr one element of that dtype there or on the CPU. Otherwise
/// the composite runs.
/// A per-step scalar of a fused update (the rate, AdamW's decay): concrete, one element of the
/// variable's dtype d, on its device dev or on the CPU.
inline bool scalar_ok(const Tensor& s, DType d, Device dev) {
  return !s.is_symbolic() && s.dtype() == d && s.numel() == 1 && (s.device() == dev || s.device().is_cpu());
}
inline bool eligible(const Tensor& g, const Variable& var, const Variable* slots, std::size_t n, const Tensor& lr) {
  const detail::Context& ctx = detail::context();
  if (!enabled || ctx.trace != nullptr || (ctx.tapes != nullptr && ctx.no_record == 0)) return false;
  const DType d = var.dtype();
  if (d != DType::f32 && d != DType::f64) return false;
  const Tensor w = var.value();
  const Device dev = w.device();
  if (!dev.is_cpu() && !(cuda::built && dev.is_cuda())) return false;
  auto ok = [d, dev](const Tensor& t) { return !t.is_symbolic() && t.device() == dev && t.dtype() == d; };
  if (!ok(w) || !ok(g) || g.shape() != w.shape()) return false;
  if (!scalar_ok(lr, d, dev)) return false;
  for (std::size_t i = 0; i < n; ++i)
    if (!ok(slots[i].value())) return false;
  return true;
}

namespace detail {

/// v, unchanged, but opaque to the optimiser: a product passed through it cannot be contracted
/// with the following add into an FMA (GCC contracts by default in GNU mode, -march=native has
/// FMA), so every operation rounds exactly as the composite's separate ops do.
template <class V>
inline V rounded(V v) {
#if defined(__GNUC__) && defined(__x86_64__)
  if constexpr (requires { typename V::register_type; }) {
    typename V::register_type r = v;
    asm("" : "+v"(r));
    return V(r);
  } else {
    asm("" : "+v"(v));
    return v;
  }
#else
  return v;  // other compilers contract only within one expression; each product here is its own
#endif
}

/// Runs body(i, batch tag) over [0, n): whole SIMD vectors, then scalars, split across threads
/// for big variables. body is generic in the value type (batch<T> or T).
template <class T, class Body>
void for_each_element(std::int64_t n, Body&& body) {
  backend::cpu::parallel_for(n, backend::cpu::grain_costly, [&](std::int64_t b, std::int64_t e) {
    std::int64_t i = b;
    if constexpr (backend::cpu::Vectorizable<T>) {
      using B = backend::cpu::batch<T>;
      for (; i + static_cast<std::int64_t>(B::size) <= e; i += B::size) body.template operator()<B>(i);
    }
    for (; i < e; ++i) body.template operator()<T>(i);
  });
}

template <class V, class T>
inline V load(const T* p, std::int64_t i) {
  if constexpr (std::is_same_v<V, T>) return p[i];
  else return V::load_unaligned(p + i);
}
template <class V, class T>
inline void store(T* p, std::int64_t i, const V& v) {
  if constexpr (std::is_same_v<V, T>) p[i] = v;
  else v.store_unaligned(p + i);
}

/// A fresh tensor shaped like t on its device (variables are replaced, never written in place).
inline Tensor like(const Tensor& t) { return stagecraft::detail::empty_tensor(t.shape(), t.dtype(), t.device()); }

/// Adam's update of n elements (optim/adam.hpp: its op order and roundings, the moments flushed),
/// a1 = 1 - beta1, a2 = 1 - beta2, r = lr_t; with `decayed` (AdamW) each w is first w - w d. Each
/// element's inputs are read before its outputs are written, so an output may be an input's buffer.
template <class T>
void adam_loop(std::int64_t n, const T* pg, const T* pm, const T* pv, const T* pw, T* qm, T* qv, T* qw, T r, T a1,
               T a2, T e, bool decayed = false, T d = 0, T tiny = rules::math::smallest_normal<T>()) {
  using std::sqrt;
  for_each_element<T>(n, [&]<class V>(std::int64_t i) {
    const auto flushed = [&](const V& x) { return rules::FlushSubnormal::f(x, V(tiny)); };
    const V gi = load<V>(pg, i), m0 = load<V>(pm, i), v0 = load<V>(pv, i), wt = load<V>(pw, i);
    const V w0 = decayed ? V(wt - rounded(V(wt * V(d)))) : wt;
    const V mi = flushed(V(m0 + rounded(V((gi - m0) * V(a1)))));
    const V vi = flushed(V(v0 + rounded(V((rounded(V(gi * gi)) - v0) * V(a2)))));
    const V step = rounded(V(mi * V(r))) / V(sqrt(vi) + V(e));
    store(qm, i, mi);
    store(qv, i, vi);
    store(qw, i, V(w0 - step));
  });
}

/// A fused GPU update waiting for its step's launch (GpuUpdates): the tensors it reads and writes,
/// held (their buffers must outlive the launch), and the variables its outputs then become.
struct GpuUpdate {
  bool adam = true;
  bool nesterov = false;
  std::array<double, 3> c{};  // Adam: 1 - beta1, 1 - beta2, eps; SGD: the momentum
  Tensor lr;
  Tensor decay;                // AdamW's decay factor (undefined: none)
  std::array<Tensor, 4> in;    // abi::UpdateTensor's order (undefined: none)
  std::array<Tensor, 3> out;   // new buffers, likewise
  std::array<Variable, 3> to;  // the variable out[k] becomes (undefined: none)

  const Tensor& weights() const { return out[adam ? 2 : 0]; }
  /// Whether o can share this update's launch: same optimizer, constants, rate, device and dtype.
  bool launches_with(const GpuUpdate& o) const {
    const auto decay_of = [](const GpuUpdate& u) { return u.decay.defined() ? u.decay.raw_data() : nullptr; };
    return adam == o.adam && nesterov == o.nesterov && c == o.c && lr.raw_data() == o.lr.raw_data() &&
           decay.defined() == o.decay.defined() && decay_of(*this) == decay_of(o) &&
           weights().device() == o.weights().device() && weights().dtype() == o.weights().dtype();
  }
};

/// The step's waiting GPU updates while an Optimizer::apply holds a GpuUpdates on this thread.
inline thread_local std::vector<GpuUpdate>* gpu_pending = nullptr;

/// Launches the updates u (one launch for each run of alike ones, abi::update_max_tensors at most),
/// then assigns their variables.
inline void launch(std::vector<GpuUpdate>& u, [[maybe_unused]] const std::source_location& loc) {
#if defined(STAGECRAFT_WITH_CUDA)
  std::vector<cuda::abi::UpdateTensor> table;
  for (std::size_t b = 0; b < u.size();) {
    std::size_t e = b + 1;
    while (e < u.size() && u[e].launches_with(u[b])) ++e;
    table.clear();
    for (std::size_t k = b; k < e; ++k) {
      cuda::abi::UpdateTensor t;
      for (std::size_t j = 0; j < 4; ++j) t.in[j] = u[k].in[j].defined() ? u[k].in[j].raw_data() : nullptr;
      for (std::size_t j = 0; j < 3; ++j) t.out[j] = u[k].out[j].defined() ? u[k].out[j].raw_data() : nullptr;
      t.n = u[k].weights().numel();
      table.push_back(t);
    }
    const GpuUpdate& x = u[b];
    const Tensor& w = x.weights();
    if (x.adam)
      backend::cuda::adam_update(table, w.dtype(), w.device(), x.lr, x.c[0], x.c[1], x.c[2], x.decay,
                                 x.decay.defined() ? "AdamW" : "Adam", loc);
    else
      backend::cuda::sgd_update(table, w.dtype(), w.device(), x.lr, x.c[0], x.nesterov, "SGD", loc);
    b = e;
  }
#endif
  for (GpuUpdate& x : u)
    for (std::size_t j = 0; j < 3; ++j)
      if (x.to[j].defined()) x.to[j].assign(x.out[j]);
}

/// u waits for its step's launch when a GpuUpdates is open on this thread, else launches now.
inline void gpu_update(GpuUpdate u) {
  if (gpu_pending != nullptr) {
    gpu_pending->push_back(std::move(u));
    return;
  }
  std::vector<GpuUpdate> one;
  one.push_back(std::move(u));
  launch(one, std::source_location::current());
}

}  // namespace detail

/// Held by Optimizer::apply across a step's updates: the fused GPU updates wait, in order, and
/// flush() launches them together, abi::update_max_tensors variables at a time (an MLP's six Adam
/// updates: one launch, not six), then assigns the variables their new values. Destroyed without
/// flush() (an exception during the step), the waiting updates are dropped: those variables keep
/// their values. CPU updates run at once, as before.
class GpuUpdates {
 public:
  GpuUpdates() noexcept : outer_(std::exchange(detail::gpu_pending, &list_)) {}
  ~GpuUpdates() { detail::gpu_pending = outer_; }
  GpuUpdates(const GpuUpdates&) = delete;
  GpuUpdates& operator=(const GpuUpdates&) = delete;

  void flush(const std::source_location& loc) {
    std::vector<detail::GpuUpdate> list = std::move(list_);
    list_.clear();
    detail::launch(list, loc);
  }

 private:
  std::vector<detail::GpuUpdate> list_;
  std::vector<detail::GpuUpdate>* outer_;
};

/// The moments of an update (Adam's m and v, SGD's velocity) are stored with subnormals flushed
/// to zero, x * sign(relu(|x| - smallest normal)), in the fused loops, the composite ops and the GPU
/// kernels alike. Under zero gradients a moment decays (m *= beta1 each step) to the smallest
/// subnormal, where m * beta1 rounds back to m: it stayed there, and every later step paid the
/// CPU's subnormal assists (an Adam update of 235K such elements 40x slower on an Intel Xeon).
/// The composite's five ops (rules::FlushSubnormal's), one per statement: their order is the
/// traced group's (adam_program).
inline Tensor flush_subnormal(const Tensor& x, const std::source_location& loc) {
  const double tiny = x.dtype() == DType::f32 ? double(rules::math::smallest_normal<float>())
                                              : rules::math::smallest_normal<double>();
  const Tensor a = abs(x, loc);
  const Tensor d = sub(a, tiny, loc);
  const Tensor r = relu(d, loc);
  const Tensor k = sign(r, loc);
  return mul(x, k, loc);
}


/// Adam's update (optim/adam.hpp, its op order and roundings): c1 = 1 - beta1, c2 = 1 - beta2.
///   m = flush(m + (g - m) * c1);  v = flush(v + (g*g - v) * c2);  w -= (m * lr) / (sqrt(v) + eps)
/// With decay defined (AdamW's decay factor, as lr: one element of var's dtype), w -= w * decay first.
inline void adam(const Tensor& g, Variable& var, Variable& m, Variable& v, const Tensor& lr, double c1, double c2,
                 double eps, const Tensor& decay = Tensor()) {
  Tensor m1 = detail::like(m.value()), v1 = detail::like(v.value()), w1 = detail::like(var.value());
  if (w1.device().is_cuda()) {
    // (c1, c2 and eps are rounded to var's dtype in the kernel's launch, as static_cast<T> below.)
    detail::GpuUpdate u;
    u.c = {c1, c2, eps};
    u.lr = lr;
    u.decay = decay;
    u.in = {g, m.value(), v.value(), var.value()};
    u.out = {m1, v1, w1};
    u.to = {m, v, var};
    detail::gpu_update(std::move(u));
    return;
  }
  visit_floating(var.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    auto in = [](const Tensor& t) { return static_cast<const T*>(t.raw_data()); };
    auto out = [](const Tensor& t) { return static_cast<T*>(t.raw_data()); };
    detail::adam_loop<T>(var.numel(), in(g), in(m.value()), in(v.value()), in(var.value()), out(m1), out(v1), out(w1),
                         lr.item<T>(), static_cast<T>(c1), static_cast<T>(c2), static_cast<T>(eps), decay.defined(),
                         decay.defined() ? decay.item<T>() : T(0));
  });
  m.assign(m1);
  v.assign(v1);
  var.assign(w1);
}

namespace detail {
/// adam_program (decayed false) and adamw_program (true): Adam::update's composite (and
/// update_decayed's), op by op, as the fusion pass numbers it. Registers: the inputs by first use,
/// then one per instruction.
inline graph::FusedProgram adam_family_program(bool decayed) {
  using ops::OpId;
  const Shape all{1}, one{};  // an input of the output's shape; a single value
  graph::FusedProgram p;
  enum : int { g, m, c1, tiny, v, c2, eps, lr, w, d };
  p.input_shapes = {all, all, one, one, all, one, one, one, all};
  if (decayed) p.input_shapes.push_back(one);  // d
  int next = int(p.input_shapes.size());
  const auto op = [&](OpId id, int a, int b = -1) {
    p.code.push_back({id, a, b});
    return next++;
  };
  const auto flush = [&](int x) {  // x * sign(relu(|x| - tiny)), flush_subnormal's five ops
    const int a = op(OpId::Abs, x);
    const int s = op(OpId::Sub, a, tiny);
    const int r = op(OpId::Relu, s);
    const int k = op(OpId::Sign, r);
    return op(OpId::Mul, x, k);
  };
  const int gm = op(OpId::Sub, g, m);  // m + (g - m) c1
  const int gm1 = op(OpId::Mul, gm, c1);
  const int m1 = flush(op(OpId::Add, m, gm1));
  const int g2 = op(OpId::Square, g);  // v + (g*g - v) c2
  const int gv = op(OpId::Sub, g2, v);
  const int gv2 = op(OpId::Mul, gv, c2);
  const int v1 = flush(op(OpId::Add, v, gv2));
  const int root = op(OpId::Sqrt, v1);  // (m lr) / (sqrt(v) + eps)
  const int den = op(OpId::Add, root, eps);
  const int num = op(OpId::Mul, m1, lr);
  const int step = op(OpId::Div, num, den);
  int w1 = w;
  if (decayed) {  // w - w d first
    const int wd = op(OpId::Mul, w, d);
    w1 = op(OpId::Sub, w, wd);
  }
  p.outputs = {m1, v1, op(OpId::Sub, w1, step)};
  return p;
}
}  // namespace detail

/// The fused group a traced Adam update of one variable becomes (Adam::update's composite, op by
/// op, as the fusion pass numbers it: inputs by first use g, m, 1 - beta1, the smallest normal, v,
/// 1 - beta2, eps, lr_t, w; outputs m, v, w), run by adam_loop instead of the tile evaluator
/// (graph/fused_special.hpp).
inline graph::FusedProgram adam_program() { return detail::adam_family_program(false); }

/// The kernel of adam_program() (Decayed false: in g, m, c1, tiny, v, c2, eps, lr, w) and of
/// adamw_program() (true: the same and d); out (m, v, w), checked by the caller.
template <bool Decayed>
void run_adam_program(std::span<const Tensor> in, std::span<Tensor> out) {
  visit_floating(in[0].dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    auto p = [&](std::size_t k) { return static_cast<const T*>(in[k].raw_data()); };
    auto q = [&](std::size_t k) { return static_cast<T*>(out[k].raw_data()); };
    detail::adam_loop<T>(out[0].numel(), p(0), p(1), p(4), p(8), q(0), q(1), q(2), *p(7), *p(2), *p(5), *p(6), Decayed,
                         Decayed ? *p(9) : T(0), *p(3));
  });
}

/// Registers adam_program's kernel, once per process (later calls do nothing): prepare() then runs
/// a traced Adam update as adam_loop. Adam's constructor calls it; a program that runs a saved
/// function with Adam's update and makes no Adam calls it before it loads the function.
inline void register_adam_program() {
  static const bool done = graph::register_special({"adam", adam_program(), &run_adam_program<false>});
  (void)done;
}

/// The fused group a traced AdamW update of one variable becomes: adam_program's, with the decayed
/// weights w - w * d in place of w (Adam::update_decayed's composite, op by op; inputs by first use
/// g, m, 1 - beta1, the smallest normal, v, 1 - beta2, eps, lr_t, w, d; outputs m, v, w).
inline graph::FusedProgram adamw_program() { return detail::adam_family_program(true); }

/// As register_adam_program, for AdamW's update (its constructor calls it).
inline void register_adamw_program() {
  static const bool done = graph::register_special({"adamw", adamw_program(), &run_adam_program<true>});
  (void)done;
}

/// SGD's update (optim/sgd.hpp): step = g * lr; without momentum w -= step; with momentum mu
///   velocity = flush(velocity * mu - step);  w += velocity  (nesterov: w += velocity * mu - step)
/// velocity is null without momentum.
inline void sgd(const Tensor& g, Variable& var, Variable* velocity, const Tensor& lr, double momentum, bool nesterov) {
  Tensor w1 = detail::like(var.value());
  Tensor vel1 = velocity != nullptr ? detail::like(velocity->value()) : Tensor();
  if (w1.device().is_cuda()) {
    detail::GpuUpdate u;
    u.adam = false;
    u.nesterov = nesterov;
    u.c = {momentum, 0, 0};
    u.lr = lr;
    u.in = {g, var.value(), velocity != nullptr ? velocity->value() : Tensor(), Tensor()};
    u.out = {w1, vel1, Tensor()};
    u.to = {var, velocity != nullptr ? *velocity : Variable(), Variable()};
    detail::gpu_update(std::move(u));
    return;
  }
  visit_floating(var.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* pg = static_cast<const T*>(g.raw_data());
    const T* pw = static_cast<const T*>(var.value().raw_data());
    T* qw = static_cast<T*>(w1.raw_data());
    const T r = lr.item<T>(), mu = static_cast<T>(momentum);
    using detail::load, detail::store, detail::rounded;
    if (velocity == nullptr) {
      detail::for_each_element<T>(var.numel(), [&]<class V>(std::int64_t i) {
        store(qw, i, V(load<V>(pw, i) - rounded(V(load<V>(pg, i) * V(r)))));
      });
      return;
    }
    const T* pvel = static_cast<const T*>(velocity->value().raw_data());
    T* qvel = static_cast<T*>(vel1.raw_data());
    detail::for_each_element<T>(var.numel(), [&]<class V>(std::int64_t i) {
      const V step = rounded(V(load<V>(pg, i) * V(r)));
      const V vel = rules::FlushSubnormal::f(V(rounded(V(load<V>(pvel, i) * V(mu))) - step),
                                             V(rules::math::smallest_normal<T>()));
      store(qvel, i, vel);
      const V add = nesterov ? V(rounded(V(vel * V(mu))) - step) : vel;
      store(qw, i, V(load<V>(pw, i) + add));
    });
  });
  if (velocity != nullptr) velocity->assign(vel1);
  var.assign(w1);
}

}  // namespace stagecraft::optim::fused
