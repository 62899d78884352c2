// EXPECT: a staged value cannot be used as a C\+\+ bool.*sc::where
#include <stagecraft/stagecraft.hpp>
int main() {
  const sc::Tensor x = sc::ones({3});
  if (sc::stage(x) > 0) return 1;  // the elements are not known while the graph is built
  return 0;
}
