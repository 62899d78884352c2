// einsum: Einstein summation over labelled axes ("bij,bjk->bik"), written with other ops: each
// operand's repeated labels become diagonals (gather), labels no one else needs are summed, and
// operands are contracted left to right by one batched matmul each (transpose flags where the
// axes already lie right), the rest reshapes and transposes. Differentiable wherever those are.
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>
#include <initializer_list>
#include <source_location>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "../eager/dispatch.hpp"
#include "broadcast_to.hpp"
#include "gather.hpp"
#include "matmul.hpp"
#include "reduce.hpp"
#include "reshape.hpp"
#include "transpose.hpp"

namespace stagecraft {
namespace detail_einsum {

/// Labels: 'A'-'Z' are 0-25, 'a'-'z' 26-51 (an implicit output's order), the ellipsis' axes 52
/// and up (right-aligned).
using Labels = std::vector<int>;
inline constexpr int ellipsis_base = 52;
/// Every label is below this (an ellipsis stands for at most max_rank axes).
inline constexpr std::size_t label_count = ellipsis_base + max_rank;

inline int label_of(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return 26 + (c - 'a');
  return -1;
}
inline std::string label_name(int l) {
  if (l < 26) return std::string(1, static_cast<char>('A' + l));
  if (l < ellipsis_base) return std::string(1, static_cast<char>('a' + (l - 26)));
  return "...";
}

struct Equation {
  std::vector<Labels> in;
  Labels out;
};

/// One operand's term: its labels, the ellipsis (at most once) standing for the axes left over.
/// `ell` gets the ellipsis' axis count (-1: none).
inline Labels parse_term(std::string_view term, const std::string& eq, int rank, int& ell,
                         const std::source_location& loc) {
  Labels labels;
  int at = -1, letters = 0;
  for (std::size_t i = 0; i < term.size(); ++i) {
    if (term.substr(i, 3) == "...") {
      if (SC_UNLIKELY(at >= 0)) detail::fail<ValueError>("einsum", loc, "'", eq, "': '...' twice in one term");
      at = static_cast<int>(labels.size());
      i += 2;
      continue;
    }
    const int l = label_of(term[i]);
    if (SC_UNLIKELY(l < 0))
      detail::fail<ValueError>("einsum", loc, "'", eq, "': '", term[i], "' is not a label (letters and '...' only)");
    labels.push_back(l);
    ++letters;
  }
  ell = -1;
  if (at >= 0) {
    ell = rank - letters;
    if (SC_UNLIKELY(ell < 0))
      detail::fail<ShapeError>("einsum", loc, "'", eq, "': term '", term, "' has ", letters,
                               " labels for an operand of rank ", rank);
    labels.insert(labels.begin() + at, static_cast<std::size_t>(ell), -1);  // placeholders, numbered below
  } else if (SC_UNLIKELY(letters != rank)) {
    detail::fail<ShapeError>("einsum", loc, "'", eq, "': term '", term, "' has ", letters,
                             " labels for an operand of rank ", rank);
  }
  return labels;
}

/// The ellipsis' placeholders numbered right-aligned across `max_ell` axes.
inline void number_ellipsis(Labels& labels, int ell, int max_ell) {
  int k = max_ell - ell;
  for (int& l : labels)
    if (l == -1) l = ellipsis_base + k++;
}

inline Equation parse(std::string_view equation, std::span<const Tensor> xs, const std::source_location& loc) {
  std::string eq;
  for (const char c : equation)
    if (c != ' ') eq += c;
  const std::size_t arrow = eq.find("->");
  const std::string lhs = eq.substr(0, arrow);
  std::vector<std::string_view> terms;
  for (std::size_t b = 0;;) {
    const std::size_t e = lhs.find(',', b);
    terms.emplace_back(std::string_view(lhs).substr(b, e == std::string::npos ? std::string::npos : e - b));
    if (e == std::string::npos) break;
    b = e + 1;
  }
  if (SC_UNLIKELY(terms.size() != xs.size()))
    detail::fail<ValueError>("einsum", loc, "'", equation, "' has ", terms.size(), " input terms for ", xs.size(),
                             " operands");
  Equation r;
  std::vector<int> ells;
  int max_ell = 0;
  for (std::size_t k = 0; k < terms.size(); ++k) {
    int ell = -1;
    r.in.push_back(parse_term(terms[k], eq, xs[k].rank(), ell, loc));
    ells.push_back(ell);
    max_ell = std::max(max_ell, ell);
  }
  for (std::size_t k = 0; k < terms.size(); ++k) number_ellipsis(r.in[k], ells[k], max_ell);
  std::array<int, label_count> count{};
  for (const Labels& t : r.in)
    for (const int l : t) ++count[static_cast<std::size_t>(l)];
  if (arrow == std::string::npos) {  // implicit: the ellipsis' axes, then labels seen once, in order
    for (int k = 0; k < max_ell; ++k) r.out.push_back(ellipsis_base + k);
    for (int l = 0; l < ellipsis_base; ++l)
      if (count[static_cast<std::size_t>(l)] == 1) r.out.push_back(l);
  } else {
    if (SC_UNLIKELY(eq.find("->", arrow + 2) != std::string::npos))
      detail::fail<ValueError>("einsum", loc, "'", equation, "': '->' twice");
    int ell = -1;
    const std::string rhs = eq.substr(arrow + 2);
    if (SC_UNLIKELY(rhs.find(',') != std::string::npos))
      detail::fail<ValueError>("einsum", loc, "'", equation, "': one output term only");
    const std::size_t dots = rhs.find("...");
    const int letters = static_cast<int>(rhs.size()) - (dots == std::string::npos ? 0 : 3);
    r.out = parse_term(rhs, eq, letters + (dots == std::string::npos ? 0 : max_ell), ell, loc);
    number_ellipsis(r.out, ell, max_ell);
    std::array<int, label_count> seen{};
    for (const int l : r.out) {
      if (SC_UNLIKELY(l < ellipsis_base && count[static_cast<std::size_t>(l)] == 0))
        detail::fail<ValueError>("einsum", loc, "'", equation, "': output label '", label_name(l),
                                 "' is in no input term");
      if (SC_UNLIKELY(seen[static_cast<std::size_t>(l)]++ != 0))
        detail::fail<ValueError>("einsum", loc, "'", equation, "': output label '", label_name(l), "' twice");
    }
  }
  return r;
}

inline bool has(const Labels& ls, int l) { return std::find(ls.begin(), ls.end(), l) != ls.end(); }
inline std::int64_t index_of(const Labels& ls, int l) { return std::find(ls.begin(), ls.end(), l) - ls.begin(); }

/// An operand and the label of each of its axes.
struct Term {
  Tensor t;
  Labels labels;
};

/// x with axes in `order` (labels) whose perm is not the identity transposed.
inline Term arrange(const Term& x, const Labels& order, const std::source_location& loc) {
  std::vector<std::int64_t> perm;
  bool identity = true;
  for (std::size_t k = 0; k < order.size(); ++k) {
    perm.push_back(index_of(x.labels, order[k]));
    identity = identity && perm.back() == static_cast<std::int64_t>(k);
  }
  return {identity ? x.t : transpose(x.t, perm, loc), order};
}

/// x with the labels not in `keep` summed out.
inline Term sum_out(const Term& x, const Labels& keep, const std::source_location& loc) {
  std::vector<std::int64_t> axes;
  Labels rest;
  for (std::size_t k = 0; k < x.labels.size(); ++k) {
    if (has(keep, x.labels[k])) rest.push_back(x.labels[k]);
    else axes.push_back(static_cast<std::int64_t>(k));
  }
  if (axes.empty()) return x;
  return {sum(x.t, axes, false, loc), rest};
}

/// x with each repeated label's axes replaced by their diagonal (one axis, at the first place).
inline Term diagonals(Term x, const std::source_location& loc) {
  for (std::size_t a = 0; a < x.labels.size(); ++a)
    for (std::size_t b = a + 1; b < x.labels.size(); ++b) {
      if (x.labels[a] != x.labels[b]) continue;
      // move b next to a, flatten the pair, and gather the n diagonal entries (i * (n + 1))
      std::vector<std::int64_t> perm;
      for (std::size_t k = 0; k < x.labels.size(); ++k)
        if (k != b) perm.push_back(static_cast<std::int64_t>(k));
      perm.insert(perm.begin() + static_cast<std::ptrdiff_t>(a) + 1, static_cast<std::int64_t>(b));
      const Tensor moved = transpose(x.t, perm, loc);
      const std::int64_t n = x.t.shape()[static_cast<int>(a)];
      Shape flat;
      for (int k = 0; k < moved.rank(); ++k) {
        if (k == static_cast<int>(a) + 1) continue;
        flat.push_back(k == static_cast<int>(a) ? n * n : moved.shape()[k]);
      }
      const detail::DevicePin on(x.t.device());
      const Tensor diag = gather(reshape(moved, flat, loc), detail::arange_i64(0, n * n, n + 1, loc),
                                 static_cast<std::int64_t>(a), loc);
      x.labels.erase(x.labels.begin() + static_cast<std::ptrdiff_t>(b));
      x.t = diag;
      --b;  // the next axis moved into b's place
    }
  return x;
}

/// The product of the extents of `labels` in x.
inline std::int64_t extent(const Term& x, const Labels& labels) {
  std::int64_t n = 1;
  for (const int l : labels) n *= x.t.shape()[static_cast<int>(index_of(x.labels, l))];
  return n;
}

/// a and b contracted over their shared labels not in `keep` (one batched matmul): the result's
/// labels are the kept shared ones (the batch), then a's own, then b's own.
inline Term contract(const Term& a0, const Term& b0, const Labels& keep, const std::source_location& loc) {
  Labels a_keep = keep, b_keep = keep;  // each side keeps what the other or later ones need
  a_keep.insert(a_keep.end(), b0.labels.begin(), b0.labels.end());
  b_keep.insert(b_keep.end(), a0.labels.begin(), a0.labels.end());
  const Term a = sum_out(a0, a_keep, loc), b = sum_out(b0, b_keep, loc);
  Labels batch, shared, a_own, b_own;
  for (const int l : a.labels) {
    if (!has(b.labels, l)) a_own.push_back(l);
    else (has(keep, l) ? batch : shared).push_back(l);
  }
  for (const int l : b.labels)
    if (!has(a.labels, l)) b_own.push_back(l);
  const auto cat = [](std::initializer_list<const Labels*> parts) {
    Labels r;
    for (const Labels* p : parts) r.insert(r.end(), p->begin(), p->end());
    return r;
  };
  // a as [batch, own, shared], or [batch, shared, own] with a transpose flag when that is its order
  const Labels a_mk = cat({&batch, &a_own, &shared}), a_km = cat({&batch, &shared, &a_own});
  const bool ta = a.labels == a_km && a.labels != a_mk;
  const Labels b_kn = cat({&batch, &shared, &b_own}), b_nk = cat({&batch, &b_own, &shared});
  const bool tb = b.labels == b_nk && b.labels != b_kn;
  const Term ax = arrange(a, ta ? a_km : a_mk, loc), bx = arrange(b, tb ? b_nk : b_kn, loc);
  const std::int64_t nb = extent(a, batch), m = extent(a, a_own), k = extent(a, shared), n = extent(b, b_own);
  const Tensor a3 = reshape(ax.t, ta ? Shape{nb, k, m} : Shape{nb, m, k}, loc);
  const Tensor b3 = reshape(bx.t, tb ? Shape{nb, n, k} : Shape{nb, k, n}, loc);
  const Labels labels = cat({&batch, &a_own, &b_own});
  Shape shape;
  for (const int l : batch) shape.push_back(a.t.shape()[static_cast<int>(index_of(a.labels, l))]);
  for (const int l : a_own) shape.push_back(a.t.shape()[static_cast<int>(index_of(a.labels, l))]);
  for (const int l : b_own) shape.push_back(b.t.shape()[static_cast<int>(index_of(b.labels, l))]);
  return {reshape(matmul(a3, b3, ta, tb, loc), shape, loc), labels};
}

}  // namespace detail_einsum

/// Einstein summation (NumPy's einsum): `equation` names each operand's axes by letters
/// ("ij,jk->ik"); a label in several terms must have one extent (or 1, broadcast); labels left
/// out of the output are summed; a label repeated in one term takes the diagonal ("ii->i"). '...'
/// stands for the axes not named, right-aligned across operands and broadcast like NumPy's.
/// Without "->" the output is the '...' axes, then the labels seen once, in alphabetical order
/// (capitals first). Numeric dtypes (matmul's promotion); differentiable. Errors (a malformed
/// equation, a term that does not fit its operand's rank, extents that disagree) name einsum,
/// the equation, the shapes and the user's line.
inline Tensor einsum(std::string_view equation, const std::vector<Tensor>& xs,
                     std::source_location loc = std::source_location::current()) {
  namespace de = detail_einsum;
  if (SC_UNLIKELY(xs.empty())) detail::fail<ValueError>("einsum", loc, "'", equation, "' needs at least one operand");
  for (const Tensor& x : xs) {
    detail::require_defined(x, "einsum", loc);
    ops::require_dtype(!is_bool(x.dtype()), "einsum", x.dtype(), "numeric operands", loc);
  }
  const de::Equation eq = de::parse(equation, xs, loc);
  // every label's extent: equal across terms, or 1 (broadcast to the others')
  std::array<std::int64_t, de::label_count> size;
  size.fill(-1);
  for (std::size_t k = 0; k < xs.size(); ++k)
    for (std::size_t a = 0; a < eq.in[k].size(); ++a) {
      const int l = eq.in[k][a];
      std::int64_t& s = size[static_cast<std::size_t>(l)];
      const std::int64_t e = xs[k].shape()[static_cast<int>(a)];
      if (s == -1 || s == 1) s = e;
      else if (SC_UNLIKELY(e != 1 && e != s)) {
        std::ostringstream shapes;
        for (std::size_t j = 0; j < xs.size(); ++j) shapes << (j ? ", " : "") << xs[j].shape();
        detail::fail<ShapeError>("einsum", loc, "'", equation, "': label '", de::label_name(l), "' has extents ", s,
                                 " and ", e, " (shapes ", shapes.str(), ")");
      }
    }
  std::vector<de::Term> terms;
  for (std::size_t k = 0; k < xs.size(); ++k) {
    Shape full;
    bool broadcast = false;
    for (std::size_t a = 0; a < eq.in[k].size(); ++a) {
      full.push_back(size[static_cast<std::size_t>(eq.in[k][a])]);
      broadcast = broadcast || full.back() != xs[k].shape()[static_cast<int>(a)];
    }
    terms.push_back(de::diagonals({broadcast ? broadcast_to(xs[k], full, loc) : xs[k], eq.in[k]}, loc));
  }
  // left to right: each step keeps the output's labels and those of the terms still to come
  de::Term acc = terms[0];
  for (std::size_t k = 1; k < terms.size(); ++k) {
    de::Labels keep = eq.out;
    for (std::size_t j = k + 1; j < terms.size(); ++j) keep.insert(keep.end(), terms[j].labels.begin(), terms[j].labels.end());
    acc = de::contract(acc, terms[k], keep, loc);
  }
  return de::arrange(de::sum_out(acc, eq.out, loc), eq.out, loc).t;
}

/// An einsum equation and the line that wrote it (the operands come after it one by one, so the
/// location rides on the equation).
struct EinsumEquation {
  std::string_view text;
  std::source_location loc;
  template <class S>
    requires std::is_convertible_v<const S&, std::string_view>
  EinsumEquation(const S& s, std::source_location l = std::source_location::current()) : text(s), loc(l) {}
};

/// einsum of operands given one by one: einsum("ij,jk", a, b). (Staged operands take the staged
/// einsum of staged/materialized.hpp.)
template <class... T>
  requires(sizeof...(T) >= 1 && (std::is_convertible_v<const T&, const Tensor&> && ...) &&
           !(requires { typename T::staged_tag; } || ...))
inline Tensor einsum(EinsumEquation equation, const T&... xs) {
  return einsum(equation.text, std::vector<Tensor>{xs...}, equation.loc);
}

}  // namespace stagecraft
