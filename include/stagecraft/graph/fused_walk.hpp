// How the fused evaluator (fused_kernel.hpp) walks a tensor read or written through a strided
// plan over the output's elements: a tile gathered (a broadcast or windowed input), a tile
// scattered (an output through its window), and whether a tile reads one element only (a
// row-broadcast input over a tile inside one row, read as a single value instead of gathered) or
// elements side by side (a row of an input broadcast over rows, read in place).
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "../backend/cpu/elementwise.hpp"
#include "../core/shape.hpp"

namespace stagecraft::graph::detail_fused {

/// Gather: fills buf[0, len) with the elements at output positions [t0, t0 + len) of the tensor
/// at `walked` (an input, walked by p). Scatter: writes buf[0, len) there instead (an output
/// through its window; p has no broadcast axis). One memcpy or fill per run of the innermost
/// merged axis, the outer index advanced as an odometer.
template <bool Scatter, class T>
void copy_walk(std::conditional_t<Scatter, T*, const T*> walked, const backend::cpu::StridedPlan<1>& p, std::int64_t t0,
               std::int64_t len, std::conditional_t<Scatter, const T*, T*> buf) {
  const int r = p.shape.rank();
  if (r == 0) {  // one element
    if constexpr (Scatter) *walked = *buf;
    else *buf = *walked;
    return;
  }
  const std::int64_t inner = p.shape[r - 1], si = p.strides[0][r - 1];
  std::int64_t idx[max_rank] = {}, off = 0, rem = t0 / inner, pos = t0 % inner;
  for (int d = r - 2; d >= 0; --d) {
    idx[d] = rem % p.shape[d];
    rem /= p.shape[d];
    off += idx[d] * p.strides[0][d];
  }
  while (len > 0) {
    const std::int64_t run = std::min(inner - pos, len);
    const auto w = walked + off + pos * si;
    if constexpr (Scatter) {
      if (si == 1) std::memcpy(w, buf, static_cast<std::size_t>(run) * sizeof(T));
      else for (std::int64_t i = 0; i < run; ++i) w[i * si] = buf[i];
    } else {
      if (si == 1) std::memcpy(buf, w, static_cast<std::size_t>(run) * sizeof(T));
      else if (si == 0) std::fill_n(buf, run, *w);
      else for (std::int64_t i = 0; i < run; ++i) buf[i] = w[i * si];
    }
    buf += run, len -= run, pos = 0;
    for (int d = r - 2; d >= 0; --d) {
      ++idx[d];
      off += p.strides[0][d];
      if (idx[d] < p.shape[d]) break;
      off -= idx[d] * p.strides[0][d];
      idx[d] = 0;
    }
  }
}

/// Where, relative to `walked`, output positions [t0, t0 + len) start when they lie in one run of
/// p's innermost merged axis, else -1 (the run check of constant_run and contiguous_run).
inline std::int64_t run_offset(const backend::cpu::StridedPlan<1>& p, std::int64_t t0, std::int64_t len) {
  const int r = p.shape.rank();
  if (r == 0) return 0;
  const std::int64_t inner = p.shape[r - 1], run = t0 / inner;  // (one division: called per tile)
  const std::int64_t pos = t0 - run * inner;
  if (pos + len > inner) return -1;
  std::int64_t rem = run, off = pos * p.strides[0][r - 1];
  for (int d = r - 2; d >= 0 && rem > 0; --d) {
    if (rem < p.shape[d]) {  // (the outer axes' indices are all 0)
      off += rem * p.strides[0][d];
      break;
    }
    off += rem % p.shape[d] * p.strides[0][d];
    rem /= p.shape[d];
  }
  return off;
}

/// The one element that output positions [t0, t0 + len) read through p when they all read the
/// same one (p's innermost axis is broadcast, stride 0, and the positions lie in one run of it),
/// else null.
template <class T>
const T* constant_run(const T* walked, const backend::cpu::StridedPlan<1>& p, std::int64_t t0, std::int64_t len) {
  const int r = p.shape.rank();
  if (r > 0 && p.strides[0][r - 1] != 0) return nullptr;
  const std::int64_t off = run_offset(p, t0, len);
  return off < 0 ? nullptr : walked + off;
}

/// The elements that output positions [t0, t0 + len) read through p when they lie side by side
/// in the walked tensor (p's innermost axis has stride 1 and the positions lie in one run of it:
/// a row of a tensor broadcast over rows, a tile within a window's row), else null. A tile of
/// them is read there in place instead of gathered.
template <class T>
const T* contiguous_run(const T* walked, const backend::cpu::StridedPlan<1>& p, std::int64_t t0, std::int64_t len) {
  const int r = p.shape.rank();
  if (r > 0 && p.strides[0][r - 1] != 1) return nullptr;
  const std::int64_t off = run_offset(p, t0, len);
  return off < 0 ? nullptr : walked + off;
}

}  // namespace stagecraft::graph::detail_fused
