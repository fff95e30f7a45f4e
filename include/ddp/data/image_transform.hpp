// torchvision 0.14's ImageNet transforms on 8-bit RGB (PIL) images:
//   train: RandomResizedCrop(size, scale=(0.08, 1), ratio=(3/4, 4/3)) + RandomHorizontalFlip()
//          + ToTensor + Normalize
//   eval:  Resize(resize) + CenterCrop(size) + ToTensor + Normalize
// SPDX-License-Identifier: MIT
//
// Resizing is PIL's bilinear resampling (libImaging/Resample.c) bit for bit: a triangle filter
// widened by the downscale factor (PIL's antialiasing), 22-bit fixed-point coefficients normalised
// per output pixel, a horizontal then a vertical pass, each rounding to uint8, a pass skipped when
// its axis is unchanged. Python's round() (half to even) is std::nearbyint. ToTensor + Normalize
// compute (v / 255 - mean[c]) / std[c] in float32, two divisions, so the floats equal
// torchvision's. Random choices come from a ddp Generator: the procedure is torchvision's, the
// random numbers are not torch's, so compare crops by their parameters.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"
#include "ddp/data/image_decode.hpp"
#include "ddp/tensor/random.hpp"

namespace ddp::data {

// A crop window of the source image (rows [top, top + height), columns [left, left + width)) and
// whether the result is mirrored; torchvision's (i, j, h, w) plus RandomHorizontalFlip's coin.
struct CropParams {
  std::int64_t top = 0;
  std::int64_t left = 0;
  std::int64_t height = 0;
  std::int64_t width = 0;
  bool flip = false;
  friend bool operator==(const CropParams&, const CropParams&) = default;
};

namespace detail {

inline constexpr int kPilPrecisionBits = 32 - 8 - 2;  // Resample.c's PRECISION_BITS

// Resample.c's precompute_coeffs() + normalize_coeffs_8bpc() for the bilinear filter over input
// [in0, in1) of an axis of `in_size` pixels to `out_size` pixels. bounds: (xmin, count) per output.
struct PilCoeffs {
  int ksize = 0;
  std::vector<int> bounds;  // (out_size, 2)
  std::vector<int> k;       // (out_size, ksize), fixed point
};

inline PilCoeffs pil_bilinear_coeffs(int in_size, double in0, double in1, int out_size) {
  const double scale = (in1 - in0) / out_size;
  const double filterscale = scale < 1.0 ? 1.0 : scale;
  const double support = 1.0 * filterscale;
  PilCoeffs c;
  c.ksize = static_cast<int>(std::ceil(support)) * 2 + 1;
  c.bounds.resize(static_cast<std::size_t>(out_size) * 2);
  c.k.assign(static_cast<std::size_t>(out_size) * static_cast<std::size_t>(c.ksize), 0);
  std::vector<double> kk(static_cast<std::size_t>(c.ksize));
  for (int xx = 0; xx < out_size; ++xx) {
    const double center = in0 + (xx + 0.5) * scale;
    const double ss = 1.0 / filterscale;
    int xmin = static_cast<int>(center - support + 0.5);
    if (xmin < 0) xmin = 0;
    int xmax = static_cast<int>(center + support + 0.5);
    if (xmax > in_size) xmax = in_size;
    xmax -= xmin;
    double ww = 0.0;
    for (int x = 0; x < xmax; ++x) {
      double t = (x + xmin - center + 0.5) * ss;
      if (t < 0.0) t = -t;
      const double w = t < 1.0 ? 1.0 - t : 0.0;
      kk[static_cast<std::size_t>(x)] = w;
      ww += w;
    }
    for (int x = 0; x < c.ksize; ++x) {
      double v = x < xmax ? kk[static_cast<std::size_t>(x)] : 0.0;
      if (x < xmax && ww != 0.0) v /= ww;
      const double f = v * (1 << kPilPrecisionBits);
      c.k[static_cast<std::size_t>(xx) * static_cast<std::size_t>(c.ksize) +
          static_cast<std::size_t>(x)] =
          v < 0 ? static_cast<int>(-0.5 + f) : static_cast<int>(0.5 + f);
    }
    c.bounds[static_cast<std::size_t>(xx) * 2] = xmin;
    c.bounds[static_cast<std::size_t>(xx) * 2 + 1] = xmax;
  }
  return c;
}

inline std::uint8_t pil_clip8(int v) {
  const int s = v >> kPilPrecisionBits;
  return static_cast<std::uint8_t>(s < 0 ? 0 : (s > 255 ? 255 : s));
}

}  // namespace detail

// PIL's img.crop((left, top, left + w, top + h)).resize((out_w, out_h), Image.BILINEAR) of src
// (src_h, src_w, 3) -> (out_h, out_w, 3) bytes; the window must lie inside the image.
inline std::vector<std::uint8_t> resize_bilinear_pil(std::span<const std::uint8_t> src,
                                                     std::int64_t src_h, std::int64_t src_w,
                                                     CropParams window, std::int64_t out_h,
                                                     std::int64_t out_w) {
  if (window.top < 0 || window.left < 0 || window.height <= 0 || window.width <= 0 ||
      window.top + window.height > src_h || window.left + window.width > src_w || out_h <= 0 ||
      out_w <= 0 || static_cast<std::int64_t>(src.size()) != src_h * src_w * 3)
    throw ValueError(ddp::detail::str(
        "ddp: resize window (top ", window.top, ", left ", window.left, ", ", window.height, "x",
        window.width, ") -> ", out_h, "x", out_w, " does not fit an image of ", src_h, "x", src_w));
  const auto in_w = static_cast<int>(window.width), in_h = static_cast<int>(window.height);
  const auto ow = static_cast<int>(out_w), oh = static_cast<int>(out_h);
  const std::size_t src_row = static_cast<std::size_t>(src_w) * 3;
  const std::uint8_t* base = src.data() + static_cast<std::size_t>(window.top) * src_row +
                             static_cast<std::size_t>(window.left) * 3;
  const bool need_h = ow != in_w, need_v = oh != in_h;  // box is (0, 0, w, h) of the crop
  const detail::PilCoeffs ch = detail::pil_bilinear_coeffs(in_w, 0.0, in_w, ow);
  detail::PilCoeffs cv = detail::pil_bilinear_coeffs(in_h, 0.0, in_h, oh);
  // Horizontal pass over the source rows the vertical pass uses: (rows, ow, 3) in `tmp`.
  const int y_first = cv.bounds[0];
  const int y_last = cv.bounds[static_cast<std::size_t>(oh) * 2 - 2] +
                     cv.bounds[static_cast<std::size_t>(oh) * 2 - 1];
  std::vector<std::uint8_t> tmp;
  const std::uint8_t* cur = base;
  std::size_t cur_row = src_row;
  int cur_w = in_w;
  if (need_h) {
    for (int i = 0; i < oh; ++i) cv.bounds[static_cast<std::size_t>(i) * 2] -= y_first;
    const int rows = y_last - y_first;
    tmp.resize(static_cast<std::size_t>(rows) * static_cast<std::size_t>(ow) * 3);
    for (int y = 0; y < rows; ++y) {
      const std::uint8_t* in = base + static_cast<std::size_t>(y + y_first) * src_row;
      std::uint8_t* out =
          tmp.data() + static_cast<std::size_t>(y) * static_cast<std::size_t>(ow) * 3;
      for (int xx = 0; xx < ow; ++xx) {
        const int xmin = ch.bounds[static_cast<std::size_t>(xx) * 2],
                  xn = ch.bounds[static_cast<std::size_t>(xx) * 2 + 1];
        const int* k =
            ch.k.data() + static_cast<std::size_t>(xx) * static_cast<std::size_t>(ch.ksize);
        int s0 = 1 << (detail::kPilPrecisionBits - 1), s1 = s0, s2 = s0;
        for (int x = 0; x < xn; ++x) {
          const std::uint8_t* p = in + static_cast<std::size_t>(x + xmin) * 3;
          s0 += p[0] * k[x];
          s1 += p[1] * k[x];
          s2 += p[2] * k[x];
        }
        out[xx * 3 + 0] = detail::pil_clip8(s0);
        out[xx * 3 + 1] = detail::pil_clip8(s1);
        out[xx * 3 + 2] = detail::pil_clip8(s2);
      }
    }
    cur = tmp.data();
    cur_row = static_cast<std::size_t>(ow) * 3;
    cur_w = ow;
  }
  std::vector<std::uint8_t> out(static_cast<std::size_t>(oh) * static_cast<std::size_t>(ow) * 3);
  if (need_v) {
    for (int yy = 0; yy < oh; ++yy) {
      const int ymin = cv.bounds[static_cast<std::size_t>(yy) * 2],
                yn = cv.bounds[static_cast<std::size_t>(yy) * 2 + 1];
      const int* k =
          cv.k.data() + static_cast<std::size_t>(yy) * static_cast<std::size_t>(cv.ksize);
      std::uint8_t* o =
          out.data() + static_cast<std::size_t>(yy) * static_cast<std::size_t>(ow) * 3;
      for (int xx = 0; xx < cur_w * 3; ++xx) {
        int s = 1 << (detail::kPilPrecisionBits - 1);
        for (int y = 0; y < yn; ++y)
          s += cur[static_cast<std::size_t>(y + ymin) * cur_row + static_cast<std::size_t>(xx)] *
               k[y];
        o[xx] = detail::pil_clip8(s);
      }
    }
  } else {
    // Rows of `cur` are the output rows (offset by y_first = 0 when no vertical pass is needed).
    for (int y = 0; y < oh; ++y)
      std::copy_n(cur + static_cast<std::size_t>(y) * cur_row, static_cast<std::size_t>(ow) * 3,
                  out.data() + static_cast<std::size_t>(y) * static_cast<std::size_t>(ow) * 3);
  }
  return out;
}

// Uniform double in [lo, hi) from 53 random bits.
inline double uniform_real(Generator& g, double lo, double hi) {
  return lo + (hi - lo) * static_cast<double>(g.next_u64() >> 11) * 0x1p-53;
}

// RandomResizedCrop.get_params: up to 10 tries of a random area fraction in [scale_lo, scale_hi]
// and a log-uniform ratio in [ratio_lo, ratio_hi]; the first window that fits wins, at a uniform
// offset; otherwise the central crop clamped to the ratio range.
inline CropParams random_resized_crop_params(std::int64_t height, std::int64_t width,
                                             double scale_lo, double scale_hi, double ratio_lo,
                                             double ratio_hi, Generator& g) {
  const double area = static_cast<double>(height) * static_cast<double>(width);
  const double log_lo = std::log(ratio_lo), log_hi = std::log(ratio_hi);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target_area = area * uniform_real(g, scale_lo, scale_hi);
    const double aspect = std::exp(uniform_real(g, log_lo, log_hi));
    const auto w = static_cast<std::int64_t>(std::nearbyint(std::sqrt(target_area * aspect)));
    const auto h = static_cast<std::int64_t>(std::nearbyint(std::sqrt(target_area / aspect)));
    if (0 < w && w <= width && 0 < h && h <= height) {
      const auto i =
          static_cast<std::int64_t>(g.uniform_int(static_cast<std::uint64_t>(height - h + 1)));
      const auto j =
          static_cast<std::int64_t>(g.uniform_int(static_cast<std::uint64_t>(width - w + 1)));
      return {.top = i, .left = j, .height = h, .width = w, .flip = false};
    }
  }
  const double in_ratio = static_cast<double>(width) / static_cast<double>(height);
  std::int64_t w = width, h = height;
  if (in_ratio < std::min(ratio_lo, ratio_hi)) {
    h = static_cast<std::int64_t>(
        std::nearbyint(static_cast<double>(w) / std::min(ratio_lo, ratio_hi)));
  } else if (in_ratio > std::max(ratio_lo, ratio_hi)) {
    w = static_cast<std::int64_t>(
        std::nearbyint(static_cast<double>(h) * std::max(ratio_lo, ratio_hi)));
  }
  return {.top = (height - h) / 2, .left = (width - w) / 2, .height = h, .width = w, .flip = false};
}

