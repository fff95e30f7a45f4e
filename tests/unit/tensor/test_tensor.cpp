// tensor: Shape, Storage, Tensor, TensorView, copies.
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>

#include <cstdint>
#include <type_traits>

#include <ddp/core/dtype.hpp>
#include <ddp/tensor/copy.hpp>
#include <ddp/tensor/device.hpp>
#include <ddp/tensor/shape.hpp>
#include <ddp/tensor/storage.hpp>
#include <ddp/tensor/tensor.hpp>
#include <ddp/tensor/view.hpp>

using ddp::Cpu;
using ddp::Shape;
using ddp::Tensor;
using ddp::TensorView;

static_assert(ddp::Device<Cpu> && ddp::Device<ddp::Cuda> && !ddp::Device<int>);
static_assert(!std::is_copy_constructible_v<Tensor<float, Cpu>> &&
              std::is_nothrow_move_constructible_v<Tensor<float, Cpu>>);
static_assert(!std::is_copy_assignable_v<ddp::Storage<Cpu>>);
static_assert(std::is_convertible_v<TensorView<float, Cpu>, TensorView<const float, Cpu>>);
static_assert(!std::is_convertible_v<TensorView<const float, Cpu>, TensorView<float, Cpu>>);
static_assert(std::is_trivially_copyable_v<TensorView<float, Cpu>>);

