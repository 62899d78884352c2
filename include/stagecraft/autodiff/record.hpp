// What a gradient tape records, and the hook dispatch calls after each op while tapes exist.
#pragma once
#include <functional>
#include <memory>
#include <source_location>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "../eager/context.hpp"
#include "../ops/op.hpp"

namespace stagecraft::detail {

/// An op's gradient rule: one gradient per input (undefined = none), from the output's.
using VjpFn = std::vector<Tensor> (*)(const Tensor& grad_out, ops::Inputs in, const Tensor& out,
                                      const ops::Attrs& attrs);
/// A user-supplied gradient (sc::custom_gradient).
using CustomVjp = std::function<std::vector<Tensor>(const Tensor& grad_out)>;

/// One recorded op call, shared by every tape that watched one of its inputs.
struct TapeEntry {
  std::string_view op;
  VjpFn vjp = nullptr;                     ///< null: no rule (error if reached) or custom
  std::shared_ptr<const CustomVjp> custom; ///< set for sc::custom_gradient
  std::vector<Tensor> inputs;
  Tensor output;
  ops::Attrs attrs;
  std::source_location loc;
};

/// The recording state of one tape (GradientTape derives from it).
class TapeRecorder {
 public:
  explicit TapeRecorder(bool persistent) : persistent_(persistent) {}
  virtual ~TapeRecorder() = default;

  /// True when t is watched by this tape, or is a trainable variable's value (then it
  /// becomes watched: every recording tape watches trainable variables automatically).
  bool is_watched(const Tensor& t) {
    const TensorImpl* p = t.impl();
    if (watched_.count(p)) return true;
    if (p->variable != nullptr && p->variable->trainable) {
      watched_.emplace(p, t);
      return true;
    }
    return false;
  }
  void watch(const Tensor& t) { watched_.emplace(t.impl(), t); }
  void add(const std::shared_ptr<TapeEntry>& e) {
    entries_.push_back(e);
    watched_.emplace(e->output.impl(), e->output);
  }
  bool recording() const { return recording_; }

 protected:
  bool persistent_;
  bool recording_ = true;
  std::unordered_map<const TensorImpl*, Tensor> watched_;  // the handles keep tensors alive
  std::vector<std::shared_ptr<TapeEntry>> entries_;
};

/// The thread's live tapes, outermost first; context().tapes points here while non-empty.
struct TapeStack {
  std::vector<TapeRecorder*> tapes;
};
inline TapeStack& tape_stack() {
  thread_local TapeStack s;
  return s;
}

template <class Op>
constexpr VjpFn vjp_of() {
  if constexpr (ops::HasVjp<Op>) return &Op::vjp;
  else return nullptr;
}
template <class Op>
concept NonDifferentiable = requires { requires !Op::differentiable; };

/// Adds one entry (built by make() only if some tape wants it) to every recording tape that
/// watches one of the inputs; the entry is shared between tapes.
template <class Make>
void record_entry(ops::Inputs in, Make&& make) {
  std::shared_ptr<TapeEntry> e;
  for (TapeRecorder* t : tape_stack().tapes) {
    if (!t->recording()) continue;
    bool any = false;
    for (const Tensor& x : in) any = t->is_watched(x) || any;  // no short cut: each input may need watching
    if (!any) continue;
    if (!e) e = std::make_shared<TapeEntry>(make());
    t->add(e);
  }
}

/// Records an op call on every recording tape that watches one of its inputs.
template <class Op>
void record_on_tapes(ops::Inputs in, const ops::Attrs& attrs, const Tensor& out, const std::source_location& loc) {
  if constexpr (NonDifferentiable<Op>) {
    return;  // integer/bool results carry no gradient, so nothing downstream is recorded
  } else {
    if (context().no_record > 0) return;
    // An op that hands back one of its inputs is the identity to the tape; recording it would
    // make a loop that counts the gradient twice.
    for (const Tensor& x : in)
      if (x.same(out)) return;
    record_entry(in, [&] { return TapeEntry{Op::name, vjp_of<Op>(), nullptr, {in.begin(), in.end()}, out, attrs, loc}; });
  }
}

/// Records a user-defined gradient (sc::custom_gradient) on every tape watching an input.
inline void record_custom(std::string_view op, ops::Inputs in, const Tensor& out, CustomVjp fn,
                          const std::source_location& loc) {
  if (context().tapes == nullptr || context().no_record > 0) return;
  record_entry(in, [&] {
    return TapeEntry{op, nullptr, std::make_shared<const CustomVjp>(std::move(fn)), {in.begin(), in.end()}, out, {}, loc};
  });
}

}  // namespace stagecraft::detail
