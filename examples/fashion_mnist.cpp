// Trains an MLP or a CNN on Fashion-MNIST, eagerly or with a staged (traced) training step, with
// checkpoints that resume exactly.
//
//   fashion_mnist [--model mlp|cnn] [--mode eager|staged|graph] [--device cpu|cuda[:N]] [--epochs N]
//                 [--batch N] [--seed N] [--save PATH] [--resume PATH] [--data DIR] [--limit N]
//                 [--test-limit N] [--threads auto|N] [--help]
//
// stdout: one line per epoch (epoch, mean training loss, test accuracy), then, last, exactly
// `test_accuracy=0.XXXX examples_per_sec=NNNN`. stderr: a progress bar (in place on a
// terminal, one line per epoch otherwise). Exit status: 0 ok, 1 runtime error (missing data,
// bad checkpoint), 2 usage error.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <iostream>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <stagecraft/data/batcher.hpp>
#include <stagecraft/data/idx.hpp>
#include <stagecraft/state/checkpoint.hpp>

#include "fashion_mnist_models.hpp"

namespace sc = stagecraft;

namespace {

struct Options {
  std::string model = "mlp";
  std::string mode = "eager";
  std::int64_t epochs = 5;
  std::int64_t batch = 128;
  std::uint64_t seed = 0;
  std::string save, resume;
  std::string data = sc::data::default_fashion_mnist_dir;
  std::optional<std::int64_t> limit, test_limit;
  sc::Device device = sc::Device::cpu();
  std::int64_t threads = 0;  // 0: auto (a ThreadTuner chooses up to OpenMP's count)
};

constexpr const char* usage_text =
    "usage: fashion_mnist [options]\n"
    "  --model mlp|cnn      model to train (default mlp)\n"
    "  --mode eager|staged|graph  how to run the training step (default eager); staged: traced, and\n"
    "                       on a GPU replayed as one CUDA graph per step where its copies cost less\n"
    "                       than its launches (STAGECRAFT_CUDA_GRAPHS=0: never); graph: always\n"
    "  --device cpu|cuda[:N] where the weights live and the steps run (default cpu)\n"
    "  --epochs N           epochs to train in total (default 5)\n"
    "  --batch N            minibatch size (default 128)\n"
    "  --seed N             seed of the weights and of the batch order (default 0)\n"
    "  --save PATH          checkpoint model, optimizer and epoch after every epoch\n"
    "  --resume PATH        restore a checkpoint and continue from its epoch\n"
    "  --data DIR           Fashion-MNIST directory (default /usr/share/datasets/fashion-mnist)\n"
    "  --limit N            train on the first N training examples only\n"
    "  --test-limit N       measure accuracy on the first N test examples only\n"
    "  --threads auto|N     CPU threads: auto (default) times the first steps at OpenMP's count\n"
    "                       (OMP_NUM_THREADS) and fewer, and keeps the fastest; N: exactly N\n"
    "  --help               this message\n";

struct UsageError {
  std::string what;
};

/// A whole-string non-negative integer, or a UsageError naming the flag.
std::uint64_t parse_uint(std::string_view flag, const std::string& v) {
  std::size_t used = 0;
  unsigned long long x = 0;
  try {
    if (v.empty() || v[0] == '-' || v[0] == '+') throw std::invalid_argument("sign");
    x = std::stoull(v, &used);
  } catch (const std::exception&) {
    used = std::string::npos;
  }
  if (used != v.size()) throw UsageError{std::string(flag) + " expects a non-negative integer, got '" + v + "'"};
  return x;
}

/// A whole-string integer >= 1 (that fits an int64), or a UsageError naming the flag.
std::int64_t parse_positive(std::string_view flag, const std::string& v) {
  const std::uint64_t x = parse_uint(flag, v);
  if (x < 1 || x > (1ull << 62)) throw UsageError{std::string(flag) + " expects an integer >= 1, got '" + v + "'"};
  return static_cast<std::int64_t>(x);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") throw UsageError{};
    std::string value;
    bool inline_value = false;
    if (const auto eq = arg.find('='); arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
      inline_value = true;
    }
    static const std::vector<std::string_view> flags = {"--model", "--mode", "--epochs", "--batch", "--seed",
                                                        "--save",  "--resume", "--data", "--limit", "--device",
                                                        "--test-limit", "--threads"};
    bool known = false;
    for (std::string_view f : flags) known = known || arg == f;
    if (!known) throw UsageError{"unknown option '" + arg + "'"};
    if (!inline_value) {
      if (i + 1 >= argc) throw UsageError{arg + " needs a value"};
      value = argv[++i];
    }
    if (arg == "--model") {
      if (value != "mlp" && value != "cnn") throw UsageError{"--model expects mlp or cnn, got '" + value + "'"};
      o.model = value;
    } else if (arg == "--mode") {
      if (value != "eager" && value != "staged" && value != "graph")
        throw UsageError{"--mode expects eager, staged or graph, got '" + value + "'"};
      o.mode = value;
    } else if (arg == "--device") {
      if (value == "cpu") {
        o.device = sc::Device::cpu();
      } else if (value == "cuda") {
        o.device = sc::Device::cuda(0);
      } else if (const std::string n = value.substr(std::min<std::size_t>(value.size(), 5));
                 value.rfind("cuda:", 0) == 0 && !n.empty() && n.size() <= 4 &&
                 std::all_of(n.begin(), n.end(), [](char c) { return c >= '0' && c <= '9'; })) {
        o.device = sc::Device::cuda(std::stoi(n));
      } else {
        throw UsageError{"--device expects cpu, cuda or cuda:N, got '" + value + "'"};
      }
    } else if (arg == "--epochs") {
      o.epochs = parse_positive(arg, value);
    } else if (arg == "--batch") {
      o.batch = parse_positive(arg, value);
    } else if (arg == "--seed") {
      o.seed = parse_uint(arg, value);
    } else if (arg == "--limit") {
      o.limit = parse_positive(arg, value);
    } else if (arg == "--test-limit") {
      o.test_limit = parse_positive(arg, value);
    } else if (arg == "--threads") {
      std::int64_t n = 0;  // 0: auto
      if (value != "auto") {
        try {
          n = parse_positive(arg, value);
        } catch (const UsageError&) {
          n = -1;
        }
        if (n < 1 || n > 4096)
          throw UsageError{"--threads expects auto or an integer from 1 to 4096, got '" + value + "'"};
      }
      o.threads = n;
    } else if (value.empty()) {
      throw UsageError{arg + " needs a non-empty value"};
    } else if (arg == "--save") {
      o.save = value;
    } else if (arg == "--resume") {
      o.resume = value;
    } else {
      o.data = value;
    }
  }
  return o;
}

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

