// make_saved_function: writes a small saved function, inputs for it and the results the
// original computes, for stagecraft_run's test (test_run.sh): `make_saved_function <dir>`.
#include <stagecraft/stagecraft.hpp>

#include <iostream>
#include <string>
#include <tuple>

namespace sc = stagecraft;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: make_saved_function <dir>\n";
    return 2;
  }
  const std::string dir = argv[1];
  try {
    // A dense layer with a variable, a constant, a reduction and two results.
    sc::Variable w(sc::random::normal({3, 4}, 1), "dense/w"), b(sc::tensor({0.5f, -0.5f, 1.f, 0.f}), "dense/b");
    auto f = sc::function(
        [&](sc::Tensor x, sc::Tensor scale) {
          const sc::Tensor h = sc::tanh(sc::matmul(x, w) + b) * scale;
          return std::make_tuple(h, sc::sum(h, {1}));
        },
        "dense");
    const sc::Tensor x = sc::random::normal({2, 3}, 2), scale = sc::tensor({1.f, 2.f, 3.f, 4.f});
    f.get_concrete(x, scale).save(dir + "/model.scg");
    auto [h, s] = f(x, scale);
    sc::io::save_npy(dir + "/x.npy", x);
    sc::io::save_npy(dir + "/scale.npy", scale);
    sc::io::save_npy(dir + "/expected0.npy", h);
    sc::io::save_npy(dir + "/expected1.npy", s);
    sc::io::save_npy(dir + "/wrong.npy", sc::ones({3, 2}));
  } catch (const std::exception& e) {
    std::cerr << "make_saved_function: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
