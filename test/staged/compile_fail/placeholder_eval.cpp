// EXPECT: this staged value reads an argument of sc::compile
#include <stagecraft/stagecraft.hpp>
int main() {
  auto g = sc::compile([](auto a) { return a * 2.f; });
  auto e = g.expression<1>();  // placeholders, bound only when g is called
  (void)sc::eval(e);
}