TEST_SUITE("tensor") {
  TEST_CASE("Shape: numel in int64, strides, indexing from the end, printing, equality") {
    const Shape s{16, 224, 224, 3};
    CHECK(s.rank() == 4);
    CHECK(s.numel() == 16 * 224 * 224 * 3);
    CHECK(s[-1] == 3);
    CHECK(s[0] == 16);
    CHECK(s.stride(0) == 224 * 224 * 3);
    CHECK(s.stride(3) == 1);
    CHECK(s.to_string() == "(16, 224, 224, 3)");
    CHECK(Shape{}.numel() == 1);
    CHECK(Shape{}.to_string() == "()");
    CHECK(Shape{3, 0}.numel() == 0);
    CHECK(Shape{1 << 20, 1 << 20, 4}.numel() == (std::int64_t{1} << 42));  // no 32-bit overflow
    CHECK(Shape{2, 3} == Shape{2, 3});
    CHECK_FALSE(Shape{2, 3} == Shape{3, 2});
    CHECK_FALSE(Shape{2} == Shape{2, 1});
  }

  TEST_CASE("Shape rejects bad dimensions with clear messages") {
    CHECK_THROWS_WITH_AS((Shape{1, 2, 3, 4, 5, 6}), "ddp: a Shape has at most 5 dimensions, got 6", ddp::ValueError);
    CHECK_THROWS_WITH_AS((Shape{2, -1}), "ddp: Shape dimensions must be >= 0, got -1 in a shape of rank 2",
                         ddp::ValueError);
    CHECK_THROWS_AS(Shape({2, 3})[2], ddp::ValueError);
  }

  TEST_CASE("Storage is 64-byte aligned, move-only and frees on move-assign") {
    ddp::Storage<Cpu> a(100);
    CHECK(reinterpret_cast<std::uintptr_t>(a.data()) % 64 == 0);
    CHECK(a.bytes() == 100);
    void* p = a.data();
    ddp::Storage<Cpu> b(std::move(a));
    CHECK(b.data() == p);
    CHECK(a.data() == nullptr);  // NOLINT: testing the moved-from state
    ddp::Storage<Cpu> c(8);
    c = std::move(b);
    CHECK(c.data() == p);
    CHECK(ddp::Storage<Cpu>(0).data() == nullptr);
  }

  TEST_CASE("Allocator<Cpu>: a freed block serves the next request of its size class without malloc") {
    // A size no other test in this binary uses, so its size class starts empty.
    constexpr std::size_t kBytes = 3'333'333;
    const ddp::MemoryStats before = ddp::cpu_memory_stats();
    void* first = nullptr;
    {
      ddp::Storage<Cpu> a(kBytes);
      first = a.data();
      CHECK(reinterpret_cast<std::uintptr_t>(first) % 64 == 0);
    }
    const ddp::MemoryStats warm = ddp::cpu_memory_stats();
    ddp::Storage<Cpu> b(kBytes - 1000);  // same class (round_size), so the cached block comes back
    const ddp::MemoryStats after = ddp::cpu_memory_stats();
    if constexpr (ddp::BuildConfig::cpu_caching) {
      CHECK(warm.device_mallocs == before.device_mallocs + 1);
      CHECK(b.data() == first);
      CHECK(after.device_mallocs == warm.device_mallocs);
      CHECK(after.current_bytes == before.current_bytes + ddp::detail::HostPool::round_size(kBytes));
      CHECK(after.reserved_bytes >= after.current_bytes);
      CHECK(ddp::release_cached_cpu_memory() < after.reserved_bytes);  // b's block stays: it is in use
      CHECK(ddp::cpu_memory_stats().reserved_bytes >= after.current_bytes);
    } else {  // DDP_CPU_CACHING=0 (ASan builds): plain aligned_alloc, nothing counted
      CHECK(after.device_mallocs == 0);
      CHECK(after.reserved_bytes == 0);
    }
  }

  TEST_CASE("Tensor factories, element access in NHWC order and views") {
    auto z = Tensor<float, Cpu>::zeros({2, 3, 4, 5});
    CHECK(z.numel() == 120);
    CHECK(z.bytes() == 480);
    for (float v : z.view()) CHECK(v == 0.f);
    auto t = Tensor<float, Cpu>::from({2, 3}, {1, 2, 3, 4, 5, 6});
    CHECK(t(1, 0) == 4.f);
    CHECK(t.view()(0, 2) == 3.f);
    t(1, 2) = 9.f;
    CHECK(t.data()[5] == 9.f);
    auto f = Tensor<double, Cpu>::full({3}, 2.5);
    CHECK(f(2) == 2.5);
    CHECK(Tensor<float, Cpu>::dtype() == ddp::DType::F32);
    CHECK(Tensor<ddp::bfloat16, Cpu>::dtype() == ddp::DType::BF16);

    TensorView<const float, Cpu> cv = t.view();  // implicit const conversion
    CHECK(cv.data() == t.data());
    CHECK(cv.shape() == Shape{2, 3});
    auto flat = t.view().reshape({6});
    CHECK(flat[5] == 9.f);
    auto row = t.view().slice(1, 2);
    CHECK(row.shape() == Shape{1, 3});
    CHECK(row(0, 0) == 4.f);
    TensorView<float, Cpu> empty;
    CHECK(empty.empty());
    CHECK(empty.numel() == 0);
    Tensor<float, Cpu> none;
    CHECK(none.empty());
    CHECK(none.view().empty());
  }

  TEST_CASE("Tensor moves leave an empty tensor; clone copies") {
    auto a = Tensor<float, Cpu>::from({2}, {1, 2});
    const float* p = a.data();
    Tensor<float, Cpu> b = std::move(a);
    CHECK(b.data() == p);
    CHECK(a.empty());  // NOLINT: moved-from state is defined: empty
    CHECK(a.numel() == 0);
    auto c = b.clone();
    CHECK(c.data() != b.data());
    CHECK(c(1) == 2.f);
    Tensor<float, Cpu> d;
    d = std::move(c);
    CHECK(d(0) == 1.f);
  }

  TEST_CASE("Tensor and view errors name the shapes") {
    CHECK_THROWS_WITH_AS((Tensor<float, Cpu>::from({2, 2}, {1, 2, 3})),
                         "ddp: Tensor::from: shape (2, 2) holds 4 elements but 3 values were given", ddp::ValueError);
    auto t = Tensor<float, Cpu>::zeros({2, 3});
    CHECK_THROWS_WITH_AS(t.reshape({4}), "ddp: cannot reshape a tensor of (2, 3) (6 elements) to (4) (4 elements)",
                         ddp::ValueError);
    CHECK_THROWS_WITH_AS(t.view().reshape({5}), "ddp: cannot reshape a view of (2, 3) (6 elements) to (5) (5 elements)",
                         ddp::ValueError);
    t.reshape({3, 2});
    CHECK(t.shape() == Shape{3, 2});
    CHECK_THROWS_AS(t.view().slice(2, 4), ddp::ValueError);
    CHECK_THROWS_AS((TensorView<float, Cpu>(nullptr, Shape{2})), ddp::ValueError);
  }

  TEST_CASE("copy, convert and to<Cpu> are explicit deep copies") {
    auto a = Tensor<float, Cpu>::from({2, 2}, {1.f, -2.f, 3.5f, 1.00390625f});
    auto b = Tensor<float, Cpu>::zeros({2, 2});
    ddp::copy<float>(a.view(), b.view());
    CHECK(b(1, 0) == 3.5f);
    auto wrong = Tensor<float, Cpu>::zeros({4});
    CHECK_THROWS_WITH_AS(ddp::copy<float>(a.view(), wrong.view()),
                         "ddp: copy: source shape (2, 2) differs from destination shape (4); reshape one of the views",
                         ddp::ValueError);
    auto h = Tensor<ddp::bfloat16, Cpu>::empty({2, 2});
    ddp::convert<float, ddp::bfloat16>(a.view(), h.view());
    CHECK(static_cast<float>(h(0, 1)) == -2.f);
    CHECK(static_cast<float>(h(1, 1)) == 1.f);  // 1 + 2^-8 is a tie between 1 and 1 + 2^-7: rounds to even
    auto back = Tensor<double, Cpu>::empty({2, 2});
    ddp::convert<ddp::bfloat16, double>(h.view(), back.view());
    CHECK(back(1, 0) == 3.5);
    ddp::Exec<Cpu> exec;
    auto c = ddp::to<Cpu>(a.view(), exec);
    CHECK(c.data() != a.data());
    CHECK(c(0, 1) == -2.f);
  }
}
