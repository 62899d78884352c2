// where(cond, a, b): a where cond is true, else b, with three-way broadcasting.
#pragma once
#include <vector>

#include "../eager/dispatch.hpp"
#include "elementwise_rules.hpp"

namespace stagecraft {
namespace ops {

/// cond (any dtype, read as truth) selects between a and b (promoted to a common dtype). The
/// math is rules::Where (a select), run by the backend's select rows.
struct Where : rules::Where {
  SC_OP_HEAD(Where, "where")
  static constexpr int arity = 3;
  static constexpr bool vjp_takes_broadcast_grad = true;  // g enters elementwise
  static constexpr ElementwiseKind elementwise_kind = ElementwiseKind::where;
  static constexpr int promote_from = 1;
  static std::vector<Tensor> vjp(const Tensor& g, Inputs in, const Tensor& out, const Attrs& a, Wanted wanted = {});

  static OutMeta infer(Inputs in, const Attrs&, const std::source_location& loc) {
    Shape ab, out;
    if (SC_UNLIKELY(!broadcast_shapes(in[1].shape(), in[2].shape(), ab) ||
                    !broadcast_shapes(in[0].shape(), ab, out)))
      detail::fail<ShapeError>(name, loc, "cannot broadcast condition ", in[0].shape(), " with ",
                               in[1].shape(), " and ", in[2].shape());
    return {out, in[1].dtype()};
  }
  static void cuda(Inputs in, Tensor& out, const Attrs&, const std::source_location& loc) {
    const Tensor c = in[0].dtype() == DType::b8 ? in[0] : detail::cast_to(in[0], DType::b8, loc);
    backend::cuda::where(c, in[1], in[2], out, name, loc);
  }
  static void cpu(Inputs in, Tensor& out, const Attrs&) {
    if (out.numel() == 0) return;
    const Tensor c = in[0].dtype() == DType::b8 ? in[0] : detail::cast_to(in[0], DType::b8, std::source_location::current());
    const Shape* shapes[3] = {&c.shape(), &in[1].shape(), &in[2].shape()};
    const auto p = backend::cpu::collapse<3>(out.shape(), shapes);
    const int r = p.shape.rank();
    const std::int64_t s0 = p.strides[0][r - 1], s1 = p.strides[1][r - 1], s2 = p.strides[2][r - 1];
    visit_dtype(out.dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      const bool* pc = static_cast<const bool*>(c.raw_data());
      const T* pa = static_cast<const T*>(in[1].raw_data());
      const T* pb = static_cast<const T*>(in[2].raw_data());
      T* py = static_cast<T*>(out.raw_data());
      backend::cpu::parallel_row_pieces<3>(p, backend::cpu::grain_cheap, [&](const std::int64_t* off, std::int64_t o,
                                                                              std::int64_t lo, std::int64_t hi) {
        backend::cpu::select_row<Where>(pc + off[0] + lo * s0, pa + off[1] + lo * s1, pb + off[2] + lo * s2, py + o + lo,
                                        hi - lo, s0, s1, s2);
      });
    });
  }
};

}  // namespace ops

/// Elements of a where cond is true, else of b; cond, a and b broadcast together.
inline Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b,
                    std::source_location loc = std::source_location::current()) {
  const std::array<Tensor, 3> in{cond, a, b};
  return detail::dispatch<ops::Where>(in, {}, loc);
}
/// where with a C++ scalar for the 'else' branch (weak, takes a's dtype).
template <Scalar V>
Tensor where(const Tensor& cond, const Tensor& a, V b, std::source_location loc = std::source_location::current()) {
  return where(cond, a, detail::weak_scalar(b, a, loc, "where"), loc);
}
/// where with a C++ scalar for the 'then' branch (weak, takes b's dtype).
template <Scalar V>
Tensor where(const Tensor& cond, V a, const Tensor& b, std::source_location loc = std::source_location::current()) {
  return where(cond, detail::weak_scalar(a, b, loc, "where"), b, loc);
}

// The gradient rule, after the functions it uses: the condition gets none, each branch gets
// g where it was chosen (the tape sums it back over broadcast axes).
inline std::vector<Tensor> ops::Where::vjp(const Tensor& g, Inputs in, const Tensor&, const Attrs&, Wanted w) {
  return {Tensor(), w[1] ? where(in[0], g, 0) : Tensor(), w[2] ? where(in[0], 0, g) : Tensor()};
}

}  // namespace stagecraft
