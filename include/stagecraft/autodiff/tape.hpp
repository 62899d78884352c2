// GradientTape: RAII, nestable reverse-mode autodiff over recorded op calls.
#pragma once
#include <algorithm>
#include <source_location>
#include <string_view>
#include <thread>
#include <unordered_set>
#include <vector>

#include "../core/creation.hpp"
#include "../ops/add_n.hpp"
#include "../ops/binary.hpp"
#include "../ops/cast.hpp"
#include "../ops/fill.hpp"
#include "../ops/reduce.hpp"
#include "record.hpp"

namespace stagecraft {

class Variable;

namespace detail {

/// A gradient's contributions kept before they are summed (GradientTape::gradient): as many as
/// one GPU add_n launch takes, and at most this many bytes of them.
inline constexpr std::size_t max_pending_gradients = 32;
inline constexpr std::int64_t max_pending_gradient_bytes = std::int64_t{64} << 20;

/// g summed down to `shape` (undoing a broadcast): sums away the leading extra axes, then
/// (keeping dims) the axes where shape has 1. Only sums, no reshape, so an outer tape that
/// records this needs no layout op's gradient. A gradient that cannot come from a broadcast
/// of `shape` is a bug in the rule of `op`, reported as such.
inline Tensor sum_to(const Tensor& g, const Shape& shape, std::string_view op, const std::source_location& loc) {
  if (g.shape() == shape) return g;
  const int lead = g.rank() - shape.rank();
  Tensor s = g;
  if (lead > 0) {
    std::vector<std::int64_t> axes;
    for (int i = 0; i < lead; ++i) axes.push_back(i);
    s = sum(s, axes, false, loc);
  }
  std::vector<std::int64_t> ones_axes;
  for (int i = 0; i < s.rank() && lead >= 0; ++i)
    if (shape[i] == 1 && s.shape()[i] != 1) ones_axes.push_back(i);
  if (!ones_axes.empty()) s = sum(s, ones_axes, true, loc);
  if (SC_UNLIKELY(s.shape() != shape))
    fail<ShapeError>(op, loc, "gradient rule returned shape ", g.shape(), " for an input of shape ", shape);
  return s;
}

/// g as a tensor of `shape` (g's shape broadcasts to it).
inline Tensor full_gradient(const Tensor& g, const Shape& shape, const std::source_location& loc) {
  return !g.defined() || g.shape() == shape ? g : broadcast_to(g, shape, loc);
}

/// The gradient g a rule gave for an input of shape x, in the tape's form. A rule that may give
/// it unbroadcast (`may_broadcast`: ops::GivesBroadcastGrad) gives one that stands for a tensor
/// of shape `whole` (an elementwise op's output, a sum's input): kept so where x is `whole`,
/// else broadcast and summed down to x (x was broadcast by the op). Any other rule's is summed
/// down to x (sum_to).
inline Tensor input_gradient(const Tensor& g, const Shape& whole, const Shape& x, bool may_broadcast,
                             std::string_view op, const std::source_location& loc) {
  Shape both;
  if (may_broadcast && broadcast_shapes(g.shape(), whole, both) && both == whole)
    return whole == x ? g : sum_to(full_gradient(g, whole, loc), x, op, loc);
  return sum_to(g, x, op, loc);
}

/// RAII: ops traced while alive carry `loc` (a recorded op's user line) instead of their own.
class LocOverride {
 public:
  explicit LocOverride(const std::source_location& loc) : LocOverride(SrcLoc::from(loc)) {}
  explicit LocOverride(const SrcLoc& loc) : loc_(loc), saved_(context().loc_override) {
    context().loc_override = &loc_;
  }
  ~LocOverride() { context().loc_override = saved_; }
  LocOverride(const LocOverride&) = delete;
  LocOverride& operator=(const LocOverride&) = delete;

