// CUDA backend checks that need no GPU: availability, the DeviceError a CUDA request raises where no
// device is found, and the kernels' broadcasting geometry. They run on every machine.
#include "testing.hpp"

#include <stagecraft/staged/cuda_kernel.hpp>  // the host compiler's view of sc::compile's kernels

#include <limits>

using sctest::error_of;
namespace abi = sc::cuda::abi;

TEST_CASE("cuda: availability agrees with the device count", "[cuda]") {
  CHECK(sc::cuda::is_available() == (sc::cuda::device_count() > 0));
  if (!sc::cuda::built) CHECK(sc::cuda::device_count() == 0);
  sc::cuda::synchronize();  // a no-op without devices, never an error
}

TEST_CASE("cuda: a request for a missing device is a DeviceError naming the op and the line", "[cuda]") {
  const sc::Device missing = sc::Device::cuda(sc::cuda::device_count());  // one past the last device
  const std::string why = sc::cuda::built ? (sc::cuda::device_count() == 0 ? "no CUDA device" : "CUDA device(s) are available")
                                          : "built without CUDA";
  const sc::Tensor x = sc::ones({2, 3});
  const std::string to = error_of<sc::DeviceError>([&] { (void)x.to(missing); });
  CHECK_THAT(to, Catch::Contains("[to]") && Catch::Contains(missing.str()) && Catch::Contains(why) &&
                     Catch::Contains("test_cuda_host.cpp:"));
  const std::string op = error_of<sc::DeviceError>([&] {
    sc::DeviceScope on(missing);
    (void)sc::exp(x);
  });
  CHECK_THAT(op, Catch::Contains("[exp]") && Catch::Contains("cuda") && Catch::Contains(why) &&
                     Catch::Contains("test_cuda_host.cpp:"));
  const std::string fill = error_of<sc::DeviceError>([&] {
    sc::DeviceScope on(missing);
    (void)sc::detail::fill({4}, 1.0, sc::f32);
  });
  CHECK_THAT(fill, Catch::Contains("[fill]") && Catch::Contains("cuda"));
}

TEST_CASE("cuda: cuDNN is loaded at run time, without a GPU and without being linked", "[cuda][conv]") {
  const int v = sc::cuda::cudnn_version();
  const std::string status = sc::cuda::cudnn_status();
  INFO(status);
  CHECK(sc::cuda::cudnn_version() == v);  // loaded once
  if (v > 0) {
    CHECK(v >= 8000);  // cuDNN 8 or later (the legacy API's _v7 heuristics)
    CHECK(status == "cuDNN " + sc::cuda::detail::cudnn_version_text(v));
  } else {
    CHECK_FALSE(status.empty());  // why not
  }
#if defined(SC_TEST_EXPECT_CUDNN)
  // The build found cudnn.h and libcudnn: the library must load from where the build found it.
  CHECK(v > 0);
#endif
  if (!sc::cuda::built) CHECK(v == 0);
}

TEST_CASE("cuda: cuDNN's version numbers read in both of its schemes", "[cuda][conv]") {
  using sc::cuda::detail::cudnn_version_text;
  CHECK(cudnn_version_text(91900) == "9.19.0");  // cuDNN 9: major * 10000 + minor * 100 + patch
  CHECK(cudnn_version_text(90100) == "9.1.0");
  CHECK(cudnn_version_text(100203) == "10.2.3");
  CHECK(cudnn_version_text(8907) == "8.9.7");  // cuDNN 8: major * 1000 + minor * 100 + patch
  CHECK(cudnn_version_text(8100) == "8.1.0");
}

TEST_CASE("cuda: the GPU convolution setting: im2col by default, cuDNN on request, a bad name is a ValueError",
          "[cuda][conv]") {
  using sc::cuda::ConvAlgorithm;
  const ConvAlgorithm saved = sc::cuda::conv_algorithm();
  if (std::getenv("STAGECRAFT_CUDA_CONV") == nullptr) CHECK(saved == ConvAlgorithm::im2col);
  sc::cuda::set_conv_algorithm(ConvAlgorithm::cudnn);
  CHECK(sc::cuda::conv_algorithm() == ConvAlgorithm::cudnn);
  sc::cuda::set_conv_algorithm(saved);
  CHECK(sc::cuda::detail::parse_conv_algorithm("im2col", "x") == ConvAlgorithm::im2col);
  CHECK(sc::cuda::detail::parse_conv_algorithm("cudnn", "x") == ConvAlgorithm::cudnn);
  const std::string bad =
      error_of<sc::ValueError>([] { (void)sc::cuda::detail::parse_conv_algorithm("winograd", "STAGECRAFT_CUDA_CONV"); });
  CHECK_THAT(bad, Catch::Contains("[conv2d] STAGECRAFT_CUDA_CONV must be 'cudnn' or 'im2col', got 'winograd'"));
  sc::cuda::reset_conv_stats();
  CHECK(sc::cuda::conv_stats().cudnn == 0);
  CHECK(sc::cuda::conv_stats().im2col == 0);
  (void)sc::nn::conv2d(sc::ones({1, 1, 3, 3}), sc::ones({1, 1, 2, 2}));  // on the CPU: not counted
  CHECK(sc::cuda::conv_stats().cudnn + sc::cuda::conv_stats().im2col == 0);
}

