// The op registry: every op's id, name, arity and differentiability as a constexpr table built
// from STAGECRAFT_OP_LIST. Includes every op header, so only tests and the graph layer use it.
#pragma once
#include <array>
#include <cstddef>
#include <string_view>

#include "op_list.hpp"

// Every op's home (an op added to op_list.hpp without its header here fails to compile below).
#include "add_n.hpp"
#include "along_axis.hpp"
#include "binary.hpp"
#include "broadcast_to.hpp"
#include "cast.hpp"
#include "check_range.hpp"
#include "concat.hpp"
#include "cross_entropy.hpp"
#include "conv.hpp"
#include "fill.hpp"
#include "gather.hpp"
#include "matmul.hpp"
#include "pool.hpp"
#include "random.hpp"
#include "reduce.hpp"
#include "reshape.hpp"
#include "scan.hpp"
#include "slice.hpp"
#include "sort.hpp"
#include "stop_gradient.hpp"
#include "to_device.hpp"
#include "transpose.hpp"
#include "unary.hpp"
#include "where.hpp"

namespace stagecraft::ops {

/// What is known about an op without calling it: for printers, parsers, coverage checks.
struct OpInfo {
  OpId id;
  std::string_view name;  ///< as printed in errors and graphs ("add")
  int arity;              ///< number of inputs, -1 for a list (concat)
  bool differentiable;    ///< false for integer-valued results (comparisons, argmax, one_hot)
  ElementwiseKind elementwise = ElementwiseKind::none;  ///< its elementwise family, none if not elementwise
};

/// Op's `differentiable` flag; ops that do not state one are differentiable.
template <class Op>
constexpr bool op_is_differentiable() {
  if constexpr (requires { Op::differentiable; }) return Op::differentiable;
  else return true;
}

/// Op's elementwise family: stated by the Unary/Binary bases (from their kind), where and cast;
/// none for the others.
template <class Op>
constexpr ElementwiseKind op_elementwise_kind() {
  if constexpr (requires { Op::elementwise_kind; }) return Op::elementwise_kind;
  else return ElementwiseKind::none;
}

/// Every op in op-list order: op_registry[static_cast<size_t>(id)] describes OpId id.
inline constexpr std::array<OpInfo, num_ops> op_registry = {{
#define STAGECRAFT_OP_INFO(S) OpInfo{S::id, S::name, S::arity, op_is_differentiable<S>(), op_elementwise_kind<S>()},
    STAGECRAFT_OP_LIST(STAGECRAFT_OP_INFO)
#undef STAGECRAFT_OP_INFO
}};

// Each struct's SC_OP_HEAD names its own line of the op list (a copy-pasted head fails here).
static_assert([] {
  for (std::size_t i = 0; i < op_registry.size(); ++i)
    if (static_cast<std::size_t>(op_registry[i].id) != i) return false;
  return true;
}(), "stagecraft: an op struct's SC_OP_HEAD names another op's OpId");

// Names are unique (graphs are printed and parsed by name).
static_assert([] {
  for (std::size_t i = 0; i < op_registry.size(); ++i)
    for (std::size_t j = i + 1; j < op_registry.size(); ++j)
      if (op_registry[i].name == op_registry[j].name) return false;
  return true;
}(), "stagecraft: two ops share a name");

/// The registry entry of an op.
constexpr const OpInfo& op_info(OpId id) { return op_registry[static_cast<std::size_t>(id)]; }

/// The registry entry with this name, or nullptr.
constexpr const OpInfo* find_op(std::string_view name) {
  for (const OpInfo& info : op_registry)
    if (info.name == name) return &info;
  return nullptr;
}

}  // namespace stagecraft::ops
