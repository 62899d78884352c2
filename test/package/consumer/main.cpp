// Package-test consumer: includes the umbrella header, adds two tensors and checks the sum.
#include <cstdio>
#include <vector>

#include <stagecraft/stagecraft.hpp>

int main() {
  const sc::Tensor a = sc::tensor({{1.f, 2.f, 3.f}, {4.f, 5.f, 6.f}});
  const sc::Tensor b = sc::tensor({10.f, 20.f, 30.f});
  const sc::Tensor c = a + b;  // broadcasts [2,3] + [3]
  const std::vector<float> want{11.f, 22.f, 33.f, 14.f, 25.f, 36.f};
  if (c.dtype() != sc::f32 || c.shape() != sc::Shape{2, 3} || c.to_vector<float>() != want) {
    std::fprintf(stderr, "stagecraft consumer: wrong result for a + b\n");
    return 1;
  }
  std::puts("stagecraft consumer: ok");
  return 0;
}
