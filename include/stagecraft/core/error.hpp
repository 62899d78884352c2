// The error hierarchy and the one way errors are formatted: "[op] what is wrong at file:line".
#pragma once
#include <concepts>
#include <cstddef>
#include <source_location>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

#include "../config.hpp"

namespace stagecraft {

/// Base of every error stagecraft throws.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
/// Shapes that do not fit the op (broadcasting, ranks, axes, sizes).
class ShapeError : public Error { using Error::Error; };
/// A dtype the op does not accept, or mixed dtypes that cannot meet.
class DTypeError : public Error { using Error::Error; };
/// Tensors on different devices, or a device that is not available.
class DeviceError : public Error { using Error::Error; };
/// Misuse of staging: symbolic tensors where a value is needed, escaped tensors, retracing.
class StagingError : public Error { using Error::Error; };
/// A file that cannot be read or written, or whose contents are corrupt.
class IOError : public Error { using Error::Error; };
/// A value outside the op's domain (negative sizes, labels out of range, bad arguments).
class ValueError : public Error { using Error::Error; };

namespace detail {

/// "file.cpp:12" of a call site, with the directories stripped.
inline std::string where(const std::source_location& loc) {
  std::string_view f = loc.file_name();
  if (auto p = f.find_last_of("/\\"); p != std::string_view::npos) f.remove_prefix(p + 1);
  return std::string(f) + ":" + std::to_string(loc.line());
}

/// Appends one part of an error message as `std::ostream << part` writes it. Strings, characters
/// and integers are appended directly; anything else (a Shape, a DType, a double) through a stream
/// of its own, one instantiation per type. fail() calls these instead of streaming every part into
/// one ostringstream: an error site then compiles to a few calls, not a stream's inlined code per
/// combination of parts (a file tracing one op has over a hundred such sites).
SC_NOINLINE inline void append_part(std::string& m, std::string_view s) { m.append(s); }
SC_NOINLINE inline void append_part(std::string& m, const std::string& s) { m.append(s); }
SC_NOINLINE inline void append_part(std::string& m, const char* s) {
  if (s) m.append(s);  // (a stream writes nothing for a null pointer)
}
SC_NOINLINE inline void append_part(std::string& m, char c) { m.push_back(c); }
template <std::integral I>
  requires(!std::same_as<I, bool> && !std::same_as<I, char> && !std::same_as<I, signed char> &&
           !std::same_as<I, unsigned char> && !std::same_as<I, char8_t> && !std::same_as<I, char16_t> &&
           !std::same_as<I, char32_t> && !std::same_as<I, wchar_t>)
SC_NOINLINE void append_part(std::string& m, const I& v) {
  m.append(std::to_string(v));
}
template <class X>
SC_NOINLINE void append_part(std::string& m, const X& x) {
  std::ostringstream os;
  os << x;
  m.append(os.str());
}

/// The parts written one after another, as one stream writes them.
template <class... Parts>
std::string concat_parts(const Parts&... parts) {
  std::string m;
  (append_part(m, parts), ...);
  return m;
}

/// One part of an error message with its type erased: a pointer and the function that appends
/// what it points to. Error sites pass their parts so, and the formatting below is instantiated
/// once per error kind, not once per combination of parts (string literals of every length, a
/// Shape, a DType, ...: a file tracing one op had over a hundred combinations, ~35 KB of code).
struct MessagePart {
  const void* p;
  void (*append)(std::string&, const void*);
};
template <class X>
SC_NOINLINE void append_erased(std::string& m, const void* p) {
  append_part(m, *static_cast<const X*>(p));
}
SC_NOINLINE inline void append_c_string(std::string& m, const void* p) { append_part(m, static_cast<const char*>(p)); }
SC_ALWAYS_INLINE MessagePart message_part(const char* s) { return {s, &append_c_string}; }  // (literals decay here)
template <class X>
SC_ALWAYS_INLINE MessagePart message_part(const X& x) {
  return {&x, &append_erased<X>};
}

/// "[op] parts at file:line".
SC_COLD inline std::string format_error(std::string_view op, std::string_view file, unsigned line,
                                        const MessagePart* parts, std::size_t n) {
  if (auto p = file.find_last_of("/\\"); p != std::string_view::npos) file.remove_prefix(p + 1);
  std::string m = "[";
  m.append(op);
  m.append("] ");
  for (std::size_t i = 0; i < n; ++i) parts[i].append(m, parts[i].p);
  m.append(" at ");
  m.append(file);
  m.append(":");
  m.append(std::to_string(line));
  return m;
}
template <class E>
[[noreturn]] SC_COLD void throw_error(std::string_view op, std::string_view file, unsigned line,
                                      const MessagePart* parts, std::size_t n) {
  throw E(format_error(op, file, line, parts, n));
}

/// A part as error sites pass it on: string literals (of any length) as `const char*`, anything
/// else by reference. Literals of every length then share one instantiation.
template <class X>
using passed_part = std::conditional_t<std::is_array_v<X>, const std::remove_extent_t<X>*, const X&>;
template <class E, class... Parts>
[[noreturn]] SC_COLD void fail_parts(std::string_view op, const std::source_location& loc, Parts... parts) {
  const MessagePart erased[sizeof...(Parts) + 1] = {message_part(parts)..., MessagePart{nullptr, nullptr}};
  throw_error<E>(op, loc.file_name(), static_cast<unsigned>(loc.line()), erased, sizeof...(Parts));
}
template <class E, class... Parts>
[[noreturn]] SC_COLD void fail_parts_at(std::string_view op, std::string_view file, unsigned line, Parts... parts) {
  const MessagePart erased[sizeof...(Parts) + 1] = {message_part(parts)..., MessagePart{nullptr, nullptr}};
  throw_error<E>(op, file, line, erased, sizeof...(Parts));
}

/// Throws E with "[op] message at file:line"; cold so the happy path stays small.
template <class E, class... Parts>
[[noreturn]] SC_ALWAYS_INLINE void fail(std::string_view op, const std::source_location& loc, const Parts&... parts) {
  fail_parts<E, passed_part<Parts>...>(op, loc, parts...);
}

/// As fail(), for a location kept as a file name and line (graph nodes, loaded graphs).
template <class E, class... Parts>
[[noreturn]] SC_ALWAYS_INLINE void fail_at(std::string_view op, std::string_view file, unsigned line, const Parts&... parts) {
  fail_parts_at<E, passed_part<Parts>...>(op, file, line, parts...);
}

/// Throws an error of e's kind (ShapeError, ..., or Error) with message m.
[[noreturn]] SC_COLD inline void rethrow_as(const Error& e, const std::string& m) {
  if (dynamic_cast<const ShapeError*>(&e)) throw ShapeError(m);
  if (dynamic_cast<const DTypeError*>(&e)) throw DTypeError(m);
  if (dynamic_cast<const DeviceError*>(&e)) throw DeviceError(m);
  if (dynamic_cast<const StagingError*>(&e)) throw StagingError(m);
  if (dynamic_cast<const IOError*>(&e)) throw IOError(m);
  if (dynamic_cast<const ValueError*>(&e)) throw ValueError(m);
  throw Error(m);
}

/// True when message m ends in " at file:line": it names a line already.
inline bool names_line(std::string_view m) {
  const std::size_t p = m.rfind(" at "), colon = m.rfind(':');
  return p != std::string_view::npos && colon != std::string_view::npos && colon > p && colon + 1 < m.size() &&
         m.find_first_not_of("0123456789", colon + 1) == std::string_view::npos;
}

/// Rethrows e: unchanged when its message names a line, else of its own kind with " at
/// file:line" of loc added. A kernel knows no call site; its error then names the user's line
/// as infer's errors do.
[[noreturn]] SC_COLD inline void rethrow_at_line(const Error& e, const std::source_location& loc) {
  if (names_line(e.what())) throw;
  rethrow_as(e, std::string(e.what()) + " at " + where(loc));
}

/// Rethrows e, of its own kind, with its closing " at <from>" replaced by " at <to>" (a caller's
/// line put in for a location that names a library line); unchanged when it ends otherwise.
[[noreturn]] SC_COLD inline void relocate(const Error& e, const std::string& from, const std::source_location& to) {
  std::string msg = e.what();
  const std::string tail = " at " + from;
  if (msg.size() < tail.size() || msg.compare(msg.size() - tail.size(), tail.size(), tail) != 0) throw;
  msg.replace(msg.size() - from.size(), from.size(), where(to));
  rethrow_as(e, msg);
}

}  // namespace detail
}  // namespace stagecraft
