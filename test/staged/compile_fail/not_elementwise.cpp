// EXPECT: sc::reshape is not elementwise and has no staged form.*sc::eval
#include <stagecraft/stagecraft.hpp>
int main() {
  const sc::Tensor x = sc::ones({2, 3});
  auto g = sc::compile([](auto a) { return sc::reshape(sc::tanh(a), {6}); });
  (void)g(x);
}
