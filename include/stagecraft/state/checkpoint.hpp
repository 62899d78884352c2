// Checkpoint: saves and restores the variables of tracked objects (modules, optimizers) as safetensors.
#pragma once
#include <algorithm>
#include <concepts>
#include <cstddef>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <source_location>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "../core/error.hpp"
#include "safetensors.hpp"
#include "variable.hpp"

namespace stagecraft {

/// Objects a Checkpoint can track: they list their variables under stable path names
/// (sc::Module, the optimizers, or any struct of your own).
template <class T>
concept HasNamedVariables = requires(const T& t) {
  { t.named_variables() } -> std::convertible_to<std::vector<std::pair<std::string, Variable>>>;
};

/// Saves and restores the variables of tracked objects in one safetensors file, keyed
/// "<tracked name>/<variable path>" ("<tracked name>" for a tracked Variable).
///
/// Objects are tracked by reference and asked for their variables at save/restore time, so
/// state created after track() (optimizer slots) is included; they must outlive the
/// Checkpoint's use. restore() is all or nothing: it checks every key, shape and dtype first
/// and, on any mismatch, throws ONE IOError listing all of them (missing keys, unexpected
/// keys, shape and dtype mismatches; a tracked optimizer whose slots the file holds but which
/// was not built yet is named, with the fix) without changing any variable. A missing, truncated or
/// corrupt file is an IOError too and changes nothing. save() is atomic (see save_safetensors).
class Checkpoint {
 public:
  /// One saved variable: its key in the file and the variable.
  using Item = std::pair<std::string, Variable>;

  /// Tracks an object that has named_variables() under `name` (unique, non-empty, no '/').
  template <class T>
  void track(std::string name, T& obj, std::source_location loc = std::source_location::current()) {
    static_assert(HasNamedVariables<T>,
                  "sc::Checkpoint::track needs an sc::Variable or an object with "
                  "`std::vector<std::pair<std::string, sc::Variable>> named_variables() const` "
                  "(sc::Module, the optimizers)");
    if constexpr (HasNamedVariables<T>) {
      T* p = &obj;
      // an object that makes its variables at build(vars) (an optimizer's slots) gets a hint
      // when a restore finds its keys in the file but not in it: it was not built yet
      constexpr bool builds = requires(T& t, const std::vector<Variable>& vars) { t.build(vars); };
      add(std::move(name), [p] { return std::vector<Item>(p->named_variables()); }, false, loc, builds);
    }
  }
  /// Temporaries would dangle: track objects that outlive the Checkpoint.
  template <class T>
  void track(std::string name, const T&& obj, std::source_location loc = std::source_location::current()) = delete;
  /// Tracks a single variable; its key is `name`.
  void track(std::string name, Variable& v, std::source_location loc = std::source_location::current()) {
    Variable* p = &v;
    add(std::move(name), [p] { return std::vector<Item>{{std::string(), *p}}; }, true, loc, false);
  }

  /// The names passed to track(), in order.
  std::vector<std::string> tracked() const {
    std::vector<std::string> out;
    for (const auto& t : tracked_) out.push_back(t.name);
    return out;
  }

  /// Every tracked variable under its key, as save() would write them (ValueError when two
  /// variables get the same key, a path is empty or a variable is undefined).
  std::vector<Item> variables(std::source_location loc = std::source_location::current()) const {
    return collect("Checkpoint::variables", loc);
  }

  /// Writes every tracked variable's value to `path` (atomically: the old file survives a failure).
  void save(const std::filesystem::path& path, std::source_location loc = std::source_location::current()) const {
    std::vector<std::pair<std::string, Tensor>> values;
    for (auto& [key, v] : collect("Checkpoint::save", loc)) values.emplace_back(key, v.value());
    detail::safetensors::save(path, values, {{"format", "stagecraft.checkpoint"}}, "Checkpoint::save", loc);
  }

