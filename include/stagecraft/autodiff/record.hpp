// What a gradient tape records, and the hook dispatch calls after each op while tapes exist.
#pragma once
#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <source_location>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "../eager/context.hpp"
#include "../ops/op.hpp"

namespace stagecraft {
class GradientTape;
}

namespace stagecraft::detail {

/// An op's gradient rule: one gradient per input (undefined = none), from the output's; only
/// the `wanted` inputs' gradients are used.
using VjpFn = std::vector<Tensor> (*)(const Tensor& grad_out, ops::Inputs in, const Tensor& out,
                                      const ops::Attrs& attrs, ops::Wanted wanted);
/// The gradient of a call with several results (a staged function, cond, while_loop, host_fn):
/// one gradient per input from one per result, an undefined one where no gradient reached that
/// result. One backward pass for all the results, not one per result. Only the `wanted` inputs'
/// gradients are used (a rule may leave the others undefined and skip their work).
using JointVjp = std::function<std::vector<Tensor>(const std::vector<Tensor>& grad_outs, ops::Wanted wanted)>;

/// A user's gradient rule for a call with inputs xs and results ys (sc::custom_gradient): one
/// gradient per input (undefined: none) from one per result. Shared by the tape entries and the
/// graph nodes of its calls (a traced call keeps its rule: the gradient of the staged function
/// runs it, traced into the backward graph).
struct CustomRule {
  using Backward = std::function<std::vector<Tensor>(const std::vector<Tensor>& grads, const std::vector<Tensor>& xs,
                                                     const std::vector<Tensor>& ys)>;
  Backward backward;
  /// A trainable variable a traced call's forward pass read without taking it as an input (its
  /// name; empty: none): the rule cannot give it a gradient, so recording the call raises.
  std::string unpassed_read;
};

/// An op's inputs as a recorded entry keeps them: up to three inline (every op but concat and
/// stack has at most three), more on the heap. Recording allocated a vector per op before.
class EntryInputs {
 public:
  static constexpr std::size_t inline_capacity = 3;
  EntryInputs() = default;
  explicit EntryInputs(ops::Inputs in) : n_(in.size()) {
    if (n_ > inline_capacity) heap_.assign(in.begin(), in.end());
    else std::copy(in.begin(), in.end(), inline_.begin());
  }
  const Tensor* begin() const { return n_ > inline_capacity ? heap_.data() : inline_.data(); }
  const Tensor* end() const { return begin() + n_; }
  std::size_t size() const { return n_; }
  const Tensor& operator[](std::size_t k) const { return begin()[k]; }
  operator ops::Inputs() const { return {begin(), n_}; }  // NOLINT: what vjp rules take

 private:
  std::array<Tensor, inline_capacity> inline_{};
  std::vector<Tensor> heap_;
  std::size_t n_ = 0;
};

/// One recorded op call, shared by every tape that watched one of its inputs.
struct TapeEntry : RefCounted {
  std::string_view op;
  VjpFn vjp = nullptr;                    ///< null: no rule (error if reached) or joint
  std::shared_ptr<const JointVjp> joint;  ///< set for a call with several results, or a custom rule
  EntryInputs inputs;
  Tensor output;                     ///< the result (a joint entry's first)
  std::vector<Tensor> more_outputs;  ///< a joint entry's other results
  ops::Attrs attrs;
  std::source_location loc;
  /// The rule takes a gradient of a shape that broadcasts to the output's (ops::TakesBroadcastGrad);
  /// otherwise the tape broadcasts it first.
  bool broadcast_grad = false;
  /// The rule may give gradients that broadcast to their inputs (ops::GivesBroadcastGrad).
  bool gives_broadcast_grad = false;
  /// The rule gives the second input -g (ops::NegatesSecondGrad).
  bool negates_second = false;

  template <class F>
  void for_each_output(F&& f) const {
    f(output);
    for (const Tensor& o : more_outputs) f(o);
  }
};

/// A set of tensor identities with no allocation per insert (open addressing over a
/// power-of-two table of pointers; recording inserted into a node-based hash map per op). It
/// does not keep the tensors alive: the tape holds their handles.
class ImplSet {
 public:
  bool contains(const TensorImpl* p) const {
    if (size_ == 0) return false;
    for (std::size_t i = slot(p);; i = (i + 1) & mask_) {
      if (table_[i] == p) return true;
      if (table_[i] == nullptr) return false;
    }
  }
  /// Adds p; false when it was already there.
  bool insert(const TensorImpl* p) {
    if ((size_ + 1) * 4 > table_.size() * 3) grow();
    for (std::size_t i = slot(p);; i = (i + 1) & mask_) {
      if (table_[i] == p) return false;
      if (table_[i] == nullptr) {
        table_[i] = p;
        ++size_;
        return true;
      }
    }
  }
  void clear() {
    table_.assign(table_.size(), nullptr);
    size_ = 0;
  }

