// Module: a tree of named sub-modules and variables, walked in registration order.
#pragma once
#include <concepts>
#include <deque>
#include <initializer_list>
#include <memory>
#include <source_location>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "../ops/binary.hpp"
#include "variable.hpp"

namespace stagecraft {

/// Base of every model and layer: it knows its members by name and lists their variables in
/// a deterministic order (registration order, depth first) with paths like "encoder/l2/bias".
///
///   struct MLP : sc::Module {
///     sc::nn::Dense l1{784, 256}, l2{256, 10};
///     MLP() { add({{"l1", l1}, {"l2", l2}}); }   // or add("l1", l1); add("l2", l2);
///   };
///
/// A Module holds pointers to its members, so it can be neither copied nor moved (a copy
/// would point at the original's members): that is a compile error, never a dangling
/// pointer. Build models in place (`MLP m;`, `auto m = MLP();` — guaranteed elision), keep
/// several in a std::deque/std::list or behind std::unique_ptr, or let a module own
/// dynamically made children with emplace<Layer>(name, args...).
class Module {
 public:
  /// One entry of `add({{"l1", l1}, {"scale", scale}})`: a name and a sub-module or a
  /// variable, held by reference (read when the module is walked, so later reassignments of
  /// the member are seen).
  struct Member {
    /// A sub-module (any layer or user Module).
    Member(std::string n, Module& m) : name(std::move(n)), module(&m) {}
    /// A variable member.
    Member(std::string n, Variable& v) : name(std::move(n)), variable(&v) {}
    std::string name;
    Module* module = nullptr;
    Variable* variable = nullptr;
  };

  Module() = default;
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;
  Module(Module&&) = delete;
  Module& operator=(Module&&) = delete;

  /// Registers a sub-module (held by reference: it must outlive this module).
  void add(std::string name, Module& m, std::source_location loc = std::source_location::current()) {
    check_name(name, loc);
    if (&m == this) detail::fail<ValueError>("Module::add", loc, "a module cannot contain itself ('", name, "')");
    entries_.push_back({std::move(name), &m, nullptr, loc});
  }
  /// Registers a variable member (held by reference: the member's current handle is read
  /// whenever the module is walked).
  void add(std::string name, Variable& v, std::source_location loc = std::source_location::current()) {
    check_name(name, loc);
    entries_.push_back({std::move(name), nullptr, &v, loc});
  }
  /// Registers and keeps a variable that has no member of its own; returns the kept handle.
  Variable& add(std::string name, Variable&& v, std::source_location loc = std::source_location::current()) {
    check_name(name, loc);
    Variable& kept = owned_vars_.emplace_back(std::move(v));
    entries_.push_back({std::move(name), nullptr, &kept, loc});
    return kept;
  }
  /// Registers several members in order: add({{"l1", l1}, {"l2", l2}, {"scale", scale}}).
  void add(std::initializer_list<Member> members, std::source_location loc = std::source_location::current()) {
    for (const Member& m : members) {
      if (m.module != nullptr) add(m.name, *m.module, loc);
      else add(m.name, *m.variable, loc);
    }
  }
  /// The tensor op sc::add, visible again inside modules: the registration add() above
  /// would otherwise hide it in every derived class's methods.
  static Tensor add(const Tensor& a, const Tensor& b, std::source_location loc = std::source_location::current()) {
    return stagecraft::add(a, b, loc);
  }
  /// sc::add with a C++ scalar on the right (see the tensor add above).
  template <Scalar V>
  static Tensor add(const Tensor& a, V b, std::source_location loc = std::source_location::current()) {
    return stagecraft::add(a, b, loc);
  }
  /// sc::add with a C++ scalar on the left (see the tensor add above).
  template <Scalar V>
  static Tensor add(V a, const Tensor& b, std::source_location loc = std::source_location::current()) {
    return stagecraft::add(a, b, loc);
  }

  /// emplace()'s name and the caller's line (a variadic call has no place for a trailing
  /// source_location argument; converting the name records where the call is).
  struct NameAt {
    template <class S>
      requires std::constructible_from<std::string, S>
    NameAt(S&& n, std::source_location l = std::source_location::current())  // NOLINT: implicit by design
        : name(std::forward<S>(n)), loc(l) {}
    std::string name;
    std::source_location loc;
  };

