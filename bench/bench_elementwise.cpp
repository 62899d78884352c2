// Elementwise ops at 16M floats: stagecraft vs the limit (a plain `omp parallel for simd` loop
// in this binary, same flags; and the same on xsimd batches) vs xtensor (xt::adapt over the
// same buffers) vs LibTorch; a size sweep of add around the parallel grain; and the ops whose
// rule has no SIMD form (pow, floor_div, mod: a scalar libm call or an integer division an
// element) at sizes where the grain decides the threads.
#include <cmath>
#include <cstdint>

#include <omp.h>
#include <xsimd/xsimd.hpp>
#include <xtensor/xadapt.hpp>
#include <xtensor/xmath.hpp>
#include <xtensor/xnoalias.hpp>

#include "bench_common.hpp"

namespace {

constexpr std::int64_t n_elems = std::int64_t{1} << 24;  // 16M floats, 64 MiB per buffer

enum class Fn { add, mul, exp, tanh, sigmoid, erf };

// The fixtures: two inputs and a preallocated output, shared by every library.
struct Buffers {
  sc::Tensor a = bench::input({n_elems}, 1), b = bench::input({n_elems}, 2), out = sc::zeros({n_elems});
  float* pa() const { return static_cast<float*>(a.raw_data()); }
  float* pb() const { return static_cast<float*>(b.raw_data()); }
  float* po() const { return static_cast<float*>(out.raw_data()); }
};
Buffers& buffers() {
  static Buffers b;
  return b;
}

void count(benchmark::State& state, Fn f) {
  const std::int64_t reads = (f == Fn::add || f == Fn::mul) ? 2 : 1;
  state.SetItemsProcessed(state.iterations() * n_elems);
  state.SetBytesProcessed(state.iterations() * n_elems * (reads + 1) * std::int64_t{sizeof(float)});
}

// ---- stagecraft: the public API (each call allocates its result from the caching allocator)
sc::Tensor sc_call(Fn f, const sc::Tensor& a, const sc::Tensor& b) {
  switch (f) {
    case Fn::add: return a + b;
    case Fn::mul: return a * b;
    case Fn::exp: return sc::exp(a);
    case Fn::tanh: return sc::tanh(a);
    case Fn::sigmoid: return sc::sigmoid(a);
    case Fn::erf: return sc::erf(a);
  }
  return {};
}
void stagecraft_fn(benchmark::State& state, Fn f) {
  const Buffers& buf = buffers();
  for (auto _ : state) {
    sc::Tensor c = sc_call(f, buf.a, buf.b);
    benchmark::DoNotOptimize(c.raw_data());
    benchmark::ClobberMemory();
  }
  count(state, f);
}

// ---- the limit: plain loops, written as a user would, into a preallocated output
void hand_loop(Fn f, const float* __restrict a, const float* __restrict b, float* __restrict y,
               std::int64_t n) {
  switch (f) {
    case Fn::add:
#pragma omp parallel for simd
      for (std::int64_t i = 0; i < n; ++i) y[i] = a[i] + b[i];
      break;
    case Fn::mul:
#pragma omp parallel for simd
      for (std::int64_t i = 0; i < n; ++i) y[i] = a[i] * b[i];
      break;
    case Fn::exp:
#pragma omp parallel for simd
      for (std::int64_t i = 0; i < n; ++i) y[i] = std::exp(a[i]);
      break;
    case Fn::tanh:
#pragma omp parallel for simd
      for (std::int64_t i = 0; i < n; ++i) y[i] = std::tanh(a[i]);
      break;
    case Fn::sigmoid:
#pragma omp parallel for simd
      for (std::int64_t i = 0; i < n; ++i) y[i] = 1.f / (1.f + std::exp(-a[i]));
      break;
    case Fn::erf:
#pragma omp parallel for simd
      for (std::int64_t i = 0; i < n; ++i) y[i] = std::erf(a[i]);
      break;
  }
}
void hand_fn(benchmark::State& state, Fn f) {
  const Buffers& buf = buffers();
  for (auto _ : state) {
    hand_loop(f, buf.pa(), buf.pb(), buf.po(), n_elems);
    benchmark::ClobberMemory();
  }
  count(state, f);
}

// ---- the same loop on xsimd batches with xsimd's exp/tanh: the limit for transcendentals,
// which the plain loop above cannot vectorise (glibc's vector expf needs -ffast-math)
template <class Fb>
void xsimd_loop(const float* a, const float* b, float* y, std::int64_t n, Fb&& fb) {
  using B = xsimd::batch<float>;
  constexpr std::int64_t W = B::size;
#pragma omp parallel for
  for (std::int64_t i = 0; i < n / W * W; i += W)
    fb(B::load_unaligned(a + i), B::load_unaligned(b + i)).store_unaligned(y + i);
  for (std::int64_t i = n / W * W; i < n; ++i) {  // the tail, through one padded batch
    alignas(64) float ta[W] = {}, tb[W] = {}, ty[W];
    ta[0] = a[i], tb[0] = b[i];
    fb(B::load_aligned(ta), B::load_aligned(tb)).store_aligned(ty);
    y[i] = ty[0];
  }
}
void xsimd_fn(benchmark::State& state, Fn f) {
  using B = xsimd::batch<float>;
  const Buffers& buf = buffers();
  for (auto _ : state) {
    switch (f) {
      case Fn::add: xsimd_loop(buf.pa(), buf.pb(), buf.po(), n_elems, [](B x, B z) { return x + z; }); break;
      case Fn::mul: xsimd_loop(buf.pa(), buf.pb(), buf.po(), n_elems, [](B x, B z) { return x * z; }); break;
      case Fn::exp: xsimd_loop(buf.pa(), buf.pb(), buf.po(), n_elems, [](B x, B) { return xsimd::exp(x); }); break;
      case Fn::tanh: xsimd_loop(buf.pa(), buf.pb(), buf.po(), n_elems, [](B x, B) { return xsimd::tanh(x); }); break;
      case Fn::sigmoid:
        xsimd_loop(buf.pa(), buf.pb(), buf.po(), n_elems, [](B x, B) { return B(1.f) / (B(1.f) + xsimd::exp(-x)); });
        break;
      case Fn::erf:  // what sc::erf on f32 was until session 54 (now its own rational function)
        xsimd_loop(buf.pa(), buf.pb(), buf.po(), n_elems, [](B x, B) { return xsimd::erf(x); });
        break;
    }
    benchmark::ClobberMemory();
  }
  count(state, f);
}

// ---- xtensor: xt::adapt over the same buffers, noalias assignment (its xsimd path). xtensor
// is serial unless built with XTENSOR_USE_OPENMP for everything; split by hand instead, one
// contiguous range per thread, the way the hand loop's schedule(static) splits.
template <class E>
void xt_assign(float* y, std::int64_t n, E&& make) {
  using shape_t = std::array<std::size_t, 1>;
#pragma omp parallel
  {
    const std::int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
    const std::int64_t chunk = (n + nt - 1) / nt, b = std::min(n, t * chunk), e = std::min(n, b + chunk);
    if (b < e) {
      auto out = xt::adapt(y + b, static_cast<std::size_t>(e - b), xt::no_ownership(), shape_t{std::size_t(e - b)});
      xt::noalias(out) = make(b, e);
    }
  }
}
void xtensor_fn(benchmark::State& state, Fn f) {
  const Buffers& buf = buffers();
  const float* pa = buf.pa();
  const float* pb = buf.pb();
  using shape_t = std::array<std::size_t, 1>;
  auto view = [](const float* p, std::int64_t b, std::int64_t e) {
    return xt::adapt(p + b, static_cast<std::size_t>(e - b), xt::no_ownership(), shape_t{std::size_t(e - b)});
  };
  for (auto _ : state) {
    switch (f) {
      case Fn::add: xt_assign(buf.po(), n_elems, [&](auto b, auto e) { return view(pa, b, e) + view(pb, b, e); }); break;
      case Fn::mul: xt_assign(buf.po(), n_elems, [&](auto b, auto e) { return view(pa, b, e) * view(pb, b, e); }); break;
      case Fn::exp: xt_assign(buf.po(), n_elems, [&](auto b, auto e) { return xt::exp(view(pa, b, e)); }); break;
      case Fn::tanh: xt_assign(buf.po(), n_elems, [&](auto b, auto e) { return xt::tanh(view(pa, b, e)); }); break;
      case Fn::sigmoid:
        xt_assign(buf.po(), n_elems, [&](auto b, auto e) { return 1.f / (1.f + xt::exp(-view(pa, b, e))); });
        break;
      case Fn::erf: xt_assign(buf.po(), n_elems, [&](auto b, auto e) { return xt::erf(view(pa, b, e)); }); break;
    }
    benchmark::ClobberMemory();
  }
  count(state, f);
}

#if STAGECRAFT_BENCH_TORCH
at::Tensor torch_call(Fn f, const at::Tensor& a, const at::Tensor& b) {
  switch (f) {
    case Fn::add: return at::add(a, b);
    case Fn::mul: return at::mul(a, b);
    case Fn::exp: return at::exp(a);
    case Fn::tanh: return at::tanh(a);
    case Fn::sigmoid: return at::sigmoid(a);
    case Fn::erf: return at::erf(a);
  }
  return {};
}
// LibTorch's eager call, allocating its result (its CPU allocator does not cache: each call
// maps fresh pages, part of its real eager cost).
void torch_fn(benchmark::State& state, Fn f) {
  const Buffers& buf = buffers();
  const at::Tensor a = bench::as_torch(buf.a), b = bench::as_torch(buf.b);
  for (auto _ : state) {
    at::Tensor c = torch_call(f, a, b);
    benchmark::DoNotOptimize(c.data_ptr());
    benchmark::ClobberMemory();
  }
  count(state, f);
}
// LibTorch writing into the preallocated output (the out= variants): its kernels alone.
void torch_out_fn(benchmark::State& state, Fn f) {
  const Buffers& buf = buffers();
  const at::Tensor a = bench::as_torch(buf.a), b = bench::as_torch(buf.b);
  at::Tensor y = bench::as_torch(buf.out);
  for (auto _ : state) {
    switch (f) {
      case Fn::add: at::add_out(y, a, b); break;
      case Fn::mul: at::mul_out(y, a, b); break;
      case Fn::exp: at::exp_out(y, a); break;
      case Fn::tanh: at::tanh_out(y, a); break;
      case Fn::sigmoid: at::sigmoid_out(y, a); break;
      case Fn::erf: at::erf_out(y, a); break;
    }
    benchmark::ClobberMemory();
  }
  count(state, f);
}
#endif

void register_all() {
  const std::pair<const char*, Fn> fns[] = {
      {"add", Fn::add}, {"mul", Fn::mul}, {"exp", Fn::exp}, {"tanh", Fn::tanh}, {"sigmoid", Fn::sigmoid}, {"erf", Fn::erf}};
  for (const auto& [name, f] : fns) {
    const std::string s = std::string("elementwise_16M/") + name + "/";
    benchmark::RegisterBenchmark((s + "stagecraft").c_str(), stagecraft_fn, f)->UseRealTime();
    benchmark::RegisterBenchmark((s + "hand_loop").c_str(), hand_fn, f)->UseRealTime();
    benchmark::RegisterBenchmark((s + "hand_xsimd").c_str(), xsimd_fn, f)->UseRealTime();
    benchmark::RegisterBenchmark((s + "xtensor").c_str(), xtensor_fn, f)->UseRealTime();
#if STAGECRAFT_BENCH_TORCH
    benchmark::RegisterBenchmark((s + "libtorch").c_str(), torch_fn, f)->UseRealTime();
    benchmark::RegisterBenchmark((s + "libtorch_out").c_str(), torch_out_fn, f)->UseRealTime();
#endif
  }
}
// Sizes around the parallel grain: where serial loops give way to threads.
void sweep_stagecraft(benchmark::State& state) {
  const sc::Tensor a = bench::input({state.range(0)}, 1), b = bench::input({state.range(0)}, 2);
  for (auto _ : state) {
    sc::Tensor c = a + b;
    benchmark::DoNotOptimize(c.raw_data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}
// Its own buffers of the same size, allocated the same way as stagecraft's (page placement
// matters at these sizes).
void sweep_hand(benchmark::State& state) {
  const sc::Tensor a = bench::input({state.range(0)}, 1), b = bench::input({state.range(0)}, 2),
                   y = sc::zeros({state.range(0)});
  for (auto _ : state) {
    hand_loop(Fn::add, static_cast<const float*>(a.raw_data()), static_cast<const float*>(b.raw_data()),
              static_cast<float*>(y.raw_data()), state.range(0));
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}
void sweep_sizes(benchmark::internal::Benchmark* b) {
  for (std::int64_t n = 1 << 10; n <= std::int64_t{1} << 22; n *= 4) b->Arg(n);
  b->UseRealTime();
}
BENCHMARK(sweep_stagecraft)->Name("elementwise_sweep/add/stagecraft")->Apply(sweep_sizes);
BENCHMARK(sweep_hand)->Name("elementwise_sweep/add/hand_loop")->Apply(sweep_sizes);

// ---- ops whose rules are scalar in general (pow, floor_div, mod: rules.inc's vectorizes = false,
// with batch forms for floats and int32) at 64K..1M elements, where the parallel grain decides
// whether they get threads. Inputs: pow's base in [0.5, 2.5) (no NaN path), its exponent in
// [-2, 2), 2.f or 3.f (weak scalars); floor_div / mod f32 a in [-200, 200) over b in [-2, 2); the
// integer ones (int32, and mod on int64) a in [-2000, 2000) over divisors 1..20; int32 pow a in
// [-20, 20) to the powers 0..7 (repeated squaring on SIMD batches since session 79; the hand
// loop's is a lane at a time), and to the one power 5 (pow_i32_5: a weak scalar, a row through
// its bits once; the hand loop multiplies it out, a vector loop).
enum class Scalar { pow, pow_2, pow_3, floor_div, mod, floor_div_i32, mod_i32, mod_i64, pow_i32, pow_i32_5 };
bool int32_op(Scalar f) {
  return f == Scalar::mod_i32 || f == Scalar::floor_div_i32 || f == Scalar::pow_i32 || f == Scalar::pow_i32_5;
}
bool int64_op(Scalar f) { return f == Scalar::mod_i64; }
struct ScalarInputs {
  sc::Tensor a, b;
};
ScalarInputs scalar_inputs(Scalar f, std::int64_t n) {
  const sc::Tensor x = bench::input({n}, 1), z = bench::input({n}, 2);
  switch (f) {
    case Scalar::pow: return {sc::abs(x) + 0.5f, z};
    case Scalar::pow_2: return {x, sc::full({n}, 2.0, sc::f32)};  // (pow(x, 2.f) reads no b: a weak scalar)
    case Scalar::pow_3: return {x, sc::full({n}, 3.0, sc::f32)};
    case Scalar::floor_div:
    case Scalar::mod: return {x * 100.f, z};
    case Scalar::floor_div_i32:
    case Scalar::mod_i32:
      return {sc::cast(x * 1000.f, sc::DType::i32), sc::cast(sc::abs(z) * 9.5f + 1.f, sc::DType::i32)};
    case Scalar::mod_i64:
      return {sc::cast(x * 1000.f, sc::DType::i64), sc::cast(sc::abs(z) * 9.5f + 1.f, sc::DType::i64)};
    case Scalar::pow_i32:
      return {sc::cast(x * 20.f, sc::DType::i32), sc::cast(sc::abs(z) * 3.9f, sc::DType::i32)};
    case Scalar::pow_i32_5: return {sc::cast(x * 20.f, sc::DType::i32), sc::full({n}, 5.0, sc::i32)};
  }
  return {};
}
sc::Tensor sc_scalar(Scalar f, const sc::Tensor& a, const sc::Tensor& b) {
  switch (f) {
    case Scalar::pow:
    case Scalar::pow_i32: return sc::pow(a, b);
    case Scalar::pow_2: return sc::pow(a, 2.f);
    case Scalar::pow_3: return sc::pow(a, 3.f);
    case Scalar::pow_i32_5: return sc::pow(a, 5);
    case Scalar::floor_div:
    case Scalar::floor_div_i32: return sc::floor_div(a, b);
    case Scalar::mod:
    case Scalar::mod_i32:
    case Scalar::mod_i64: return sc::mod(a, b);
  }
  return {};
}
void scalar_stagecraft(benchmark::State& state, Scalar f) {
  const ScalarInputs in = scalar_inputs(f, state.range(0));
  for (auto _ : state) {
    sc::Tensor c = sc_scalar(f, in.a, in.b);
    benchmark::DoNotOptimize(c.raw_data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}
// The limit: the loop a user would write (Python's floor division and remainder by fmod and a
// sign fix), `omp parallel for` over every size, into a preallocated output.
template <class T>
void scalar_loop(Scalar f, const T* __restrict a, const T* __restrict b, T* __restrict y, std::int64_t n) {
  if constexpr (std::is_floating_point_v<T>) {
    switch (f) {
      case Scalar::pow:
#pragma omp parallel for
        for (std::int64_t i = 0; i < n; ++i) y[i] = std::pow(a[i], b[i]);
        break;
      case Scalar::pow_2:
#pragma omp parallel for simd
        for (std::int64_t i = 0; i < n; ++i) y[i] = a[i] * a[i];
        break;
      case Scalar::pow_3:
#pragma omp parallel for
        for (std::int64_t i = 0; i < n; ++i) y[i] = std::pow(a[i], 3.f);
        break;
      case Scalar::floor_div:
#pragma omp parallel for
        for (std::int64_t i = 0; i < n; ++i) {
          const T m = std::fmod(a[i], b[i]);
          T d = (a[i] - m) / b[i];
          if (m != 0 && ((b[i] < 0) != (m < 0))) d -= 1;
          y[i] = std::round(d);
        }
        break;
      default:
#pragma omp parallel for
        for (std::int64_t i = 0; i < n; ++i) {
          const T m = std::fmod(a[i], b[i]);
          y[i] = (m != 0 && ((b[i] < 0) != (m < 0))) ? m + b[i] : m;
        }
        break;
    }
  } else if (f == Scalar::pow_i32) {
#pragma omp parallel for
    for (std::int64_t i = 0; i < n; ++i) {
      std::uint32_t r = 1;  // (the exponents are 0..7: no negative branch)
      for (T k = 0; k < b[i]; ++k) r *= static_cast<std::uint32_t>(a[i]);
      y[i] = static_cast<T>(r);
    }
  } else if (f == Scalar::pow_i32_5) {
#pragma omp parallel for simd
    for (std::int64_t i = 0; i < n; ++i) {
      const auto x = static_cast<std::uint32_t>(a[i]), x2 = x * x;
      y[i] = static_cast<T>(x2 * x2 * x);
    }
  } else if (f == Scalar::floor_div_i32) {
#pragma omp parallel for
    for (std::int64_t i = 0; i < n; ++i) {
      const T q = b[i] == 0 ? T(0) : static_cast<T>(a[i] / b[i]);
      y[i] = (b[i] != 0 && q * b[i] != a[i] && ((a[i] < 0) != (b[i] < 0))) ? static_cast<T>(q - 1) : q;
    }
  } else {
#pragma omp parallel for
    for (std::int64_t i = 0; i < n; ++i) {
      const T m = b[i] == 0 ? T(0) : static_cast<T>(a[i] % b[i]);
      y[i] = (m != 0 && ((b[i] < 0) != (m < 0))) ? static_cast<T>(m + b[i]) : m;
    }
  }
}
void scalar_hand(benchmark::State& state, Scalar f) {
  const ScalarInputs in = scalar_inputs(f, state.range(0));
  sc::Tensor y = sc::zeros(in.a.shape(), in.a.dtype());
  for (auto _ : state) {
    if (int32_op(f))
      scalar_loop(f, static_cast<const std::int32_t*>(in.a.raw_data()), static_cast<const std::int32_t*>(in.b.raw_data()),
                  static_cast<std::int32_t*>(y.raw_data()), state.range(0));
    else if (int64_op(f))
      scalar_loop(f, static_cast<const std::int64_t*>(in.a.raw_data()), static_cast<const std::int64_t*>(in.b.raw_data()),
                  static_cast<std::int64_t*>(y.raw_data()), state.range(0));
    else
      scalar_loop(f, static_cast<const float*>(in.a.raw_data()), static_cast<const float*>(in.b.raw_data()),
                  static_cast<float*>(y.raw_data()), state.range(0));
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}
#if STAGECRAFT_BENCH_TORCH
void scalar_torch(benchmark::State& state, Scalar f) {
  const ScalarInputs in = scalar_inputs(f, state.range(0));
  const auto dt = int32_op(f) ? at::kInt : int64_op(f) ? at::kLong : at::kFloat;
  const at::Tensor a = at::from_blob(in.a.raw_data(), {state.range(0)}, at::TensorOptions().dtype(dt));
  const at::Tensor b = at::from_blob(in.b.raw_data(), {state.range(0)}, at::TensorOptions().dtype(dt));
  for (auto _ : state) {
    at::Tensor c = f == Scalar::pow || f == Scalar::pow_i32 ? at::pow(a, b)
                   : f == Scalar::pow_i32_5 ? at::pow(a, 5)
                   : f == Scalar::pow_2     ? at::pow(a, 2.0)
                   : f == Scalar::pow_3     ? at::pow(a, 3.0)
                   : f == Scalar::floor_div || f == Scalar::floor_div_i32 ? at::floor_divide(a, b)
                                                                         : at::remainder(a, b);
    benchmark::DoNotOptimize(c.data_ptr());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}
#endif
void register_scalar() {
  const std::pair<const char*, Scalar> fns[] = {
      {"pow", Scalar::pow}, {"pow_2", Scalar::pow_2},         {"pow_3", Scalar::pow_3},    {"floor_div", Scalar::floor_div},
      {"mod", Scalar::mod}, {"floor_div_i32", Scalar::floor_div_i32}, {"mod_i32", Scalar::mod_i32}, {"mod_i64", Scalar::mod_i64},
      {"pow_i32", Scalar::pow_i32}, {"pow_i32_5", Scalar::pow_i32_5}};
  for (const auto& [name, f] : fns) {
    const std::string s = std::string("elementwise_scalar/") + name + "/";
    auto sizes = [](benchmark::internal::Benchmark* b) { b->Arg(1 << 16)->Arg(1 << 18)->Arg(1 << 20)->UseRealTime(); };
    sizes(benchmark::RegisterBenchmark((s + "stagecraft").c_str(), scalar_stagecraft, f));
    sizes(benchmark::RegisterBenchmark((s + "hand_loop").c_str(), scalar_hand, f));
#if STAGECRAFT_BENCH_TORCH
    sizes(benchmark::RegisterBenchmark((s + "libtorch").c_str(), scalar_torch, f));
#endif
  }
}

const bool registered = (register_all(), register_scalar(), true);

}  // namespace

STAGECRAFT_BENCH_MAIN()
