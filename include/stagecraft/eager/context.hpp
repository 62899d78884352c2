// The thread's execution context: the one thread-local that dispatch reads per op call, and the
// interface a trace implements (graph/trace.hpp) so dispatch can append nodes without knowing graphs.
#pragma once
#include <cstdint>
#include <memory>
#include <source_location>
#include <span>
#include <string>
#include <vector>

#include "../ops/op_list.hpp"

namespace stagecraft {
class Tensor;
namespace ops {
struct Attrs;
struct OutMeta;
}  // namespace ops

namespace detail {

struct TapeStack;  // autodiff/
struct VariableInfo;

/// A source line a graph node keeps: std::source_location's file and line (file points at static
/// storage, or at a loaded graph's own strings).
struct SrcLoc {
  const char* file = "";
  std::uint32_t line = 0;
  static SrcLoc from(const std::source_location& l) { return {l.file_name(), l.line()}; }
};

/// What a symbolic tensor is: value `id` of the graph built by the trace with serial `trace`.
/// Trace serials are never reused, so a tensor that escaped a finished trace is recognised.
struct SymbolicValue {
  std::uint64_t trace = 0;
  int id = -1;
};

struct CustomRule;

/// A graph under construction, as dispatch and Variable see it (graph/trace.hpp implements it).
/// Traces nest (a cond branch inside a function): `parent` is the enclosing one.
struct TraceState {
  virtual ~TraceState() = default;
  /// Maps op inputs to this graph's values: symbolic tensors of this trace pass through, eager
  /// tensors become constants, variables' values become reads, outer traces' values captures.
  virtual void lift(std::span<const Tensor> in, std::vector<Tensor>& out, const std::source_location& loc) = 0;
  /// Appends an op node on lifted inputs, its output on `dev`; returns its symbolic output.
  virtual Tensor append(ops::OpId op, std::span<const Tensor> lifted, const ops::Attrs& attrs,
                        const ops::OutMeta& meta, Device dev, const std::source_location& loc) = 0;
  /// The in-trace value of a variable after an assignment inside the trace (null: none yet).
  virtual const Tensor* shadow(const VariableInfo* var) = 0;
  /// A read of the variable in this trace: what Variable::value() gives while tracing, so
  /// every use inside a function reads the variable at each call.
  virtual Tensor read(const VariableInfo* var, const std::source_location& loc) = 0;
  /// Records `var = value` as a side effect of the graph, in program order.
  virtual void assign(const VariableInfo* var, const Tensor& value, const std::source_location& loc) = 0;
  /// Appends a node whose results are `ys` (already traced) as a call of `xs` with `rule` as its
  /// gradient (sc::custom_gradient); returns the node's results, symbolic.
  virtual std::vector<Tensor> custom_gradient(const std::shared_ptr<const CustomRule>& rule, std::span<const Tensor> ys,
                                              std::span<const Tensor> xs, const std::source_location& loc) = 0;
  /// Whether a Variable may be created now (only on a function's first trace).
  virtual bool may_create_variables() const = 0;
  /// Where this trace's value `id` comes from, for errors: "`greater` at file.cpp:12" (the op or
  /// node that makes it and the user's line), or empty when unknown.
  virtual std::string origin(int id) const = 0;
  /// True when a symbolic tensor belongs to this trace or an enclosing one.
  bool owns(const SymbolicValue& v) const {
    for (const TraceState* t = this; t != nullptr; t = t->parent)
      if (t->serial == v.trace) return true;
    return false;
  }
  TraceState* parent = nullptr;
  std::uint64_t serial = 0;
};

/// The trainable variables a recorded custom_gradient's forward pass read (Variable::value), at
/// the recording depth it runs at (a read under the user's own StopRecording is not counted).
struct CustomReads {
  int depth = 0;
  std::vector<std::shared_ptr<const VariableInfo>> reads;
};

/// Per-thread state that decides what an op call does besides computing.
struct Context {
  TraceState* trace = nullptr;  ///< the innermost trace; non-null while a function is traced
  TapeStack* tapes = nullptr;   ///< non-null while a gradient tape is recording
  int no_record = 0;            ///< depth of stop_recording guards
  /// While a tape runs a recorded op's gradient rule: that op's user line, which the nodes the
  /// rule appends to a trace carry instead of the library's own line.
  const SrcLoc* loc_override = nullptr;
  CustomReads* custom_reads = nullptr;  ///< non-null while a recorded custom_gradient's forward runs
};

inline Context& context() {
  thread_local Context ctx;
  return ctx;
}

}  // namespace detail
}  // namespace stagecraft