 private:
  SrcLoc loc_;
  const SrcLoc* saved_;
};

/// RAII: pushes a tape's recorder on the thread's stack for the tape's lifetime. Destroyed on
/// the thread that made it, in any order, it takes the recorder off that thread's stack; on
/// another thread it only marks the recorder dead (another thread's stack is not touched), and
/// the owner thread drops it at its next tape change. Either way nothing dangles.
class TapeScope {
 public:
  explicit TapeScope(Ref<TapeRecorder> t) : t_(std::move(t)) {
    TapeStack& st = tape_stack();
    st.prune();
    st.tapes.push_back(t_);
    context().tapes = &st;
  }
  ~TapeScope() {
    t_->kill();
    if (std::this_thread::get_id() == t_->owner()) tape_stack().prune();
  }
  TapeScope(const TapeScope&) = delete;
  TapeScope& operator=(const TapeScope&) = delete;

 private:
  Ref<TapeRecorder> t_;
};

}  // namespace detail

/// Records, while alive, every op call that has a watched input (tensors passed to watch(),
/// trainable Variables automatically, and everything computed from them), then computes
/// gradients by running the recorded ops' gradient rules backwards. Tapes nest: an outer
/// tape records the ops an inner tape's gradient() runs, giving higher derivatives.
///
/// A tape belongs to the thread that made it: it records that thread's ops, and watch(),
/// gradient() and reset() on another thread raise ValueError. Destroying it on another thread
/// or out of order is safe (it stops recording at once).
class GradientTape {
 public:
  /// A non-persistent tape allows one gradient() call and then frees what it recorded.
  explicit GradientTape(bool persistent = false)
      : rec_(detail::Ref<detail::TapeRecorder>::adopt(new detail::TapeRecorder(persistent))), scope_(rec_) {}
  GradientTape(const GradientTape&) = delete;
  GradientTape& operator=(const GradientTape&) = delete;

  /// Starts tracking t: ops on it are recorded from now on.
  void watch(const Tensor& t, std::source_location loc = std::source_location::current()) {
    detail::require_defined(t, "GradientTape::watch", loc);
    same_thread("GradientTape::watch", loc);
    rec_->watch(in_trace(t, loc));
  }
  /// Watches several tensors.
  void watch(const std::vector<Tensor>& ts, std::source_location loc = std::source_location::current()) {
    for (const Tensor& t : ts) watch(t, loc);
  }

  /// d(sum of target)/d(source): same shape as source; zeros when source is unconnected or
  /// not tracked by this tape (neither watched, nor a trainable variable, nor computed from one).
  Tensor gradient(const Tensor& target, const Tensor& source,
                  std::source_location loc = std::source_location::current()) {
    return run(target, std::vector<Tensor>{source}, loc)[0];
  }
  /// One gradient per source, in order.
  std::vector<Tensor> gradient(const Tensor& target, const std::vector<Tensor>& sources,
                               std::source_location loc = std::source_location::current()) {
    return run(target, sources, loc);
  }
  /// The vector-Jacobian product sum(output_gradient * d target/d source): as gradient(), but
  /// the target's gradient starts from output_gradient (target's shape) instead of ones.
  Tensor gradient(const Tensor& target, const Tensor& source, const Tensor& output_gradient,
                  std::source_location loc = std::source_location::current()) {
    return run(target, std::vector<Tensor>{source}, loc, &output_gradient)[0];
  }
  /// One vector-Jacobian product per source, starting from output_gradient.
  std::vector<Tensor> gradient(const Tensor& target, const std::vector<Tensor>& sources,
                               const Tensor& output_gradient,
                               std::source_location loc = std::source_location::current()) {
    return run(target, sources, loc, &output_gradient);
  }
  /// Gradients with respect to variables (their current values).
  template <class V>
    requires std::convertible_to<const V&, const Tensor&> && (!std::same_as<V, Tensor>)
  std::vector<Tensor> gradient(const Tensor& target, const std::vector<V>& sources,
                               std::source_location loc = std::source_location::current()) {
    std::vector<Tensor> ts;
    ts.reserve(sources.size());
    for (const V& v : sources) ts.push_back(static_cast<const Tensor&>(v));
    return run(target, ts, loc);
  }

