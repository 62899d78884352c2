// What the recurrent cells (nn::LSTMCell, nn::GRUCell) share to run an eager step as a staged
// function of their own: when a call may, and the function, shared by copies of a cell.
#pragma once
#include <initializer_list>
#include <memory>

#include "../graph/function.hpp"

namespace stagecraft::nn::detail_cell {

/// Whether an eager call of a cell whose weights live on `d` in `dtype` runs its staged step:
/// staging on, no trace running, every argument concrete on `d` in `dtype` (no implicit copy or
/// promotion to stage), no DeviceScope elsewhere, and a batch (the first argument's first dim > 0).
inline bool staged_here(bool staging, std::initializer_list<const Tensor*> args, Device d, DType dtype) {
  if (!staging || stagecraft::detail::context().trace != nullptr || args.size() == 0) return false;
  for (const Tensor* t : args)
    if (t->is_symbolic() || t->device() != d || t->dtype() != dtype) return false;
  if ((*args.begin())->shape()[0] == 0) return false;
  const Device* scoped = stagecraft::detail::scoped_device();
  return scoped == nullptr || *scoped == d;
}

/// The staged function of a cell's step (Step's operator() is its body), traced once per batch
/// shape, device and dtype of the arguments, without a retrace warning (a shape of its own for
/// each batch size is expected).
template <class Step>
std::shared_ptr<Function<Step>> staged_step(const char* name) {
  auto f = std::make_shared<Function<Step>>(Step{}, name);
  f->set_retrace_log(false);
  return f;
}

}  // namespace stagecraft::nn::detail_cell
