// stagecraft_run: loads a saved function (ConcreteFunction::save), runs it on .npy inputs and
// writes its results as .npy files. It holds none of the model's code: the file is the model.
//
//   stagecraft_run model.scg input0.npy [input1.npy ...] [-o out_prefix]
//
// Writes <prefix>0.npy, <prefix>1.npy, ... (prefix "output" by default) and prints one line per
// result. Exit status: 0 done, 1 an error (missing file, wrong inputs), 2 a usage error.
#include <stagecraft/stagecraft.hpp>

#include <cstdio>
#include <exception>
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

namespace sc = stagecraft;

namespace {

constexpr std::string_view usage =
    "usage: stagecraft_run model.scg input0.npy [input1.npy ...] [-o out_prefix]\n"
    "  Runs a function saved with sc::ConcreteFunction::save on .npy inputs and writes each\n"
    "  result to <out_prefix><i>.npy (default prefix: output).\n";

struct Args {
  std::string model;
  std::vector<std::string> inputs;
  std::string prefix = "output";
};

/// Parses the command line; returns false (after printing why) on a usage error.
bool parse(int argc, char** argv, Args& a, bool& help) {
  std::vector<std::string> pos;
  for (int i = 1; i < argc; ++i) {
    const std::string_view s = argv[i];
    if (s == "-h" || s == "--help") {
      help = true;
      return true;
    }
    if (s == "-o") {
      if (i + 1 >= argc) {
        std::cerr << "stagecraft_run: -o needs a value\n" << usage;
        return false;
      }
      a.prefix = argv[++i];
    } else if (s.size() > 1 && s[0] == '-') {
      std::cerr << "stagecraft_run: unknown option '" << s << "'\n" << usage;
      return false;
    } else {
      pos.emplace_back(s);
    }
  }
  if (pos.empty()) {
    std::cerr << usage;
    return false;
  }
  a.model = pos[0];
  a.inputs.assign(pos.begin() + 1, pos.end());
  return true;
}

std::string type_text(sc::DType d, const sc::Shape& s) { return std::string(sc::name(d)) + s.str(); }

int run(const Args& a) {
  const sc::ConcreteFunction f = sc::load_function(a.model);
  const sc::graph::Graph& g = f.graph();
  if (a.inputs.size() != g.inputs.size()) {
    std::string want;
    for (int v : g.inputs) want += (want.empty() ? "" : ", ") + type_text(g.values[v].dtype, g.values[v].shape);
    std::cerr << "stagecraft_run: error: '" << a.model << "' takes " << g.inputs.size() << " inputs (" << want
              << "), got " << a.inputs.size() << "\n";
    return 1;
  }
  std::vector<sc::Tensor> xs;
  for (std::size_t i = 0; i < a.inputs.size(); ++i) {
    sc::Tensor x = sc::io::load_npy(a.inputs[i]);
    const sc::graph::Value& v = g.values[g.inputs[i]];
    if (x.shape() != v.shape || x.dtype() != v.dtype) {
      std::cerr << "stagecraft_run: error: input " << i << " ('" << a.inputs[i] << "') is "
                << type_text(x.dtype(), x.shape()) << ", the function takes " << type_text(v.dtype, v.shape) << "\n";
      return 1;
    }
    xs.push_back(v.device.is_cpu() ? x : x.to(v.device));
  }
  const std::vector<sc::Tensor> ys = f.call(xs);
  for (std::size_t i = 0; i < ys.size(); ++i) {
    const sc::Tensor y = ys[i].device().is_cpu() ? ys[i] : ys[i].to(sc::Device::cpu());
    const std::string path = a.prefix + std::to_string(i) + ".npy";
    sc::io::save_npy(path, y);
    std::cout << path << ": " << type_text(y.dtype(), y.shape()) << "\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  bool help = false;
  if (!parse(argc, argv, a, help)) return 2;
  if (help) {
    std::cout << usage;
    return 0;
  }
  try {
    return run(a);
  } catch (const std::exception& e) {
    std::cerr << "stagecraft_run: error: " << e.what() << "\n";
    return 1;
  }
}
