// EXPECT: sc::grad cannot yet differentiate through matmul.*GradientTape
#include <stagecraft/stagecraft.hpp>
int main() {
  const sc::Tensor a = sc::ones({2, 2});
  auto g = sc::compile([](auto x, auto w) { return sc::tanh(sc::matmul(x, w)); });
  (void)sc::grad<0>(g)(a, a);
}
