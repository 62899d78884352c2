// One-pass CPU updates for SGD and Adam: what their composite steps compute (3 to 12 elementwise
// ops, each a pass over memory) in one loop per variable, used eagerly when it is safe.
#pragma once
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "../backend/cpu/elementwise.hpp"  // batch<T>: xsimd vectors
#include "../backend/cpu/parallel.hpp"
#include "../core/tensor.hpp"
#include "../eager/context.hpp"
#include "../state/variable.hpp"

namespace stagecraft::optim::fused {

/// Whether eligible updates run fused (default true). Set it false on a thread to run the
/// composite ops there instead, e.g. to compare the two.
inline thread_local bool enabled = true;

/// True when an update of `var` from g may run as one CPU loop instead of ops: nothing is being
/// traced (a traced step must stay a graph of ops), no tape could record it (apply() runs under
/// StopRecording, so this only guards a direct call), and var, its n slots, g and lr are concrete
/// CPU tensors of var's floating dtype (tensors are contiguous). Otherwise the composite runs.
inline bool eligible(const Tensor& g, const Variable& var, const Variable* slots, std::size_t n, const Tensor& lr) {
  const detail::Context& ctx = detail::context();
  if (!enabled || ctx.trace != nullptr || (ctx.tapes != nullptr && ctx.no_record == 0)) return false;
  const DType d = var.dtype();
  if (d != DType::f32 && d != DType::f64) return false;
  auto ok = [d](const Tensor& t) { return !t.is_symbolic() && t.device().is_cpu() && t.dtype() == d; };
  if (!ok(var.value()) || !ok(g) || !ok(lr) || lr.numel() != 1 || g.shape() != var.shape()) return false;
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

/// A fresh CPU tensor shaped like t (variables are replaced, never written in place).
inline Tensor like(const Tensor& t) { return stagecraft::detail::empty_tensor(t.shape(), t.dtype(), Device::cpu()); }

}  // namespace detail

/// Adam's update (optim/adam.hpp, its op order and roundings): c1 = 1 - beta1, c2 = 1 - beta2.
///   m += (g - m) * c1;  v += (g*g - v) * c2;  w -= (m * lr) / (sqrt(v) + eps)
inline void adam(const Tensor& g, Variable& var, Variable& m, Variable& v, const Tensor& lr, double c1, double c2,
                 double eps) {
  const Tensor m1 = detail::like(m.value()), v1 = detail::like(v.value()), w1 = detail::like(var.value());
  visit_floating(var.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* pg = static_cast<const T*>(g.raw_data());
    const T* pm = static_cast<const T*>(m.value().raw_data());
    const T* pv = static_cast<const T*>(v.value().raw_data());
    const T* pw = static_cast<const T*>(var.value().raw_data());
    T* qm = static_cast<T*>(m1.raw_data());
    T* qv = static_cast<T*>(v1.raw_data());
    T* qw = static_cast<T*>(w1.raw_data());
    const T a1 = static_cast<T>(c1), a2 = static_cast<T>(c2), e = static_cast<T>(eps), r = lr.item<T>();
    using detail::load, detail::store, detail::rounded, std::sqrt;
    detail::for_each_element<T>(var.numel(), [&]<class V>(std::int64_t i) {
      const V gi = load<V>(pg, i);
      const V mi = load<V>(pm, i) + rounded(V((gi - load<V>(pm, i)) * V(a1)));
      const V vi = load<V>(pv, i) + rounded(V((rounded(V(gi * gi)) - load<V>(pv, i)) * V(a2)));
      const V step = rounded(V(mi * V(r))) / V(sqrt(vi) + V(e));
      store(qm, i, mi);
      store(qv, i, vi);
      store(qw, i, V(load<V>(pw, i) - step));
    });
  });
  m.assign(m1);
  v.assign(v1);
  var.assign(w1);
}

/// SGD's update (optim/sgd.hpp): step = g * lr; without momentum w -= step; with momentum mu
///   velocity = velocity * mu - step;  w += velocity  (nesterov: w += velocity * mu - step)
/// velocity is null without momentum.
inline void sgd(const Tensor& g, Variable& var, Variable* velocity, const Tensor& lr, double momentum, bool nesterov) {
  const Tensor w1 = detail::like(var.value());
  const Tensor vel1 = velocity != nullptr ? detail::like(velocity->value()) : Tensor();
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
      const V vel = rounded(V(load<V>(pvel, i) * V(mu))) - step;
      store(qvel, i, vel);
      const V add = nesterov ? V(rounded(V(vel * V(mu))) - step) : vel;
      store(qw, i, V(load<V>(pw, i) + add));
    });
  });
  if (velocity != nullptr) velocity->assign(vel1);
  var.assign(w1);
}

}  // namespace stagecraft::optim::fused