  /// Makes a sub-module owned by this one (for layers made at run time, e.g. in a loop)
  /// and registers it; returns it. `auto& l = emplace<sc::nn::Dense>("l3", 64, 10);`
  template <class M, class... Args>
  M& emplace(NameAt name, Args&&... args) {
    check_name(name.name, name.loc);
    // A layer's defaulted source_location names the line of `new M` (kept on `here`'s line): its
    // errors get the caller's line instead.
    std::unique_ptr<M> owned;
    const auto here = std::source_location::current(); try { owned.reset(new M(std::forward<Args>(args)...)); }
    catch (const Error& e) { stagecraft::detail::relocate(e, stagecraft::detail::where(here), name.loc); }
    M& ref = *owned;
    owned_modules_.push_back(std::move(owned));
    entries_.push_back({std::move(name.name), &ref, nullptr, name.loc});
    return ref;
  }

  /// Every variable (trainable or not) with its full path, depth first in registration
  /// order. A variable reachable twice (a shared layer) is listed once, under its first path.
  /// This is what sc::Checkpoint saves and restores.
  std::vector<std::pair<std::string, Variable>> named_variables() const {
    std::vector<std::pair<std::string, Variable>> out;
    std::unordered_set<const void*> seen;
    std::vector<const Module*> path{this};
    walk("", out, seen, path);
    return out;
  }
  /// Every variable, in named_variables() order.
  std::vector<Variable> variables() const {
    std::vector<Variable> out;
    for (auto& [n, v] : named_variables()) out.push_back(std::move(v));
    return out;
  }
  /// The trainable variables, in named_variables() order (what optimizers update).
  std::vector<Variable> trainable_variables() const {
    std::vector<Variable> out;
    for (auto& [n, v] : named_variables())
      if (v.trainable()) out.push_back(std::move(v));
    return out;
  }
  /// Total number of elements over variables() (trainable only when asked).
  std::int64_t num_parameters(bool trainable_only = false) const {
    std::int64_t n = 0;
    for (const Variable& v : variables())
      if (!trainable_only || v.trainable()) n += v.numel();
    return n;
  }

 private:
  struct Entry {
    std::string name;
    Module* module;
    Variable* variable;
    std::source_location loc;  // the add() call, named by errors found while walking
  };

  /// Names are path components: non-empty, no '/', unique within this module.
  void check_name(const std::string& name, const std::source_location& loc) const {
    if (name.empty()) detail::fail<ValueError>("Module::add", loc, "member names must not be empty");
    if (name.find('/') != std::string::npos)
      detail::fail<ValueError>("Module::add", loc, "member name '", name, "' contains '/', the path separator");
    for (const Entry& e : entries_)
      if (e.name == name)
        detail::fail<ValueError>("Module::add", loc, "a member named '", name, "' is already registered (at ",
                                 detail::where(e.loc), "); each name may be used once per module");
  }

  void walk(const std::string& prefix, std::vector<std::pair<std::string, Variable>>& out,
            std::unordered_set<const void*>& seen, std::vector<const Module*>& path) const {
    for (const Entry& e : entries_) {
      std::string full = prefix + e.name;
      if (e.variable != nullptr) {
        if (!e.variable->defined())
          detail::fail<ValueError>("Module", e.loc, "variable '", full, "' is empty (default-constructed); "
                                   "give it a value before listing the module's variables");
        if (seen.insert(static_cast<const Tensor&>(*e.variable).impl()->variable).second)
          out.emplace_back(std::move(full), *e.variable);
        continue;
      }
      for (const Module* p : path)
        if (p == e.module)
          detail::fail<ValueError>("Module", e.loc, "module '", full, "' contains itself (a cycle of add() calls)");
      path.push_back(e.module);
      e.module->walk(full + "/", out, seen, path);
      path.pop_back();
    }
  }

  std::vector<Entry> entries_;
  std::deque<Variable> owned_vars_;  // a deque: references stay valid as it grows
  std::vector<std::unique_ptr<Module>> owned_modules_;
};

}  // namespace stagecraft
