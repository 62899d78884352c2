// EXPECT: sc::transpose is not elementwise and has no staged form.*sc::eval
#include <stagecraft/stagecraft.hpp>
int main() {
  const sc::Tensor x = sc::ones({2, 3});
  auto e = sc::transpose(sc::exp(sc::stage(x)), {1, 0});
  (void)e;
}