  /// Reads `path` and assigns every tracked variable, or throws (IOError) and assigns none.
  void restore(const std::filesystem::path& path, std::source_location loc = std::source_location::current()) {
    constexpr std::string_view op = "Checkpoint::restore";
    SafetensorsFile file = detail::safetensors::load(path, op, loc);
    const std::vector<Item> items = collect(op, loc);

    std::vector<std::string> missing, unexpected, mismatched;
    std::set<std::string_view> expected;
    std::vector<Tensor> values;
    for (const auto& [key, v] : items) {
      expected.insert(key);
      auto it = file.tensors.find(key);
      if (it == file.tensors.end()) { missing.push_back(key); continue; }
      const Tensor& t = it->second;
      if (t.shape() != v.shape() || t.dtype() != v.dtype())
        mismatched.push_back(key + " is " + std::string(name(t.dtype())) + " " + t.shape().str() +
                             " in the file, " + std::string(name(v.dtype())) + " " + v.shape().str() +
                             " in the variable");
      else values.push_back(detail::device_copy(t, v.device(), op, loc));
    }
    for (const auto& [key, t] : file.tensors)
      if (!expected.count(key)) unexpected.push_back(key);

    if (!missing.empty() || !unexpected.empty() || !mismatched.empty()) {
      std::string msg;
      append_list(msg, "missing keys", missing);
      append_list(msg, "unexpected keys", unexpected);
      append_list(msg, "shape/dtype mismatches", mismatched);
      for (const auto& t : tracked_) {
        const std::string prefix = t.name + "/";
        const bool unbuilt = t.builds && std::any_of(unexpected.begin(), unexpected.end(),
                                                     [&](const std::string& k) { return k.starts_with(prefix); });
        if (unbuilt)
          msg += " '" + t.name + "' has not made the state of these variables yet (an optimizer makes its slots at "
                 "build(vars) or its first apply()): call build(vars) on it, with the variables it trains, "
                 "before restore;";
      }
      detail::fail<IOError>(op, loc, "'", path.string(), "' does not match the tracked variables; nothing was restored.",
                            msg);
    }
    for (std::size_t i = 0; i < items.size(); ++i) {
      Variable v = items[i].second;
      v.assign(values[i], loc);
    }
  }

 private:
  using Collect = std::function<std::vector<Item>()>;
  struct Tracked {
    std::string name;
    Collect collect;
    bool single;  // a tracked Variable: its key is the name alone
    bool builds;  // it makes variables at build(vars) (an optimizer)
  };

  void add(std::string name, Collect c, bool single, const std::source_location& loc, bool builds) {
    if (name.empty()) detail::fail<ValueError>("Checkpoint::track", loc, "the name is empty");
    if (name.find('/') != std::string::npos)
      detail::fail<ValueError>("Checkpoint::track", loc, "the name '", name,
                               "' contains '/', which separates a tracked name from variable paths");
    for (const auto& t : tracked_)
      if (t.name == name) detail::fail<ValueError>("Checkpoint::track", loc, "the name '", name, "' is already tracked");
    tracked_.push_back({std::move(name), std::move(c), single, builds});
  }

  std::vector<Item> collect(std::string_view op, const std::source_location& loc) const {
    std::vector<Item> out;
    std::set<std::string> keys;
    for (const auto& t : tracked_) {
      for (auto& [path, v] : t.collect()) {
        if (!t.single && path.empty())
          detail::fail<ValueError>(op, loc, "'", t.name, "' lists a variable with an empty path");
        std::string key = t.single ? t.name : t.name + "/" + path;
        if (!v.defined()) detail::fail<ValueError>(op, loc, "variable '", key, "' is undefined (default-constructed)");
        if (!keys.insert(key).second) detail::fail<ValueError>(op, loc, "two variables have the key '", key, "'");
        out.emplace_back(std::move(key), std::move(v));
      }
    }
    return out;
  }

  /// "; <title> (n): a, b, c" with at most 20 items, so a wholly wrong file keeps a readable message.
  static void append_list(std::string& msg, std::string_view title, const std::vector<std::string>& xs) {
    if (xs.empty()) return;
    constexpr std::size_t shown = 20;
    msg += " ";
    msg += title;
    msg += " (" + std::to_string(xs.size()) + "): ";
    for (std::size_t i = 0; i < xs.size() && i < shown; ++i) msg += (i ? ", " : "") + xs[i];
    if (xs.size() > shown) msg += ", ... and " + std::to_string(xs.size() - shown) + " more";
    msg += ";";
  }

  std::vector<Tracked> tracked_;
};

}  // namespace stagecraft
