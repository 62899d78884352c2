// EXPECT: sc::grad<I>: I is not an argument of the function
#include <stagecraft/stagecraft.hpp>
int main() {
  const sc::Tensor a = sc::ones({2, 2});
  auto g = sc::compile([](auto x, auto w) { return sc::tanh(sc::matmul(x, w)); });
  (void)sc::grad<2>(g)(a, a);
}
