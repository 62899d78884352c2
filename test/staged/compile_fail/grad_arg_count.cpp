// EXPECT: sc::compile: the function does not take this many tensors
#include <stagecraft/stagecraft.hpp>
int main() {
  const sc::Tensor a = sc::ones({2, 2});
  auto g = sc::compile([](auto x, auto w) { return sc::tanh(sc::matmul(x, w)); });
  (void)sc::grad<0>(g)(a);  // the derivative takes the function's two arguments
}
