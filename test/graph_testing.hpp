// Graph tests' helper: a function traced on symbolic CPU arguments into a graph (without
// sc::function's optimization passes and plan), for tests of passes, plans and lowering.
#pragma once
#include <stagecraft/graph/trace.hpp>

#include <functional>
#include <source_location>
#include <string>
#include <vector>

namespace sctest {

/// f traced on symbolic arguments of the given specs (on the CPU).
inline stagecraft::graph::Graph trace(const std::vector<stagecraft::TensorSpec>& specs,
                                      const std::function<std::vector<stagecraft::Tensor>(
                                          const std::vector<stagecraft::Tensor>&)>& f,
                                      std::string name = "f") {
  stagecraft::graph::GraphBuilder b(std::move(name));
  {
    stagecraft::graph::TraceScope s(b);
    std::vector<stagecraft::Tensor> xs;
    for (const stagecraft::TensorSpec& sp : specs) xs.push_back(b.add_input(sp, stagecraft::Device::cpu()));
    b.set_outputs(f(xs), std::source_location::current());
  }
  return b.graph;
}

}  // namespace sctest
