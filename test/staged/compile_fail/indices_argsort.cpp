// EXPECT: sc::argsort gives integer indices and has no staged form.*sc::eval
#include <stagecraft/stagecraft.hpp>
int main() {
  const sc::Tensor x = sc::ones({2, 3});
  auto e = sc::argsort(sc::exp(sc::stage(x)), 1);
  (void)e;
}
