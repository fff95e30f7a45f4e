// Decoding JPEG (libjpeg-turbo's TurboJPEG API) and PNG (libpng) files into 8-bit RGB as PIL's
// Image.open(path).convert("RGB") does, which torchvision's default ImageFolder loader returns.
// SPDX-License-Identifier: MIT
//
// The decoders exist when ddp is configured with them (target ddp::image, DDP_WITH_IMAGE=1;
// docs/decisions/0039). Without them this header still compiles (code that only names the types
// builds everywhere) and decode_image() throws ConfigError saying how to get them.
//
// Result: DecodedImage{height H, width W, rgb: H*W*3 bytes, row-major, channels-last (R, G, B)}.
// JPEG: TurboJPEG's default decode, which is libjpeg's as PIL uses it, so with the same
// libjpeg-turbo underneath the bytes are identical. Grayscale JPEGs give R = G = B (as
// convert("RGB")); CMYK JPEGs are rejected (TurboJPEG cannot convert them to RGB). PNG: palette
// expanded, gray replicated to RGB, 16-bit samples reduced to their high byte (PIL's "RGB;16B" raw
// mode), alpha dropped without compositing (as convert("RGB") of RGBA/LA). Every failure is an
// IoError naming the file; a decoder never aborts the process.
#pragma once

#include <csetjmp>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <span>
#include <string>
#include <vector>

#include "ddp/core/error.hpp"
#include "ddp/core/str.hpp"

#if defined(DDP_WITH_IMAGE)
#  include <png.h>
#  include <turbojpeg.h>
#endif

namespace ddp::data {

struct DecodedImage {
  std::int64_t height = 0;
  std::int64_t width = 0;
  std::vector<std::uint8_t> rgb;  // (H, W, 3)
};

enum class ImageFormat { kUnknown, kJpeg, kPng };

// Sniffs the format from the first bytes; the extension is not trusted (nor is it by PIL).
inline ImageFormat sniff_image_format(std::span<const std::uint8_t> bytes) {
  if (bytes.size() >= 3 && bytes[0] == 0xFF && bytes[1] == 0xD8 && bytes[2] == 0xFF)
    return ImageFormat::kJpeg;
  static constexpr std::uint8_t kPngMagic[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  if (bytes.size() >= 8 && std::memcmp(bytes.data(), kPngMagic, 8) == 0) return ImageFormat::kPng;
  return ImageFormat::kUnknown;
}

// True when this build has the JPEG and PNG decoders (ddp::image).
inline constexpr bool image_decoders_available() {
#if defined(DDP_WITH_IMAGE)
  return true;
#else
  return false;
#endif
}

// Reads a whole file. Throws IoError naming it when it cannot be opened or read.
inline std::vector<std::uint8_t> read_file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw IoError(ddp::detail::str("ddp: cannot open image file '", path, "' for reading"));
  const std::streamoff n = in.tellg();
  if (n < 0)
    throw IoError(ddp::detail::str("ddp: cannot determine the size of image file '", path, "'"));
  std::vector<std::uint8_t> bytes(static_cast<std::size_t>(n));
  in.seekg(0);
  in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(n));
  if (!in || in.gcount() != n)
    throw IoError(ddp::detail::str("ddp: short read of image file '", path, "'"));
  return bytes;
}

