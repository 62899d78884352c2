// EXPECT: a staged cast needs its dtype at compile time: write sc::cast<sc::f32>
#include <stagecraft/stagecraft.hpp>
int main() {
  const sc::Tensor x = sc::ones({3});
  auto e = sc::cast(sc::stage(x), sc::f64);
  (void)e;
}
