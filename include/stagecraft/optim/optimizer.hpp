// optim::Optimizer: the base of SGD and Adam — slot bookkeeping, checks, the step counter and
// the learning rate (both variables, so a traced step reads them at every call).
#pragma once
#include <algorithm>
#include <array>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <memory>
#include <source_location>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "../autodiff/tape.hpp"
#include "../core/creation.hpp"
#include "../eager/context.hpp"
#include "../ops/cast.hpp"
#include "../state/variable.hpp"
#include "fused.hpp"
#include "schedules.hpp"

namespace stagecraft::optim {

/// Updates variables from their gradients: `opt.apply(tape.gradient(loss, vars), vars)`.
///
/// State lives in Variables, so sc::Checkpoint saves it (track the optimizer like a model):
/// `iterations` (i64 scalar, steps taken) and, per variable, one slot per kind the optimizer
/// keeps (SGD with momentum: "velocity"; Adam: "m", "v"), each shaped like its variable and
/// named "<slot>/<index>:<variable name>" — index = position of the variable in the order
/// the optimizer first saw it (build() or the first apply()). Building with the same model's
/// trainable_variables() therefore gives the same names, which is what restore matches:
/// call build(vars) (or take one step) before restoring a checkpoint into an optimizer.
///
/// A step is tensor ops only: the counter advances by an op and the learning rate is read
/// from a variable ("learning_rate", f64 scalar, not trainable) as a tensor, so the same
/// apply() traced once by sc::function stays right at every later call (nothing the step
/// needs is a C++ number computed at trace time). set_learning_rate() between calls, or an
/// assignment to learning_rate_variable() inside the traced step, takes effect without a retrace.
/// The counter and the rate are made on the CPU and move, with their values, to the device of
/// the first variable of the first build (new Variables: take handles to them after it).
///
/// Optimizers can be moved, not copied (a copy would share its slots with the original).
class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;
  Optimizer(Optimizer&&) = default;
  Optimizer& operator=(Optimizer&&) = default;

  /// "SGD", "Adam": the name errors start with.
  virtual std::string_view name() const = 0;

