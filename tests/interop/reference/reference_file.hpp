// Test support: runs a reference script (make_*_reference.py) once and reads the tensors it wrote.
// SPDX-License-Identifier: MIT
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>
#include <ddp/tensor/tensor.hpp>

namespace ddp::test {

struct RefTensor {
  std::vector<std::int64_t> dims;
  std::vector<double> f;        // kind 0
  std::vector<std::int64_t> i;  // kind 1
  std::int64_t numel() const {
    std::int64_t n = 1;
    for (auto d : dims) n *= d;
    return n;
  }
};

class RefFile {
 public:
  // Runs `script` with an output path in the build dir (then `more_args`, e.g. a second output's path); exits the
  // test program with 77 (skip) when the script does, e.g. because torch is missing.
  static RefFile generate(const std::string& script_name, const std::string& more_args = "") {
    const std::string out =
        std::string(DDP_REFERENCE_OUT) + "/" + script_name + "." + std::to_string(::getpid()) + ".bin";
    const std::string cmd = std::string(DDP_TEST_PYTHON) + " " + DDP_REFERENCE_DIR + "/" + script_name + " " + out +
                            (more_args.empty() ? "" : " " + more_args);
    const int rc = std::system(cmd.c_str());
    const int code = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
    if (code == 77) {
      std::printf("SKIP: %s could not run (see its message above)\n", script_name.c_str());
      std::fflush(stdout);
      std::exit(77);
    }
    if (code != 0) throw std::runtime_error("reference script failed: " + cmd + " (exit " + std::to_string(code) + ")");
    RefFile r = read(out);
    std::remove(out.c_str());
    return r;
  }

  static RefFile read(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) throw std::runtime_error("cannot open " + path);
    RefFile r;
    for (;;) {
      std::uint32_t len = 0;
      if (!in.read(reinterpret_cast<char*>(&len), 4)) break;
      std::string name(len, '\0');
      in.read(name.data(), len);
      std::uint8_t kind = 0;
      std::uint32_t rank = 0;
      in.read(reinterpret_cast<char*>(&kind), 1);
      in.read(reinterpret_cast<char*>(&rank), 4);
      RefTensor t;
      t.dims.resize(rank);
      in.read(reinterpret_cast<char*>(t.dims.data()), static_cast<std::streamsize>(rank * 8));
      const auto n = static_cast<std::size_t>(t.numel());
      if (kind == 0) {
        t.f.resize(n);
        in.read(reinterpret_cast<char*>(t.f.data()), static_cast<std::streamsize>(n * 8));
      } else {
        t.i.resize(n);
        in.read(reinterpret_cast<char*>(t.i.data()), static_cast<std::streamsize>(n * 8));
      }
      if (!in) throw std::runtime_error("truncated reference file " + path + " at " + name);
      r.m_.emplace(name, std::move(t));
    }
    return r;
  }

  bool has(const std::string& name) const { return m_.count(name) != 0; }
  const RefTensor& at(const std::string& name) const {
    auto it = m_.find(name);
    if (it == m_.end()) throw std::runtime_error("reference data has no tensor " + name);
    return it->second;
  }
  std::int64_t int_at(const std::string& name, std::size_t k = 0) const { return at(name).i.at(k); }
  double float_at(const std::string& name, std::size_t k = 0) const { return at(name).f.at(k); }

 private:
  std::map<std::string, RefTensor> m_;
};

// A reference tensor in ddp's layout: 4-D NCHW/OIHW becomes NHWC/KRSC; other ranks are copied as is.
template <class T = float>
Tensor<T, Cpu> to_ddp_layout(const RefTensor& r) {
  if (r.dims.size() == 4) {
    const std::int64_t n = r.dims[0], c = r.dims[1], h = r.dims[2], w = r.dims[3];
    auto t = Tensor<T, Cpu>::empty({n, h, w, c});
    for (std::int64_t a = 0; a < n; ++a)
      for (std::int64_t b = 0; b < c; ++b)
        for (std::int64_t y = 0; y < h; ++y)
          for (std::int64_t x = 0; x < w; ++x)
            t(a, y, x, b) = static_cast<T>(r.f[static_cast<std::size_t>(((a * c + b) * h + y) * w + x)]);
    return t;
  }
  Shape s;
  switch (r.dims.size()) {
    case 1:
      s = Shape{r.dims[0]};
      break;
    case 2:
      s = Shape{r.dims[0], r.dims[1]};
      break;
    case 3:
      s = Shape{r.dims[0], r.dims[1], r.dims[2]};
      break;
    default:
      throw std::runtime_error("unsupported reference rank");
  }
  auto t = Tensor<T, Cpu>::empty(s);
  for (std::int64_t k = 0; k < t.numel(); ++k) t.data()[k] = static_cast<T>(r.f[static_cast<std::size_t>(k)]);
  return t;
}

}  // namespace ddp::test