 private:
  std::size_t slot(const TensorImpl* p) const {
    return static_cast<std::size_t>((reinterpret_cast<std::uintptr_t>(p) >> 4) * 0x9E3779B97F4A7C15ull >> 20) & mask_;
  }
  void grow() {
    std::vector<const TensorImpl*> old = std::move(table_);
    table_.assign(old.empty() ? 64 : old.size() * 2, nullptr);
    mask_ = table_.size() - 1;
    size_ = 0;
    for (const TensorImpl* p : old)
      if (p != nullptr) insert(p);
  }
  std::vector<const TensorImpl*> table_;
  std::size_t mask_ = 0, size_ = 0;
};

/// The recording state of one tape: owned by the GradientTape and by the stack of the thread
/// that made it (reference counted), so a tape destroyed on another thread, or out of order,
/// leaves no dangling pointer behind: it is only marked dead, and the owner thread drops it.
class TapeRecorder : public RefCounted {
 public:
  explicit TapeRecorder(bool persistent) : persistent_(persistent), owner_(std::this_thread::get_id()) {}

  /// True when t is watched by this tape, or is a trainable variable's value (then it
  /// becomes watched: every recording tape watches trainable variables automatically).
  bool is_watched(const Tensor& t) {
    const TensorImpl* p = t.impl();
    if (watched_.contains(p)) return true;
    if (p->variable != nullptr && p->variable->trainable) {
      watch(t);
      return true;
    }
    return false;
  }
  void watch(const Tensor& t) {
    if (watched_.insert(t.impl())) held_.push_back(t);  // the handle keeps the identity unique
  }
  void add(const Ref<TapeEntry>& e) {
    entries_.push_back(e);
    e->for_each_output([&](const Tensor& o) { watched_.insert(o.impl()); });  // the entry holds them
  }
  /// Records now: alive and not paused.
  bool recording() const { return recording_ && !dead_.load(std::memory_order_acquire); }
  bool dead() const { return dead_.load(std::memory_order_acquire); }
  /// Called by the tape's destructor, on whatever thread: from now on the recorder records
  /// nothing, and the owner thread's stack lets go of it.
  void kill() { dead_.store(true, std::memory_order_release); }
  std::thread::id owner() const { return owner_; }

 protected:
  friend class stagecraft::GradientTape;
  void forget() {
    entries_.clear();
    watched_.clear();
    held_.clear();
  }
  bool persistent_;
  bool recording_ = true;
  bool used_ = false;     // a non-persistent tape's one gradient() has run
  bool running_ = false;  // gradient() is running (reset() and a nested gradient() must wait)
  std::thread::id owner_;
  std::atomic<bool> dead_{false};
  ImplSet watched_;            // watched tensors and recorded outputs
  std::vector<Tensor> held_;   // handles of the watched tensors that are not outputs
  std::vector<Ref<TapeEntry>> entries_;
};

/// The thread's live tapes, outermost first; context().tapes points here while non-empty.
struct TapeStack {
  std::vector<Ref<TapeRecorder>> tapes;
  /// Drops the tapes that died (destroyed on another thread, or while hidden by a trace's
  /// isolation) and keeps context().tapes in step.
  void prune() {
    std::erase_if(tapes, [](const Ref<TapeRecorder>& t) { return t->dead(); });
    context().tapes = tapes.empty() ? nullptr : this;
  }
};
inline TapeStack& tape_stack() {
  thread_local TapeStack s;
  return s;
}

/// RAII: hides the thread's gradient tapes for the guard's lifetime (a traced body records only
/// on tapes made inside it; its gradient reaches outer tapes as one recorded call).
class TapeIsolation {
 public:
  TapeIsolation() {
    Context& ctx = context();
    saved_.swap(tape_stack().tapes);
    saved_no_record_ = ctx.no_record;
    ctx.tapes = nullptr;
    ctx.no_record = 0;
  }
  ~TapeIsolation() {
    Context& ctx = context();
    tape_stack().tapes.swap(saved_);
    ctx.no_record = saved_no_record_;
    tape_stack().prune();  // drops tapes that died while hidden; sets ctx.tapes
  }
  TapeIsolation(const TapeIsolation&) = delete;
  TapeIsolation& operator=(const TapeIsolation&) = delete;