TEST_CASE("cuda: the abi's dtype numbers are stagecraft's", "[cuda]") {
  STATIC_REQUIRE(static_cast<int>(abi::DT::b8) == static_cast<int>(sc::DType::b8));
  STATIC_REQUIRE(static_cast<int>(abi::DT::i32) == static_cast<int>(sc::DType::i32));
  STATIC_REQUIRE(static_cast<int>(abi::DT::i64) == static_cast<int>(sc::DType::i64));
  STATIC_REQUIRE(static_cast<int>(abi::DT::f32) == static_cast<int>(sc::DType::f32));
  STATIC_REQUIRE(static_cast<int>(abi::DT::f64) == static_cast<int>(sc::DType::f64));
  STATIC_REQUIRE(abi::max_rank == sc::max_rank);
}

TEST_CASE("cuda: every elementwise op maps to its rule's kernel", "[cuda]") {
  namespace be = sc::backend::cuda;
  STATIC_REQUIRE(be::unary_rule<sc::ops::Neg>() == abi::UnaryRule::Neg);
  STATIC_REQUIRE(be::unary_rule<sc::ops::Sigmoid>() == abi::UnaryRule::Sigmoid);
  STATIC_REQUIRE(be::unary_rule<sc::ops::LogicalNot>() == abi::UnaryRule::LogicalNot);
  STATIC_REQUIRE(be::binary_rule<sc::ops::Add>() == abi::BinaryRule::Add);
  STATIC_REQUIRE(be::binary_rule<sc::ops::LessEqual>() == abi::BinaryRule::LessEqual);
  STATIC_REQUIRE(be::binary_rule<sc::ops::LogicalOr>() == abi::BinaryRule::LogicalOr);
  STATIC_REQUIRE(be::binary_rule<sc::ops::ReluGrad>() == abi::BinaryRule::ReluGrad);
  STATIC_REQUIRE(sc::detail::CudaOp<sc::ops::Exp>);
  STATIC_REQUIRE(sc::detail::CudaOp<sc::ops::Maximum>);
  STATIC_REQUIRE(sc::detail::CudaOp<sc::ops::Where>);
  STATIC_REQUIRE(sc::detail::CudaOp<sc::ops::Cast>);
  STATIC_REQUIRE(sc::detail::CudaOp<sc::ops::Fill>);
  STATIC_REQUIRE(sc::detail::CudaOp<sc::ops::Sum>);
  STATIC_REQUIRE(sc::detail::CudaOp<sc::ops::MatMul>);
  STATIC_REQUIRE(sc::detail::CudaOp<sc::ops::RandomNormal>);
  STATIC_REQUIRE(sc::detail::CudaOp<sc::ops::ArgMax>);
  STATIC_REQUIRE(sc::detail::CudaOp<sc::ops::Transpose>);
  STATIC_REQUIRE(sc::detail::CudaOp<sc::ops::Slice>);
  STATIC_REQUIRE(sc::detail::CudaOp<sc::ops::BroadcastTo>);
  STATIC_REQUIRE(sc::detail::CudaOp<sc::ops::Concat>);
  STATIC_REQUIRE(sc::detail::CudaOp<sc::ops::OneHot>);
  STATIC_REQUIRE(sc::detail::CudaOp<sc::ops::Gather>);
  STATIC_REQUIRE(sc::detail::CudaOp<sc::ops::ScatterAdd>);
  STATIC_REQUIRE(sc::detail::CudaOp<sc::ops::Im2Col>);
  STATIC_REQUIRE(sc::detail::CudaOp<sc::ops::Col2Im>);
  STATIC_REQUIRE(sc::detail::CudaOp<sc::ops::Conv2d>);
  STATIC_REQUIRE(sc::detail::CudaOp<sc::ops::Conv2dGradInput>);
  STATIC_REQUIRE(sc::detail::CudaOp<sc::ops::Conv2dGradFilter>);
  STATIC_REQUIRE(sc::detail::CudaOp<sc::ops::MaxPool2d>);
  STATIC_REQUIRE(sc::detail::CudaOp<sc::ops::MaxPool2dGrad>);
  STATIC_REQUIRE(sc::detail::CudaOp<sc::ops::AvgPool2d>);
  STATIC_REQUIRE(sc::detail::CudaOp<sc::ops::SoftmaxCrossEntropy>);
  STATIC_REQUIRE(sc::detail::CudaOp<sc::ops::SoftmaxCrossEntropyGrad>);
}