// Resize(size) with an int: the shorter side becomes `size`, the longer int(size * long / short)
// (truncated, as torchvision). Returns (new_h, new_w).
inline std::pair<std::int64_t, std::int64_t> resize_shorter_extents(std::int64_t h, std::int64_t w,
                                                                    std::int64_t size) {
  const std::int64_t s = std::min(h, w), l = std::max(h, w);
  const auto nl = static_cast<std::int64_t>(static_cast<double>(size) * static_cast<double>(l) /
                                            static_cast<double>(s));
  return w <= h ? std::pair{nl, size} : std::pair{size, nl};
}

// CenterCrop's offset on an axis of `extent` pixels: round((extent - crop) / 2), half to even;
// negative when the image is smaller (torchvision pads (crop - extent) // 2 zeros first).
inline std::int64_t center_crop_offset(std::int64_t extent, std::int64_t crop) {
  if (crop > extent) return -((crop - extent) / 2);
  return static_cast<std::int64_t>(std::nearbyint(static_cast<double>(extent - crop) / 2.0));
}

// ToTensor + Normalize of the (h, w, 3) byte window at (top, left) of src (src_h, src_w, 3) into
// out (h, w, 3) floats, mirrored when flip; pixels outside src are 0 (CenterCrop's padding).
inline void normalize_rgb(std::span<const std::uint8_t> src, std::int64_t src_h, std::int64_t src_w,
                          std::int64_t top, std::int64_t left, std::int64_t h, std::int64_t w,
                          bool flip, const float* mean, const float* stdev, std::span<float> out) {
  float* o = out.data();
  for (std::int64_t y = 0; y < h; ++y) {
    const std::int64_t sy = y + top;
    for (std::int64_t x = 0; x < w; ++x) {
      const std::int64_t sx = (flip ? w - 1 - x : x) + left;
      const bool inside = sy >= 0 && sy < src_h && sx >= 0 && sx < src_w;
      const std::size_t at = inside ? static_cast<std::size_t>((sy * src_w + sx) * 3) : 0;
      for (std::size_t c = 0; c < 3; ++c) {
        const float v = inside ? static_cast<float>(src[at + c]) : 0.0f;
        *o++ = (v / 255.0f - mean[c]) / stdev[c];
      }
    }
  }
}

}  // namespace ddp::data