namespace detail {

#if defined(DDP_WITH_IMAGE)
inline DecodedImage decode_jpeg(std::span<const std::uint8_t> bytes, const std::string& path) {
  tjhandle h = tjInitDecompress();
  if (h == nullptr)
    throw IoError(ddp::detail::str("ddp: cannot create a TurboJPEG decompressor for '", path, "'"));
  struct Closer {
    tjhandle h;
    ~Closer() { tjDestroy(h); }
  } closer{h};
  int w = 0, ht = 0, subsamp = 0, colorspace = 0;
  // TurboJPEG 2.x takes a non-const pointer, reads only
  auto* src = const_cast<unsigned char*>(bytes.data());
  const auto size = static_cast<unsigned long>(bytes.size());
  if (tjDecompressHeader3(h, src, size, &w, &ht, &subsamp, &colorspace) != 0)
    throw IoError(ddp::detail::str("ddp: corrupt JPEG file '", path, "': ", tjGetErrorStr2(h)));
  if (colorspace == TJCS_CMYK || colorspace == TJCS_YCCK)
    throw IoError(ddp::detail::str(
        "ddp: JPEG file '", path,
        "' is CMYK/YCCK, which ddp does not convert to RGB; convert it to RGB first"));
  if (w <= 0 || ht <= 0)
    throw IoError(ddp::detail::str("ddp: JPEG file '", path, "' has invalid extents ", w, "x", ht));
  DecodedImage out{.height = ht, .width = w, .rgb = {}};
  out.rgb.resize(static_cast<std::size_t>(w) * static_cast<std::size_t>(ht) * 3);
  // Flags 0: accurate integer IDCT and fancy upsampling, libjpeg's defaults as PIL decodes.
  if (tjDecompress2(h, src, size, out.rgb.data(), w, 0, ht, TJPF_RGB, 0) != 0) {
    // Errors fail; of libjpeg's warnings only a truncated file ("Premature end of JPEG file",
    // decoded grey-padded) fails, as PIL raises "image file is truncated". PIL decodes through the
    // others (e.g. "Corrupt JPEG data: N extraneous bytes before marker"): they pass, as there.
    const std::string msg = tjGetErrorStr2(h);
    if (tjGetErrorCode(h) != TJERR_WARNING || msg.find("Premature end") != std::string::npos)
      throw IoError(ddp::detail::str("ddp: corrupt JPEG file '", path, "': ", msg));
  }
  return out;
}

struct PngReadState {
  std::span<const std::uint8_t> bytes;
  std::size_t pos = 0;
  char message[256] = {};
  std::jmp_buf jump;
};

extern "C" inline void ddp_png_error_(png_structp png, png_const_charp msg) {
  auto* s = static_cast<PngReadState*>(png_get_error_ptr(png));
  std::snprintf(s->message, sizeof(s->message), "%s",
                msg != nullptr ? msg : "unknown libpng error");
  std::longjmp(s->jump, 1);
}
// warnings (e.g. bad sRGB chunk) ignored
extern "C" inline void ddp_png_warning_(png_structp, png_const_charp) {}
extern "C" inline void ddp_png_read_(png_structp png, png_bytep data, png_size_t n) {
  auto* s = static_cast<PngReadState*>(png_get_io_ptr(png));
  if (n > s->bytes.size() - s->pos) png_error(png, "file is truncated");
  std::memcpy(data, s->bytes.data() + s->pos, n);
  s->pos += n;
}

// The libpng part: only trivially destructible objects live in this frame, so a longjmp from an
// error callback skips no destructor; the caller owns `rows` and `out`. False (s.message) on error.
inline bool png_decode_into_(PngReadState& s, std::vector<std::uint8_t>& out,
                             std::vector<png_bytep>& rows, std::int64_t& height,
                             std::int64_t& width) {
  png_structp png =
      png_create_read_struct(PNG_LIBPNG_VER_STRING, &s, ddp_png_error_, ddp_png_warning_);
  if (png == nullptr) {
    std::snprintf(s.message, sizeof(s.message), "cannot create a libpng reader");
    return false;
  }
  png_infop info = png_create_info_struct(png);
  if (info == nullptr) {
    png_destroy_read_struct(&png, nullptr, nullptr);
    std::snprintf(s.message, sizeof(s.message), "cannot create a libpng info struct");
    return false;
  }
  if (setjmp(s.jump) != 0) {
    png_destroy_read_struct(&png, &info, nullptr);
    return false;
  }
  png_set_read_fn(png, &s, ddp_png_read_);
  png_read_info(png, info);
  const png_uint_32 w = png_get_image_width(png, info), h = png_get_image_height(png, info);
  const int color = png_get_color_type(png, info);
  png_set_expand(png);    // palette -> RGB, gray < 8 bit -> 8 bit, tRNS -> alpha (dropped below)
  png_set_strip_16(png);  // high byte, as PIL's "RGB;16B"
  if ((color & PNG_COLOR_MASK_ALPHA) != 0 || png_get_valid(png, info, PNG_INFO_tRNS) != 0)
    png_set_strip_alpha(png);
  if (color == PNG_COLOR_TYPE_GRAY || color == PNG_COLOR_TYPE_GRAY_ALPHA) png_set_gray_to_rgb(png);
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  if (png_get_rowbytes(png, info) != static_cast<std::size_t>(w) * 3)
    png_error(png, "unexpected row layout");
  out.resize(static_cast<std::size_t>(w) * h * 3);
  rows.resize(h);
  for (png_uint_32 y = 0; y < h; ++y) rows[y] = out.data() + static_cast<std::size_t>(y) * w * 3;
  png_read_image(png, rows.data());
  png_read_end(png, nullptr);
  png_destroy_read_struct(&png, &info, nullptr);
  height = h;
  width = w;
  return true;
}

inline DecodedImage decode_png(std::span<const std::uint8_t> bytes, const std::string& path) {
  PngReadState s{.bytes = bytes, .pos = 0, .message = {}, .jump = {}};
  DecodedImage out;
  std::vector<png_bytep> rows;
  if (!png_decode_into_(s, out.rgb, rows, out.height, out.width))
    throw IoError(ddp::detail::str("ddp: corrupt PNG file '", path, "': ", s.message));
  return out;
}
#endif

}  // namespace detail

// Decodes an in-memory JPEG or PNG; `path` names it in errors. Throws IoError (corrupt, truncated
// or other format) or ConfigError (ddp built without ddp::image).
inline DecodedImage decode_image(std::span<const std::uint8_t> bytes, const std::string& path) {
#if defined(DDP_WITH_IMAGE)
  switch (sniff_image_format(bytes)) {
    case ImageFormat::kJpeg: return detail::decode_jpeg(bytes, path);
    case ImageFormat::kPng: return detail::decode_png(bytes, path);
    case ImageFormat::kUnknown: break;
  }
  throw IoError(ddp::detail::str(
      "ddp: image file '", path, "' (", bytes.size(),
      " bytes) is neither JPEG nor PNG (the only formats ddp decodes); it is corrupt "
      "or in another format: convert it, or remove it from the tree"));
#else
  (void)bytes;
  throw ConfigError(
      ddp::detail::str("ddp: cannot decode '", path,
                       "': this build has no JPEG/PNG decoders; install libturbojpeg0-dev and "
                       "libpng-dev, reconfigure (DDP_WITH_IMAGE=AUTO or ON) and link ddp::image"));
#endif
}

inline DecodedImage decode_image_file(const std::string& path) {
  return decode_image(read_file_bytes(path), path);
}

}  // namespace ddp::data
