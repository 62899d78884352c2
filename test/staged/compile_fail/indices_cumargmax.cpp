// EXPECT: sc::cumargmax gives integer indices and has no staged form.*sc::eval
#include <stagecraft/stagecraft.hpp>
int main() {
  const sc::Tensor x = sc::ones({2, 3});
  auto e = sc::cumargmax(sc::exp(sc::stage(x)), 1);
  (void)e;
}
