// EXPECT: staged ops take staged values, sc::Tensor or C\+\+ arithmetic scalars
#include <string>
#include <stagecraft/stagecraft.hpp>
int main() {
  const sc::Tensor x = sc::ones({3});
  auto e = sc::stage(x) + std::string("1");  // not a tensor, a staged value or a number
  (void)e;
}
