// EXPECT: sc::where needs a tensor or staged value in a branch
#include <stagecraft/stagecraft.hpp>
int main() {
  const sc::Tensor x = sc::ones({3});
  auto e = sc::where(sc::stage(x) > 0, 1.f, 0.f);
  (void)e;
}