  /// One step: updates vars[i] from grads[i] (same count, same shapes; an undefined
  /// gradient skips its variable). Creates the slots of variables it has not seen yet.
  /// Runs without recording on any tape.
  void apply(const std::vector<Tensor>& grads, const std::vector<Variable>& vars,
             std::source_location loc = std::source_location::current()) {
    if (SC_UNLIKELY(grads.size() != vars.size()))
      stagecraft::detail::fail<ValueError>(op_name("apply"), loc, "got ", grads.size(), " gradients for ", vars.size(),
                                           " variables; pass one gradient per variable, in order");
    // A step with nothing to update is a mistake (a model whose layers were never registered,
    // a loss the tape did not see): it would only advance the step counter.
    if (SC_UNLIKELY(std::none_of(grads.begin(), grads.end(), [](const Tensor& g) { return g.defined(); })))
      stagecraft::detail::fail<ValueError>(op_name("apply"), loc, vars.empty() ? "got no variables" : "got no gradients",
                                           " to apply (", vars.size(), " variables, none with a gradient); check "
                                           "that the model's variables are passed and the loss was computed from "
                                           "them under the tape");
    // Every check comes before any change, so a failed step leaves no trace.
    const bool known = same_as_built(vars);
    const bool tracing = stagecraft::detail::context().trace != nullptr;
    for (std::size_t i = 0; i < vars.size(); ++i) {
      if (!grads[i].defined() || !vars[i].defined()) continue;  // build() names an empty variable
      // Else its first op would fail after the counter and the variables before it had changed.
      if (SC_UNLIKELY(!tracing && grads[i].is_symbolic()))
        stagecraft::detail::fail<StagingError>(op_name("apply"), loc, "gradient ", i, " (for variable '",
                                               vars[i].name(), "') is symbolic outside the trace that made it (it "
                                               "escaped an sc::function); return it from the function instead");
      if (SC_UNLIKELY(grads[i].shape() != vars[i].shape()))
        stagecraft::detail::fail<ShapeError>(op_name("apply"), loc, "gradient ", i, " has shape ",
                                             grads[i].shape(), " but variable ", i, " ('", vars[i].name(),
                                             "') has shape ", vars[i].shape());
      if (SC_UNLIKELY(grads[i].device() != vars[i].device()))
        stagecraft::detail::fail<DeviceError>(op_name("apply"), loc, "gradient ", i, " is on ", grads[i].device().str(),
                                              " but variable ", i, " ('", vars[i].name(), "') is on ",
                                              vars[i].device().str(), "; move the gradient there with .to()");
    }
    if (!known) {  // the list of a step taken before has no repeats (build() keeps each once)
      std::unordered_map<const void*, std::size_t> first;
      for (std::size_t i = 0; i < vars.size(); ++i) {
        if (!vars[i].defined()) continue;
        const auto [at, fresh] = first.emplace(key(vars[i]), i);
        if (SC_UNLIKELY(!fresh))
          stagecraft::detail::fail<ValueError>(op_name("apply"), loc, "variable '", vars[i].name(), "' is passed twice (at ",
                                               at->second, " and ", i, "); pass each variable once, with the sum of "
                                               "its gradients");
      }
      build(vars, loc);
    }
    GradientTape::StopRecording quiet;  // optimizer steps are never part of a gradient
    // From here on: ops only, never a value read on the host (see the class comment).
    iterations_.assign_add(one_, loc);  // now t, 1 for the first step
    if (schedule_) lr_.assign((*schedule_)(sub(iterations_.value(), one_, loc), loc), loc);  // at step t - 1
    const Tensor lr = step_size(loc);   // once per step, in the learning rate's dtype
    std::array<Tensor, num_dtypes> lr_as{};  // lr converted to each variable dtype, once
    fused::GpuUpdates gpu_updates;            // the fused GPU updates launch together, below
    for (std::size_t i = 0; i < vars.size(); ++i) {
      if (!grads[i].defined()) continue;
      const std::size_t k = known ? i : index_.at(key(vars[i]));
      const Tensor& g0 = grads[i];
      // Tapes give gradients in the variable's dtype; anything else is converted once here.
      const Tensor g = g0.dtype() == vars[i].dtype() ? g0 : cast(g0, vars[i].dtype(), loc);
      Tensor& lr_d = lr_as[static_cast<std::size_t>(vars[i].dtype())];
      if (!lr_d.defined() || lr_d.device() != vars[i].device())
        lr_d = cast(lr, vars[i].dtype(), loc).to(vars[i].device(), loc);
      Variable var = vars[i];
      update(g, var, slots_.data() + k * slot_names_.size(), lr_d, loc);
    }
    gpu_updates.flush(loc);
  }

  /// Creates the slots of every variable in vars not seen before (in order), so they exist
  /// (e.g. to restore a checkpoint into) before the first step. apply() calls it as needed.
  void build(const std::vector<Variable>& vars, std::source_location loc = std::source_location::current()) {
    for (const Variable& v : vars) {  // all checks first: a failed build adds nothing
      if (SC_UNLIKELY(!v.defined()))
        stagecraft::detail::fail<ValueError>(op_name("build"), loc, "a variable is empty (default-constructed)");
      if (SC_UNLIKELY(!is_floating(v.dtype())))
        stagecraft::detail::fail<DTypeError>(op_name("build"), loc, "variable '", v.name(), "' has dtype ",
                                             stagecraft::name(v.dtype()),
                                             "; only floating-point variables can be trained");
    }
    // Slots are variables: a traced function may create them on its first trace only.
    if (const auto* tr = stagecraft::detail::context().trace; SC_UNLIKELY(tr != nullptr && !tr->may_create_variables()))
      for (const Variable& v : vars)
        if (!index_.count(key(v)) && !slot_names_.empty())
          stagecraft::detail::fail<StagingError>(op_name("build"), loc, "variable '", v.name(), "' gets its first ",
                                                 name(), " step on a later trace of a traced function, and its slots "
                                                 "would be new variables; call build(vars) before the function's "
                                                 "first call (or take its first step on the first trace)");
    // The step counter and the rate live where the variables do, from the first build on: a
    // traced step on GPU variables then moves no value between devices (a trace cannot).
    if (vars_.empty() && !vars.empty() && vars.front().device() != iterations_.device()) {
      const Device d = vars.front().device();
      struct Eager {  // their current values, read outside a trace (as sc::init_scope does)
        stagecraft::detail::TraceState* saved = stagecraft::detail::context().trace;
        Eager() { stagecraft::detail::context().trace = nullptr; }
        ~Eager() { stagecraft::detail::context().trace = saved; }
      } eager;
      iterations_ = Variable(iterations_.value().to(d, loc), "iterations", /*trainable=*/false, loc);
      one_ = one_.to(d, loc);
      lr_ = Variable(lr_.value().to(d, loc), "learning_rate", /*trainable=*/false, loc);
    }
    for (const Variable& v : vars) {
      if (index_.count(key(v))) continue;
      const std::size_t idx = vars_.size();
      index_.emplace(key(v), idx);
      vars_.push_back(v);
      const DeviceScope on(v.device());  // each slot lives with its variable
      for (const std::string& s : slot_names_) {
        std::string n = s + "/" + std::to_string(idx);
        if (!v.name().empty()) n += ":" + v.name();
        slots_.emplace_back(zeros(v.shape(), v.dtype(), loc), std::move(n), /*trainable=*/false, loc);
      }
    }
  }

