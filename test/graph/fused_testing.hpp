// Helpers of the fused evaluator's tests (test_fused_kernel.cpp, test_fused_out_windows.cpp).
#pragma once
#include <string>

#include <stagecraft/graph/fused_kernel.hpp>

namespace sctest::fused {

/// What graph::prepare(p) says of p: its ValueError's message, or "no error".
inline std::string prepare_error(const sc::graph::FusedProgram& p) {
  try {
    sc::graph::prepare(p);
  } catch (const sc::ValueError& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace sctest::fused