  /// Number of op calls recorded so far (for tests and diagnostics).
  std::size_t size() const { return rec_->entries_.size(); }
  bool persistent() const { return rec_->persistent_; }
  /// Forgets everything recorded and watched (a persistent tape can then start over). Not
  /// allowed while the tape's own gradient() runs (from a custom gradient): ValueError.
  void reset(std::source_location loc = std::source_location::current()) {
    same_thread("GradientTape::reset", loc);
    if (SC_UNLIKELY(rec_->running_))
      detail::fail<ValueError>("GradientTape::reset", loc, "the tape's gradient() is running (reset() was called from "
                               "inside a gradient rule); reset it after gradient() returns");
    detail::TapeRecorder& r = *rec_;
    r.forget();
    r.used_ = false;
    r.recording_ = true;
  }

  /// RAII: while alive, this thread's tapes record nothing (values are computed as usual).
  class StopRecording {
   public:
    StopRecording() { ++detail::context().no_record; }
    ~StopRecording() { --detail::context().no_record; }
    StopRecording(const StopRecording&) = delete;
    StopRecording& operator=(const StopRecording&) = delete;
  };
  /// Pauses recording on every tape for the guard's lifetime: `auto g = tape.stop_recording();`
  [[nodiscard]] StopRecording stop_recording() const { return {}; }

 private:
  std::vector<Tensor> run(const Tensor& target, const std::vector<Tensor>& sources, const std::source_location& loc,
                          const Tensor* seed = nullptr);

  /// Inside a traced function, a tensor from outside it (a captured constant) is used by the
  /// ops as the graph's value for it: the tape watches and differentiates that value.
  static Tensor in_trace(const Tensor& t, const std::source_location& loc) {
    detail::TraceState* tr = detail::context().trace;
    if (tr == nullptr || !t.defined() || t.is_symbolic()) return t;
    std::vector<Tensor> out;
    tr->lift({&t, 1}, out, loc);
    return out[0];
  }

  void same_thread(std::string_view op, const std::source_location& loc) const {
    if (SC_UNLIKELY(std::this_thread::get_id() != rec_->owner()))
      detail::fail<ValueError>(op, loc, "the tape was made on another thread; a GradientTape records and "
                               "differentiates the ops of the thread that made it (make one tape per thread)");
  }