TEST_CASE("cuda: broadcast geometry gives size-1 and missing axes stride 0", "[cuda]") {
  const sc::Shape out{2, 3, 4}, a{3, 1}, b{2, 3, 4}, s{};
  const abi::Geometry g = sc::backend::cuda::geometry(out, {&a, &b, &s});
  CHECK(g.rank == 3);
  CHECK(g.numel == 24);
  CHECK_FALSE(g.contiguous);
  CHECK(std::vector<std::int64_t>(g.strides[0], g.strides[0] + 3) == std::vector<std::int64_t>{0, 1, 0});
  CHECK(std::vector<std::int64_t>(g.strides[1], g.strides[1] + 3) == std::vector<std::int64_t>{12, 4, 1});
  CHECK(std::vector<std::int64_t>(g.strides[2], g.strides[2] + 3) == std::vector<std::int64_t>{0, 0, 0});
  CHECK(sc::backend::cuda::geometry(out, {&b, &b}).contiguous);
}

TEST_CASE("cuda: uneven batch broadcasting lists each matrix's offset", "[cuda]") {
  std::int64_t stride = -1;
  std::vector<std::int64_t> offsets;
  sc::backend::cuda::batch_offsets(sc::Shape{2, 1}, sc::Shape{2, 3}, 10, stride, offsets);
  CHECK(offsets == std::vector<std::int64_t>{0, 0, 0, 10, 10, 10});
  offsets.clear();
  sc::backend::cuda::batch_offsets(sc::Shape{1}, sc::Shape{5}, 10, stride, offsets);
  CHECK((stride == 0 && offsets.empty()));
  sc::backend::cuda::batch_offsets(sc::Shape{5}, sc::Shape{5}, 10, stride, offsets);
  CHECK((stride == 10 && offsets.empty()));
}

TEST_CASE("cuda: a bad index found by a kernel is reported with its launch's op, line and shape", "[cuda]") {
  namespace cd = sc::cuda::detail;
  cd::FaultLog log;
  cd::FaultSite site;
  site.op = "gather";
  site.file = "/home/me/model.cpp";
  site.line = 12;
  site.axis = 0;
  site.rank = 2;
  site.dims[0] = 5;
  site.dims[1] = 3;
  const std::int32_t tag = log.record(site);
  CHECK(tag == 1);
  site.op = "scatter_add";
  CHECK(log.record(site) == 2);
  cd::FaultSite found;
  REQUIRE(log.find(tag, found));
  CHECK(found.op == "gather");
  CHECK_FALSE(log.find(0, found));
  CHECK_FALSE(log.find(3, found));  // never recorded
  abi::Fault f;
  f.tag = tag;
  f.value = 7;
  f.bound = 5;
  const int line = __LINE__ + 1;
  const std::string text = cd::fault_text(&found, f, sc::Device::cuda(0), "to_vector", std::source_location::current());
  CHECK(text.rfind("[gather] index 7 is out of range for axis 0 of extent 5 (shape [5, 3]) at model.cpp:12; ", 0) == 0);
  CHECK_THAT(text, Catch::Contains("found on cuda:0 by the kernel") && Catch::Contains("[to_vector] at test_cuda_host.cpp:" + std::to_string(line)));
  // Once the ring has moved on, the fault is still reported, without a site.
  for (std::size_t k = 0; k < cd::FaultLog::size; ++k) log.record(site);
  CHECK_FALSE(log.find(tag, found));
  CHECK_THAT(cd::fault_text(nullptr, f, sc::Device::cuda(0), "synchronize", std::source_location::current()),
             Catch::Contains("a value out of range (7) in a launch too long ago to name") &&
                 Catch::Contains("[synchronize] at"));
  // A range check's fault (check_range, e.g. cross_entropy's labels): the value, its index, the range.
  cd::FaultSite range;
  range.op = "cross_entropy";
  range.what = "label";
  range.file = "train.cpp";
  range.line = 40;
  range.lo = 0;
  range.hi = 10;
  f.value = 12;
  f.bound = 3;  // the index
  CHECK(cd::fault_text(&range, f, sc::Device::cuda(0), "item", std::source_location::current())
            .rfind("[cross_entropy] label 12 at index 3 is out of range [0, 10) at train.cpp:40; found on cuda:0", 0) == 0);
  // check() of a fault status raises the ValueError (nothing recorded on this device: no site).
  CHECK_THROWS_AS(cd::check(abi::device_fault, sc::Device::cuda(0), "synchronize", std::source_location::current()),
                  sc::ValueError);
}

TEST_CASE("cuda: sc::compile's kernels index with 32 bits only where a grid-stride step cannot overflow", "[cuda]") {
  namespace gpu = sc::staging::gpu;
  constexpr std::int64_t int_max = std::numeric_limits<std::int32_t>::max();
  constexpr std::int64_t grid = gpu::max_blocks * gpu::kernel_block;  // a whole grid's step
  STATIC_REQUIRE(gpu::index32_fits(std::int64_t{1} << 28));              // the benchmarks' 256M elements
  STATIC_REQUIRE(gpu::index32_fits(int_max - grid));                      // the last index plus a step fits
  // 2^31 - 1 elements fit an int, but the step past the last one would not: 64-bit indices.
  STATIC_REQUIRE_FALSE(gpu::index32_fits(int_max - grid + 1));
  STATIC_REQUIRE_FALSE(gpu::index32_fits(int_max));
}