/// The per-epoch progress report on stderr: on a terminal a bar redrawn in place (\r, then
/// erase to the end of the line; at most ten times a second, so drawing costs nothing
/// measurable), otherwise one summary line per epoch.
class Progress {
 public:
  Progress(std::int64_t epoch, std::int64_t epochs, std::int64_t batches)
      : epoch_(epoch), epochs_(epochs), batches_(batches), tty_(isatty(fileno(stderr)) != 0) {}

  void update(std::int64_t done, double running_loss, double examples_per_sec) {
    if (!tty_) return;
    const auto now = Clock::now();
    if (done != batches_ && now - last_ < std::chrono::milliseconds(100)) return;
    last_ = now;
    constexpr int width = 30;
    const int filled = static_cast<int>(width * done / std::max<std::int64_t>(batches_, 1));
    std::string bar(static_cast<std::size_t>(filled), '=');
    if (filled < width) bar += '>';
    bar.resize(width, ' ');
    std::fprintf(stderr, "\repoch %lld/%lld [%s] %lld/%lld  loss %.4f  %.0f ex/s\033[K", static_cast<long long>(epoch_),
                 static_cast<long long>(epochs_), bar.c_str(), static_cast<long long>(done),
                 static_cast<long long>(batches_), running_loss, examples_per_sec);
    std::fflush(stderr);
  }

  void finish(double mean_loss, double examples_per_sec, double secs) {
    if (tty_) {
      std::fprintf(stderr, "\n");
    } else {
      std::fprintf(stderr, "epoch %lld/%lld: %lld batches, loss %.4f, %.0f ex/s, %.1f s\n",
                   static_cast<long long>(epoch_), static_cast<long long>(epochs_),
                   static_cast<long long>(batches_), mean_loss, examples_per_sec, secs);
    }
    std::fflush(stderr);
  }

 private:
  std::int64_t epoch_, epochs_, batches_;
  bool tty_;
  Clock::time_point last_{};
};

