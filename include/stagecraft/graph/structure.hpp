// Results as flat tensor lists and back: Tensor, std::vector<Tensor> and std::tuple of those
// (what sc::function, sc::cond and sc::while_loop take and return).
#pragma once
#include <cstddef>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "../core/tensor.hpp"

namespace stagecraft::detail_fn {

template <class T>
struct is_tuple : std::false_type {};
template <class... T>
struct is_tuple<std::tuple<T...>> : std::true_type {};

/// Flattens a result into tensors.
template <class R>
void flatten(const R& r, std::vector<Tensor>& out) {
  if constexpr (std::same_as<R, Tensor>) out.push_back(r);
  else if constexpr (std::same_as<R, std::vector<Tensor>>) out.insert(out.end(), r.begin(), r.end());
  else if constexpr (is_tuple<R>::value) std::apply([&](const auto&... x) { (flatten(x, out), ...); }, r);
  else static_assert(sizeof(R) == 0, "sc::function: f must return a Tensor, a std::vector<Tensor>, a std::tuple of those, or void");
}

/// Rebuilds a result of type R from flat tensors (vector lengths as traced, in `lens`).
template <class R>
R unflatten(const std::vector<Tensor>& flat, std::size_t& pos, const std::vector<std::size_t>& lens, std::size_t& li) {
  if constexpr (std::same_as<R, Tensor>) {
    return flat[pos++];
  } else if constexpr (std::same_as<R, std::vector<Tensor>>) {
    const std::size_t n = lens[li++];
    std::vector<Tensor> v(flat.begin() + static_cast<std::ptrdiff_t>(pos), flat.begin() + static_cast<std::ptrdiff_t>(pos + n));
    pos += n;
    return v;
  } else {
    return [&]<std::size_t... I>(std::index_sequence<I...>) {
      return R{unflatten<std::tuple_element_t<I, R>>(flat, pos, lens, li)...};
    }(std::make_index_sequence<std::tuple_size_v<R>>{});
  }
}

/// The lengths of the vectors inside a result, in order.
template <class R>
void vector_lengths(const R& r, std::vector<std::size_t>& out) {
  if constexpr (std::same_as<R, std::vector<Tensor>>) out.push_back(r.size());
  else if constexpr (is_tuple<R>::value) std::apply([&](const auto&... x) { (vector_lengths(x, out), ...); }, r);
}

}  // namespace stagecraft::detail_fn
