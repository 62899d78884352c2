// Forward declarations of the public types, for headers that only name them.
#pragma once

namespace stagecraft {
class Tensor;
class Shape;
class Device;
class DeviceScope;
enum class DType : unsigned char;
struct Operand;
struct MemoryStats;
class Error;
class ShapeError;
class DTypeError;
class DeviceError;
class StagingError;
class IOError;
class ValueError;
namespace ops {
struct Attrs;
struct OutMeta;
}  // namespace ops
}  // namespace stagecraft

#ifndef STAGECRAFT_NO_SC_ALIAS
/// The short name every example uses (define STAGECRAFT_NO_SC_ALIAS to keep it out).
namespace sc = stagecraft;
#endif