/// Builds the model, restores or starts, trains the remaining epochs, reports. Returns the exit status.
template <class Model>
int run(const Options& o, const sc::data::Dataset& data) {
  // --device cuda: the weights, the optimizer's slots and every op of the steps go to the GPU; the
  // data is copied there once, so the Batcher gathers each batch on the device.
  std::optional<sc::DeviceScope> on_device;
  if (o.device.is_cuda()) on_device.emplace(o.device);
  sc::Tensor test_x = data.test_images.to(o.device), test_y = data.test_labels.to(o.device);
  if (o.test_limit && *o.test_limit < test_x.shape()[0]) {
    test_x = sc::slice(test_x, {0, 0, 0}, {*o.test_limit, -1, -1});
    test_y = sc::slice(test_y, {0}, {*o.test_limit});
  }
  sc::manual_seed(o.seed);  // the weights' seeds come from the global stream, in member order
  Model model;
  sc::optim::Adam opt(1e-3);
  const std::vector<sc::Variable> vars = model.trainable_variables();
  opt.build(vars);  // slots exist before a restore, under the names the checkpoint uses

  // The epochs completed and the seed of the batch order, saved with the weights so a resumed
  // run continues exactly where the interrupted one stopped.
  sc::Variable epoch_var(sc::scalar<std::int64_t>(0), "epoch", /*trainable=*/false);
  sc::Variable seed_var(sc::scalar<std::int64_t>(static_cast<std::int64_t>(o.seed)), "seed", false);
  sc::Checkpoint ckpt;
  ckpt.track("model", model);
  ckpt.track("optimizer", opt);
  ckpt.track("epoch", epoch_var);
  ckpt.track("seed", seed_var);

  std::uint64_t seed = o.seed;
  if (!o.resume.empty()) {
    try {
      ckpt.restore(o.resume);
    } catch (const sc::IOError&) {
      std::fprintf(stderr, "fashion_mnist: cannot resume from %s (is it a checkpoint of --model %s?)\n",
                   o.resume.c_str(), o.model.c_str());
      throw;
    }
    seed = static_cast<std::uint64_t>(seed_var.value().item<std::int64_t>());
    if (seed != o.seed)
      std::fprintf(stderr, "note: continuing with the checkpoint's seed %llu (not --seed %llu)\n",
                   static_cast<unsigned long long>(seed), static_cast<unsigned long long>(o.seed));
    std::fprintf(stderr, "resumed from %s after epoch %lld\n", o.resume.c_str(),
                 static_cast<long long>(epoch_var.value().item<std::int64_t>()));
  }
  const std::int64_t start = epoch_var.value().item<std::int64_t>();

  sc::Tensor train_x = data.train_images.to(o.device), train_y = data.train_labels.to(o.device);
  if (o.limit && *o.limit < train_x.shape()[0]) {
    train_x = sc::slice(train_x, {0, 0, 0}, {*o.limit, -1, -1});
    train_y = sc::slice(train_y, {0}, {*o.limit});
  }
  sc::data::Batcher batcher(train_x, train_y, o.batch, seed);
  const std::int64_t n_train = batcher.size();
  const std::int64_t n_test = test_x.shape()[0];

  double train_secs = 0;
  std::int64_t trained = 0;
  double accuracy = 0;
  // --mode staged: the same step, traced once per batch shape into one optimized graph (forward,
  // gradients and the Adam update), then replayed; evaluation is staged the same way.
  // A step whose plan runs wholly on the GPU is captured as a CUDA graph on its second call, then
  // replayed as one launch: under --mode staged where the library's policy finds it cheaper (the
  // default, cuda::GraphPolicy::when_cheaper), under --mode graph always.
  const bool staged = o.mode == "staged" || o.mode == "graph";
  if (o.mode == "graph") sc::cuda::set_graphs(true);
  auto staged_step = sc::function(
      [&](sc::Tensor x, sc::Tensor y) { return fashion::train_step(model, opt, vars, x, y); }, "train_step");
  auto staged_predict = sc::function([&](sc::Tensor x) { return model(x); }, "predict");
  auto evaluate = [&] {
    if (!staged) return double(fashion::count_correct(model, test_x, test_y)) / double(n_test);
    return double(fashion::count_correct(staged_predict, test_x, test_y)) / double(n_test);
  };
  if (start >= o.epochs) {
    std::fprintf(stderr, "the checkpoint already holds %lld epochs (--epochs %lld): evaluating only\n",
                 static_cast<long long>(start), static_cast<long long>(o.epochs));
    accuracy = evaluate();
  }
  sc::Tensor last_x, last_y;  // a batch of the last shape, to ask the step how it ran
  // --threads auto: the steps on the CPU run at OpenMP's count and fewer, timed, and the fastest
  // count is kept (more threads than the machine really runs make every parallel region wait).
  if (o.threads > 0) sc::set_num_threads(static_cast<int>(o.threads));
  std::optional<sc::ThreadTuner> tuner;
  if (o.threads == 0 && !o.device.is_cuda()) tuner.emplace();
  auto step = [&](const sc::Tensor& x, const sc::Tensor& y) {
    return staged ? staged_step(x, y) : fashion::train_step(model, opt, vars, x, y);
  };
  for (std::int64_t epoch = start; epoch < o.epochs; ++epoch) {
    batcher.start_epoch(epoch);
    Progress progress(epoch + 1, o.epochs, batcher.batches_per_epoch());
    double loss_sum = 0;  // sum over examples of the per-example loss, for the epoch's mean
    std::int64_t seen = 0, done = 0;
    const auto t0 = Clock::now();
    while (auto b = batcher.next()) {
      const sc::Tensor loss = tuner ? tuner->run([&] { return step(b->x, b->y); }) : step(b->x, b->y);
      const std::int64_t len = b->x.shape()[0];
      last_x = b->x, last_y = b->y;
      loss_sum += loss.item<double>() * double(len);
      seen += len;
      ++done;
      progress.update(done, loss_sum / double(seen), double(seen) / seconds_since(t0));
    }
    const double secs = seconds_since(t0);
    train_secs += secs;
    trained += seen;
    const double mean_loss = loss_sum / double(n_train);
    progress.finish(mean_loss, double(seen) / secs, secs);

    accuracy = evaluate();
    std::printf("epoch %lld loss=%.6f test_accuracy=%.4f\n", static_cast<long long>(epoch + 1), mean_loss, accuracy);
    std::fflush(stdout);
    if (!o.save.empty()) {
      epoch_var.assign(sc::scalar<std::int64_t>(epoch + 1));
      ckpt.save(o.save);  // atomic: an interrupted save leaves the previous epoch's file
    }
  }
  const double eps = train_secs > 0 ? double(trained) / train_secs : 0.0;
  if (staged) std::fprintf(stderr, "staged: the training step was traced %d time(s)\n", staged_step.trace_count());
  if (staged && o.device.is_cuda() && last_x.defined()) {
    const std::string g = staged_step.get_concrete(last_x, last_y).stats().plan.cuda_graph;
    std::fprintf(stderr, "cuda graph: %s\n", g.empty() ? "none (the step runs on the CPU)" : g.c_str());
  }
  if (o.device.is_cuda() && o.model == "cnn") {
    const sc::cuda::ConvStats cs = sc::cuda::conv_stats();
    std::fprintf(stderr, "convolutions: %lld passes through cuDNN, %lld through im2col (%s)\n",
                 static_cast<long long>(cs.cudnn), static_cast<long long>(cs.im2col), sc::cuda::cudnn_status().c_str());
  }
  // What the CPU ran (thread-scaling tables); after training: the BLAS core is chosen at the first product.
  char quota[32] = "none";
  if (const auto q = sc::cpu_quota()) std::snprintf(quota, sizeof quota, "%.2f CPUs", *q);
  std::fprintf(stderr, "cpu: %d threads, OpenBLAS core %s, CPU quota %s\n", sc::num_threads(), sc::blas_core().c_str(),
               quota);
  if (tuner) std::fprintf(stderr, "threads tuned: %s\n", tuner->summary().c_str());
  std::printf("test_accuracy=%.4f examples_per_sec=%lld\n", accuracy, static_cast<long long>(eps + 0.5));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  try {
    o = parse(argc, argv);
  } catch (const UsageError& e) {
    if (e.what.empty()) {  // --help
      std::fputs(usage_text, stdout);
      return 0;
    }
    std::fprintf(stderr, "fashion_mnist: %s\n%s", e.what.c_str(), usage_text);
    return 2;
  }
  try {
    // Before the data is read: a missing GPU is reported at once.
    if (o.device.is_cuda()) sc::cuda::detail::require_device(o.device, "--device", std::source_location::current());
    const sc::data::Dataset data = sc::data::load_fashion_mnist(o.data);
    std::fprintf(stderr, "Fashion-MNIST: %lld training, %lld test images; model %s, batch %lld, seed %llu, %s\n",
                 static_cast<long long>(data.train_images.shape()[0]),
                 static_cast<long long>(data.test_images.shape()[0]), o.model.c_str(),
                 static_cast<long long>(o.batch), static_cast<unsigned long long>(o.seed), o.device.str().c_str());
    return o.model == "cnn" ? run<fashion::CNN>(o, data) : run<fashion::MLP>(o, data);
  } catch (const sc::Error& e) {
    std::fprintf(stderr, "fashion_mnist: %s\n", e.what());
    return 1;
  }
}