 private:
  std::vector<Ref<TapeRecorder>> saved_;
  int saved_no_record_ = 0;
};

template <class Op>
constexpr VjpFn vjp_of() {
  if constexpr (ops::HasSelectiveVjp<Op>) {
    return [](const Tensor& g, ops::Inputs in, const Tensor& out, const ops::Attrs& a, ops::Wanted w) {
      return std::vector<Tensor>(Op::vjp(g, in, out, a, w));
    };
  } else if constexpr (ops::HasVjp<Op>) {
    return [](const Tensor& g, ops::Inputs in, const Tensor& out, const ops::Attrs& a, ops::Wanted) {
      return std::vector<Tensor>(Op::vjp(g, in, out, a));
    };
  } else {
    return nullptr;
  }
}
template <class Op>
concept NonDifferentiable = requires { requires !Op::differentiable; };

/// Adds one entry (built by make() only if some tape wants it) to every recording tape that
/// watches one of the inputs; the entry is shared between tapes.
template <class Make>
void record_entry(ops::Inputs in, Make&& make) {
  Ref<TapeEntry> e;
  for (const Ref<TapeRecorder>& t : tape_stack().tapes) {
    if (!t->recording()) continue;
    bool any = false;
    for (const Tensor& x : in) any = t->is_watched(x) || any;  // no short cut: each input may need watching
    if (!any) continue;
    if (!e) e = Ref<TapeEntry>::adopt(make());
    t->add(e);
  }
}

/// What an op's tape entries hold besides the call itself: one constant per op, so recording is
/// one function for every op rather than an instantiation each.
struct EntryKind {
  std::string_view op;
  VjpFn vjp = nullptr;
  bool broadcast_grad = false, gives_broadcast_grad = false, negates_second = false;
};
template <class Op>
inline constexpr EntryKind entry_kind{Op::name, vjp_of<Op>(), ops::TakesBroadcastGrad<Op>, ops::GivesBroadcastGrad<Op>,
                                      ops::NegatesSecondGrad<Op>};

/// Records a call of the op `k` describes on every recording tape that watches one of its inputs.
SC_NOINLINE inline void record_call(const EntryKind& k, ops::Inputs in, const ops::Attrs& attrs, const Tensor& out,
                                    const std::source_location& loc) {
  if (context().no_record > 0) return;
  // An op that hands back one of its inputs is the identity to the tape; recording it would
  // make a loop that counts the gradient twice.
  for (const Tensor& x : in)
    if (x.same(out)) return;
  record_entry(in, [&] {
    auto* e = new TapeEntry;
    e->op = k.op;
    e->vjp = k.vjp;
    e->inputs = EntryInputs(in);
    e->output = out;
    e->attrs = attrs;
    e->loc = loc;
    e->broadcast_grad = k.broadcast_grad;
    e->gives_broadcast_grad = k.gives_broadcast_grad;
    e->negates_second = k.negates_second;
    return e;
  });
}

/// Records an op call on every recording tape that watches one of its inputs.
template <class Op>
void record_on_tapes(ops::Inputs in, const ops::Attrs& attrs, const Tensor& out, const std::source_location& loc) {
  if constexpr (!NonDifferentiable<Op>)  // (integer/bool results carry no gradient: nothing downstream is recorded)
    record_call(entry_kind<Op>, in, attrs, out, loc);
}

/// Lets every recording tape see the values in `in` now, as an op reading them would: a
/// trainable variable's current value becomes watched (an assignment later makes it a plain
/// tensor, which no tape would then watch automatically).
inline void see_inputs(ops::Inputs in) {
  if (context().tapes == nullptr || context().no_record > 0) return;
  for (const Ref<TapeRecorder>& t : tape_stack().tapes)
    if (t->recording())
      for (const Tensor& x : in) (void)t->is_watched(x);
}

/// Records one entry for a call with several results on every tape watching an input: its
/// floating-point results (the others carry no gradient) share the entry, and `fn` receives one
/// gradient per element of `outs` (undefined for a result no gradient reached, and for the
/// non-float ones). The tape then runs the call's backward pass once, whatever the results used.
inline void record_joint(std::string_view op, ops::Inputs in, const std::vector<Tensor>& outs, JointVjp fn,
                         const std::source_location& loc) {
  if (context().tapes == nullptr || context().no_record > 0) return;
  std::vector<std::size_t> kept;  // the float results' positions in outs
  for (std::size_t k = 0; k < outs.size(); ++k)
    if (is_floating(outs[k].dtype())) kept.push_back(k);
  if (kept.empty()) return;
  record_entry(in, [&] {
    auto* e = new TapeEntry;
    e->op = op;
    e->inputs = EntryInputs(in);
    e->output = outs[kept[0]];
    for (std::size_t j = 1; j < kept.size(); ++j) e->more_outputs.push_back(outs[kept[j]]);
    const std::size_t n = outs.size();
    e->joint = std::make_shared<const JointVjp>(
        [fn = std::move(fn), kept, n](const std::vector<Tensor>& g, ops::Wanted wanted) {
          std::vector<Tensor> all(n);
          for (std::size_t j = 0; j < kept.size(); ++j) all[kept[j]] = g[j];
          return fn(all, wanted);
        });
    e->loc = loc;
    return e;
  });
}

}  // namespace stagecraft::detail
