// conv.cu's elements (kernels/conv_elements.cuh) in 32- and 64-bit indices: the same values for
// every geometry, against plain loops written here; and where 32 bits are enough. The GPU kernels
// and the CUDA emulator call these functions; the emulated tests check them against the CPU's
// convolutions, with the index type conv_fits_int32 picks (32 bits at the tests' sizes).
#include "testing.hpp"

#include <cmath>
#include <cstdint>
#include <vector>

#include "../../kernels/conv_elements.cuh"

namespace {

namespace k = sc::cuda::kernels;
using Geo = sc::cuda::abi::ConvGeometry;

Geo geometry(std::int64_t N, std::int64_t C, std::int64_t H, std::int64_t W, std::int64_t kh, std::int64_t kw,
             std::int64_t stride, std::int64_t pad) {
  Geo g{N, C, H, W, kh, kw, stride, pad, 0, 0};
  g.Ho = (H + 2 * pad - kh) / stride + 1;
  g.Wo = (W + 2 * pad - kw) / stride + 1;
  return g;
}

/// x[n, c, iy, ix], 0 outside the image.
double pixel(const std::vector<double>& x, const Geo& g, std::int64_t n, std::int64_t c, std::int64_t iy, std::int64_t ix) {
  if (iy < 0 || iy >= g.H || ix < 0 || ix >= g.W) return 0;
  return x[static_cast<std::size_t>(((n * g.C + c) * g.H + iy) * g.W + ix)];
}

}  // namespace

TEST_CASE("cuda conv elements: 32- and 64-bit indices give the plain loops' columns, images and pools", "[cuda][conv]") {
  for (const Geo& g : {geometry(2, 3, 7, 6, 3, 3, 1, 1), geometry(2, 2, 9, 8, 3, 2, 2, 0), geometry(1, 4, 8, 8, 2, 2, 2, 0),
                       geometry(3, 1, 5, 7, 1, 3, 3, 2)}) {
    INFO("N C H W " << g.N << " " << g.C << " " << g.H << " " << g.W << ", kernel " << g.kh << "x" << g.kw << ", stride "
                    << g.stride << ", pad " << g.pad);
    REQUIRE(k::conv_fits_int32(g));
    const auto d32 = k::ConvDims<std::int32_t>::of(g);
    const auto d64 = k::ConvDims<std::int64_t>::of(g);
    std::vector<double> x(static_cast<std::size_t>(g.N * g.C * g.H * g.W));
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = std::sin(0.7 * static_cast<double>(i)) + (i % 5 == 0 ? 1.0 : 0.0);  // (ties)
    // im2col: (n, c*kh*kw + i*kw + j, oy*Wo + ox); col2im: each column entry added back to the
    // pixel it read
    const std::int64_t L = g.Ho * g.Wo, kk = g.kh * g.kw, ncol = g.N * g.C * kk * L;
    std::vector<double> col(static_cast<std::size_t>(ncol)), img(x.size(), 0.0);
    for (std::int64_t n = 0, e = 0; n < g.N; ++n)
      for (std::int64_t c = 0; c < g.C; ++c)
        for (std::int64_t i = 0; i < g.kh; ++i)
          for (std::int64_t j = 0; j < g.kw; ++j)
            for (std::int64_t oy = 0; oy < g.Ho; ++oy)
              for (std::int64_t ox = 0; ox < g.Wo; ++ox, ++e) {
                const std::int64_t iy = oy * g.stride - g.pad + i, ix = ox * g.stride - g.pad + j;
                const double want = pixel(x, g, n, c, iy, ix);
                col[static_cast<std::size_t>(e)] = want;
                CHECK(k::im2col_element(x.data(), d32, static_cast<std::int32_t>(e)) == want);
                CHECK(k::im2col_element(x.data(), d64, e) == want);
                if (iy >= 0 && iy < g.H && ix >= 0 && ix < g.W) img[static_cast<std::size_t>(((n * g.C + c) * g.H + iy) * g.W + ix)] += want;
              }
    for (std::int64_t e = 0; e < static_cast<std::int64_t>(img.size()); ++e) {
      CHECK(k::col2im_element(col.data(), d32, static_cast<std::int32_t>(e)) == Approx(img[static_cast<std::size_t>(e)]));
      CHECK(k::col2im_element(col.data(), d64, e) == k::col2im_element(col.data(), d32, static_cast<std::int32_t>(e)));
    }
    if (g.pad != 0) continue;  // (the pools take windows inside the image)
    // pools, and the max pool's gradient: each window's gradient to its first largest pixel
    std::vector<double> gy(static_cast<std::size_t>(g.N * g.C * L)), dx(x.size(), 0.0);
    for (std::size_t i = 0; i < gy.size(); ++i) gy[i] = 1.0 + static_cast<double>(i);
    for (std::int64_t nc = 0, e = 0; nc < g.N * g.C; ++nc)
      for (std::int64_t oy = 0; oy < g.Ho; ++oy)
        for (std::int64_t ox = 0; ox < g.Wo; ++ox, ++e) {
          double m = -1e300, sum = 0;
          std::int64_t at = -1;
          for (std::int64_t i = 0; i < g.kh; ++i)
            for (std::int64_t j = 0; j < g.kw; ++j) {
              const std::int64_t p = (nc * g.H + oy * g.stride + i) * g.W + ox * g.stride + j;
              const double v = x[static_cast<std::size_t>(p)];
              sum += v;
              if (v > m) m = v, at = p;
            }
          dx[static_cast<std::size_t>(at)] += gy[static_cast<std::size_t>(e)];
          for (const bool is_max : {true, false}) {
            const double want = is_max ? m : sum / static_cast<double>(kk);
            CHECK(k::pool2d_element(is_max, x.data(), d32, static_cast<std::int32_t>(e)) == Approx(want));
            CHECK(k::pool2d_element(is_max, x.data(), d64, e) == k::pool2d_element(is_max, x.data(), d32, static_cast<std::int32_t>(e)));
          }
        }
    for (std::int64_t e = 0; e < static_cast<std::int64_t>(x.size()); ++e) {
      CHECK(k::max_pool2d_grad_element(gy.data(), x.data(), d32, static_cast<std::int32_t>(e)) == dx[static_cast<std::size_t>(e)]);
      CHECK(k::max_pool2d_grad_element(gy.data(), x.data(), d64, e) == dx[static_cast<std::size_t>(e)]);
    }
  }
}

TEST_CASE("cuda conv elements: 32-bit indices only where every tensor's indices fit", "[cuda][conv]") {
  CHECK(k::conv_fits_int32(geometry(128, 32, 28, 28, 3, 3, 1, 1)));    // the example's CNN: 7.2M column elements
  CHECK(k::conv_fits_int32(geometry(1024, 64, 32, 32, 3, 3, 1, 1)));   // 604M
  CHECK_FALSE(k::conv_fits_int32(geometry(2048, 64, 32, 32, 3, 3, 1, 1)));  // columns 1.2G
  CHECK_FALSE(k::conv_fits_int32(geometry(1, 1, 40000, 40000, 1, 1, 1, 0)));  // the image 1.6G
  CHECK_FALSE(k::conv_fits_int32(geometry(1 << 16, 1 << 15, 1, 1, 1, 1, 1, 0)));  // N * C 2^31
}