  detail::Ref<detail::TapeRecorder> rec_;
  detail::TapeScope scope_;
};

inline std::vector<Tensor> GradientTape::run(const Tensor& target, const std::vector<Tensor>& given,
                                             const std::source_location& loc, const Tensor* seed) {
  std::vector<Tensor> sources;
  sources.reserve(given.size());
  for (const Tensor& s : given) sources.push_back(in_trace(s, loc));
  detail::require_defined(target, "gradient", loc);
  same_thread("gradient", loc);
  detail::TapeRecorder& rec = *rec_;
  if (SC_UNLIKELY(rec.running_))
    detail::fail<ValueError>("gradient", loc, "the tape's gradient() is already running (called again from inside a "
                             "gradient rule); use another tape inside custom gradients");
  if (rec.used_ && !rec.persistent_)
    detail::fail<ValueError>("gradient", loc, "a non-persistent GradientTape can compute gradients only once; "
                                         "use sc::GradientTape tape(/*persistent=*/true) for several calls");
  if (!is_floating(target.dtype()))
    detail::fail<DTypeError>("gradient", loc, "the target has dtype ", name(target.dtype()),
                             "; only floating-point results are differentiable");
  if (seed != nullptr) {
    detail::require_defined(*seed, "gradient", loc);
    if (seed->shape() != target.shape())
      detail::fail<ShapeError>("gradient", loc, "output_gradient has shape ", seed->shape(), ", the target has shape ",
                               target.shape());
    if (seed->device() != target.device())
      detail::fail<DeviceError>("gradient", loc, "output_gradient is on ", seed->device().str(), ", the target on ",
                                target.device().str(), "; move it there with .to()");
  }
  for (const Tensor& s : sources) {
    detail::require_defined(s, "gradient", loc);
    if (!is_floating(s.dtype()))
      detail::fail<DTypeError>("gradient", loc, "a source has dtype ", name(s.dtype()),
                               "; gradients exist only for floating-point tensors");
  }
  rec.used_ = true;
  rec.running_ = true;
  const bool was_recording = rec.recording_;
  rec.recording_ = false;  // this tape does not record its own backward pass; outer tapes do
  struct Restore {
    detail::TapeRecorder* t;
    bool r;
    ~Restore() {
      t->running_ = false;
      if (t->persistent_) {
        t->recording_ = r;
      } else {
        // A used non-persistent tape lets go of what it recorded, and records nothing more (it
        // can never use it; trainable variables would otherwise be recorded again until it dies).
        t->forget();
        t->recording_ = false;
      }
    }
  } restore{&rec, was_recording};
  const std::vector<detail::Ref<detail::TapeEntry>>& entries = rec.entries_;

  // Forward sweep: which recorded values depend on a source (only those need gradients). A
  // source the tape does not track (never watched, not a trainable variable it saw, not a
  // recorded result) is a constant to it: the ops that used it only alongside watched
  // tensors were recorded, the others were not, so following it would give part of a
  // gradient. Its gradient is zeros, like an unconnected source's.
  std::unordered_set<const detail::TensorImpl*> depends;
  for (const Tensor& s : sources)
    if (rec.watched_.contains(s.impl())) depends.insert(s.impl());
  std::vector<char> relevant(entries.size(), 0);
  for (std::size_t i = 0; i < entries.size(); ++i) {
    for (const Tensor& x : entries[i]->inputs)
      if (depends.count(x.impl())) relevant[i] = 1;
    if (relevant[i]) entries[i]->for_each_output([&](const Tensor& o) { depends.insert(o.impl()); });
  }

  // Backward sweep in reverse recording order. A value's gradient contributions (a weight used
  // at every step of a recurrence) are added as they come, in arrival order (ops, so an outer
  // tape records them), except on a GPU: there they are kept and summed when the value is read,
  // by add_n, with the bits of the adds but one launch instead of one each (every
  // detail::max_pending_gradients of them, or sooner for large ones, they are summed so far). On
  // the CPU an add at once reads a contribution still in cache (the eager LSTM step of
  // bench/time_train_step.cpp: 0.70 ms so, 0.82 with add_n). A traced backward pass keeps the
  // adds: the fusion pass joins them to their neighbours.
  struct Partial {
    Tensor sum;                 // the contributions summed so far
    std::vector<Tensor> later;  // on a GPU: the ones still to add to it, in order
    std::source_location at;
  };
  const bool chain = detail::context().trace != nullptr;
  auto total = [](Partial& p) -> const Tensor& {
    if (!p.later.empty()) {
      p.later.insert(p.later.begin(), p.sum);
      p.sum = add_n(p.later, p.at);
      p.later.clear();
    }
    return p.sum;
  };
  std::unordered_map<const detail::TensorImpl*, Partial> grads;
  // The seed of ones is an op (Fill), so a traced backward pass records it as a node: one value,
  // which broadcasts to the target (the form the tape keeps: input_gradient).
  grads[target.impl()] = Partial{seed == nullptr                   ? detail::fill_on(target.device(), Shape{}, 1.0, target.dtype(), loc)
                                  : seed->dtype() == target.dtype() ? *seed
                                                                    : cast(*seed, target.dtype(), loc),
                                 {},
                                 loc};
  for (std::size_t i = entries.size(); i-- > 0;) {
    if (!relevant[i]) continue;
    const detail::TapeEntry& e = *entries[i];
    // The gradient of a result: its producer runs last (every consumer was recorded later), so
    // it is complete and, unless asked for, no longer needed: freeing it keeps the backward
    // pass's memory at the live frontier instead of every intermediate gradient. Undefined when
    // no gradient reached the result (a result listed twice gets its gradient once).
    auto take = [&](const Tensor& o) {
      auto it = grads.find(o.impl());
      if (it == grads.end()) return Tensor();
      Tensor g = total(it->second);
      if (std::none_of(sources.begin(), sources.end(), [&](const Tensor& s) { return s.same(o); })) grads.erase(it);
      return g;
    };
    // A gradient may still have a shape that broadcasts to its value's (input_gradient); a rule
    // that needs the full shape gets it broadcast.
    const Tensor g = e.broadcast_grad ? take(e.output) : detail::full_gradient(take(e.output), e.output.shape(), e.loc);
    std::vector<Tensor> g_more;
    bool reached = g.defined();
    for (const Tensor& o : e.more_outputs)
      reached = g_more.emplace_back(detail::full_gradient(take(o), o.shape(), e.loc)).defined() || reached;
    if (!reached) continue;
    std::vector<Tensor> gs;
    Tensor negated;  // (a second input's gradient summed down before it is negated)
    // Nodes the rule appends to a trace carry the forward op's user line, not this file's.
    const detail::LocOverride at_user_line(e.loc);
    // The inputs that depend on a source: a rule may skip the others' gradients (the first
    // layer's matmul then does not compute the gradient of the input images).
    ops::Wanted wanted{0};
    for (std::size_t k = 0; k < e.inputs.size() && k < 64; ++k)
      if (depends.count(e.inputs[k].impl())) wanted.bits |= std::uint64_t{1} << k;
    if (e.joint) {
      g_more.insert(g_more.begin(), g);
      gs = (*e.joint)(g_more, wanted);
    } else if (e.vjp) {
      // a second input the op broadcast, whose gradient is -g (sub's): g summed down, then negated
      const bool sum_first =
          e.negates_second && e.inputs.size() == 2 && wanted[1] && e.inputs[1].shape() != e.output.shape();
      if (sum_first) {
        const Shape& b = e.inputs[1].shape();
        negated = neg(detail::input_gradient(g, e.output.shape(), b, e.broadcast_grad, e.op, e.loc), e.loc);
        wanted.bits &= ~std::uint64_t{2};
      }
      gs = e.vjp(g, e.inputs, e.output, e.attrs, wanted);
      if (sum_first && gs.size() == 2) gs[1] = negated;
    } else
      detail::fail<ValueError>(e.op, e.loc, "has no gradient rule (asked by gradient() at ", detail::where(loc), ")");
    if (gs.size() != e.inputs.size())
      detail::fail<ValueError>(e.op, e.loc, "gradient rule returned ", gs.size(), " gradients for ", e.inputs.size(), " inputs");
    for (std::size_t k = 0; k < gs.size(); ++k) {
      const Tensor& x = e.inputs[k];
      if (!gs[k].defined() || !depends.count(x.impl())) continue;
      const Shape& whole = e.broadcast_grad ? e.output.shape() : x.shape();
      Tensor gk = k == 1 && negated.defined()
                      ? gs[k]  // (already x's shape)
                      : detail::input_gradient(gs[k], whole, x.shape(), e.gives_broadcast_grad, e.op, e.loc);
      if (gk.dtype() != x.dtype()) gk = cast(gk, x.dtype(), e.loc);
      auto [slot, fresh] = grads.try_emplace(x.impl());
      Partial& p = slot->second;
      if (fresh) {
        p.sum = std::move(gk);
        p.at = e.loc;
      } else if (chain || gk.device().is_cpu()) {
        p.sum = stagecraft::add(p.sum, gk, e.loc);  // not TapeRecorder::add
      } else {  // add_n takes tensors of one shape
        p.sum = detail::full_gradient(p.sum, x.shape(), e.loc);
        p.later.push_back(detail::full_gradient(gk, x.shape(), e.loc));
        const std::size_t held = p.later.size() + 1;
        if (held >= detail::max_pending_gradients ||
            static_cast<std::int64_t>(held * p.sum.nbytes()) >= detail::max_pending_gradient_bytes)
          total(p);
      }
    }
  }
  std::vector<Tensor> out;
  out.reserve(sources.size());
  for (const Tensor& s : sources) {
    auto it = grads.find(s.impl());
    out.push_back(it != grads.end() ? detail::full_gradient(total(it->second), s.shape(), loc)
                                    : detail::fill_on(s.device(), s.shape(), 0.0, s.dtype(), loc));
  }
  return out;
}

}  // namespace stagecraft