  /// The optimizer's state: "iterations" first, then every slot in build order (variable
  /// by variable, slots in the optimizer's fixed order). Names are unique and deterministic.
  ///
  /// "learning_rate" is left out on purpose, although TensorFlow saves it: Checkpoint::restore
  /// is all-or-nothing and a missing key is an error, so listing it would make every checkpoint
  /// written before it existed unrestorable; and the rate is configuration the training script
  /// sets (constructor, schedule) on every run, which a restore would silently override.
  std::vector<std::pair<std::string, Variable>> named_variables() const {
    std::vector<std::pair<std::string, Variable>> out;
    out.reserve(slots_.size() + 1);
    out.emplace_back("iterations", iterations_);
    for (const Variable& s : slots_) out.emplace_back(s.name(), s);
    return out;
  }
  /// The state variables, in named_variables() order.
  std::vector<Variable> variables() const {
    std::vector<Variable> out;
    for (auto& [n, v] : named_variables()) out.push_back(v);
    return out;
  }
  /// The slot `slot` ("velocity", "m", "v") of a variable the optimizer has seen: a handle of its
  /// own (a reference into the slot list would dangle once build() or apply() adds variables).
  Variable slot(const Variable& var, std::string_view slot,
                std::source_location loc = std::source_location::current()) const {
    const auto it = var.defined() ? index_.find(key(var)) : index_.end();
    if (it == index_.end())
      stagecraft::detail::fail<ValueError>(op_name("slot"), loc, "variable '", var.defined() ? var.name() : "",
                                           "' has no slots yet; call build(vars) or apply() first");
    for (std::size_t s = 0; s < slot_names_.size(); ++s)
      if (slot_names_[s] == slot) return slots_[it->second * slot_names_.size() + s];
    stagecraft::detail::fail<ValueError>(op_name("slot"), loc, name(), " keeps no slot named '", slot, "'");
  }

  /// Steps taken so far (the `iterations` variable, which a checkpoint restores). Reads the
  /// value on the host: for users between steps; apply() itself never calls it.
  std::int64_t iterations() const { return iterations_.value().item<std::int64_t>(); }
  /// The step counter as a variable (i64 scalar).
  const Variable& iterations_variable() const { return iterations_; }
  /// The current learning rate (read from learning_rate_variable() on the host).
  double learning_rate() const { return lr_.value().item<double>(); }
  /// The learning rate as a variable (f64 scalar, not trainable): a schedule inside a traced
  /// step assigns it a tensor.
  const Variable& learning_rate_variable() const { return lr_; }
  /// Changes the learning rate for the following steps (and ends a schedule set before).
  void set_learning_rate(double lr, std::source_location loc = std::source_location::current()) {
    check_lr(lr, loc);
    lr_.assign(scalar<double>(lr).to(lr_.device(), loc), loc);
    schedule_.reset();
  }
  /// Follows `schedule` from the next step on: each step first sets the learning rate to
  /// schedule(step), the step counted from 0 (iterations() before it), with ops on the step
  /// counter, so a traced step follows the schedule without a retrace and a restored counter
  /// resumes it. set_learning_rate() ends it. (schedules.hpp: ExponentialDecay, CosineDecay,
  /// PiecewiseConstantDecay, or a LearningRateSchedule of your own.)
  template <std::derived_from<LearningRateSchedule> S>
  void set_schedule(S schedule) {
    schedule_ = std::make_shared<const S>(std::move(schedule));
  }
  void set_schedule(std::shared_ptr<const LearningRateSchedule> schedule) { schedule_ = std::move(schedule); }
  /// The schedule the steps follow, or null.
  const LearningRateSchedule* schedule() const { return schedule_.get(); }

 protected:
  /// lr: the learning rate; slot_names: the per-variable state this optimizer keeps.
  Optimizer(double lr, std::vector<std::string> slot_names, const std::source_location& loc)
      : slot_names_(std::move(slot_names)),
        iterations_(scalar<std::int64_t>(0), "iterations", /*trainable=*/false, loc),
        one_(scalar<std::int64_t>(1)),
        lr_(scalar<double>(check_lr(lr, loc)), "learning_rate", /*trainable=*/false, loc) {}

  /// The rate this step scales updates by, a scalar tensor computed from the optimizer's
  /// variables with ops only (apply() calls it once per step, after `iterations` advanced to
  /// t, 1 for the first step). Default: the learning rate.
  virtual Tensor step_size(const std::source_location& /*loc*/) { return lr_.value(); }

  /// Updates one variable from g (its dtype and shape); lr is step_size() converted to the
  /// variable's dtype and device; slots points at this variable's slots, in slot_names order.
  /// Runs under StopRecording, with ops only (no host reads: see the class comment).
  virtual void update(const Tensor& g, Variable& var, Variable* slots, const Tensor& lr,
                      const std::source_location& loc) = 0;

  /// Throws ValueError unless lo <= x < hi (or <= hi when closed), naming the hyperparameter.
  void check_range(double x, double lo, double hi, bool closed, std::string_view what,
                   const std::source_location& loc) const {
    if (!(x >= lo && (closed ? x <= hi : x < hi)))
      stagecraft::detail::fail<ValueError>(name(), loc, what, " must be in [", lo, ", ", hi, closed ? "]" : ")",
                                           ", got ", x);
  }

 private:
  /// "Adam::apply": built only when an error is thrown, so steps allocate no strings.
  std::string op_name(std::string_view method) const { return std::string(name()) + "::" + std::string(method); }
  static const void* key(const Variable& v) { return static_cast<const Tensor&>(v).impl()->variable; }
  /// lr, or throws ValueError unless it is finite and >= 0.
  static double check_lr(double lr, const std::source_location& loc) {
    if (!(lr >= 0 && std::isfinite(lr)))
      stagecraft::detail::fail<ValueError>("optimizer", loc, "learning rate must be finite and >= 0, got ", lr);
    return lr;
  }
  /// True when vars is exactly the built list, in order (the common case: no lookups).
  bool same_as_built(const std::vector<Variable>& vars) const {
    if (vars.size() != vars_.size()) return false;
    for (std::size_t i = 0; i < vars.size(); ++i)
      if (!vars[i].defined() || !vars[i].same(vars_[i])) return false;
    return true;
  }

  std::vector<std::string> slot_names_;
  std::vector<Variable> vars_;   // every variable seen, in build order
  std::vector<Variable> slots_;  // slots_[index * slot_names_.size() + s]
  std::unordered_map<const void*, std::size_t> index_;
  Variable iterations_;
  Tensor one_;   // the counter's increment (i64 scalar 1), made once
  Variable lr_;  // "learning_rate": f64 scalar
  std::shared_ptr<const LearningRateSchedule> schedule_;  // sets lr_ at each step when set
};

}  // namespace stagecraft::optim
