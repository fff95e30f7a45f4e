// core/host_memory.hpp: alignment, and the huge-page advice of large blocks checked in the kernel's own record
// of the mapping (/proc/self/smaps VmFlags "hg" = MADV_HUGEPAGE).
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>
#include <sys/mman.h>

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>

#include "ddp/core/host_memory.hpp"
#include "ddp/tensor/tensor.hpp"

using namespace ddp;

namespace {

// The VmFlags of the mapping that holds `p`, from /proc/self/smaps; empty when not found.
std::string vm_flags_at(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  const auto addr = reinterpret_cast<std::uintptr_t>(p);
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    std::uintptr_t lo = 0, hi = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> lo >> dash >> hi && dash == '-') {  // a mapping's first line: "lo-hi perms ..."
      inside = lo <= addr && addr < hi;
      continue;
    }
    if (inside && line.rfind("VmFlags:", 0) == 0) return line;
  }
  return {};
}

bool has_flag(const std::string& vm_flags, const std::string& flag) {
  std::istringstream words(vm_flags);
  std::string w;
  while (words >> w)
    if (w == flag) return true;
  return false;
}

// madvise(MADV_HUGEPAGE) is accepted: Linux with transparent huge pages built in and not set to "never".
bool thp_available() {
  std::ifstream mode("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string text;
  return std::getline(mode, text) && text.find("[never]") == std::string::npos;
}

}  // namespace

TEST_SUITE("core") {
  TEST_CASE("host_alloc: 64-byte aligned at every size; HostVector uses it") {
    for (std::size_t bytes : {std::size_t{1}, std::size_t{63}, std::size_t{4096}, kHugePageAdviceBytes + 3}) {
      CAPTURE(bytes);
      void* p = host_alloc(bytes);
      REQUIRE(p != nullptr);
      CHECK(reinterpret_cast<std::uintptr_t>(p) % kHostAlignment == 0);
      host_free(p);
    }
    HostVector<float> v(1000, 2.0f);
    CHECK(reinterpret_cast<std::uintptr_t>(v.data()) % kHostAlignment == 0);
    CHECK(v[999] == 2.0f);
  }

  TEST_CASE("advise_huge_pages marks exactly the whole pages inside the range") {
    if (!thp_available()) {
      MESSAGE("transparent huge pages unavailable here (/sys/kernel/mm/transparent_hugepage): skipped");
      return;
    }
    constexpr std::size_t kLen = 8u << 20;
    void* m = ::mmap(nullptr, kLen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    REQUIRE(m != MAP_FAILED);
    auto* base = static_cast<std::byte*>(m);
    CHECK_FALSE(has_flag(vm_flags_at(base + 4096), "hg"));  // a fresh mapping is not advised
    advise_huge_pages(base + 100, kLen - 200);               // rounded inward: pages 1 .. n-2
    CHECK_FALSE(has_flag(vm_flags_at(base), "hg"));           // the partial first page is left alone
    CHECK(has_flag(vm_flags_at(base + 4096), "hg"));
    CHECK(has_flag(vm_flags_at(base + kLen - 8192), "hg"));
    CHECK_FALSE(has_flag(vm_flags_at(base + kLen - 1), "hg"));  // and the partial last one
    ::munmap(m, kLen);
  }

  TEST_CASE("host_alloc advises blocks from 4 MiB to huge pages") {
    if (!thp_available()) return;
    void* big = host_alloc(kHugePageAdviceBytes);
    REQUIRE(big != nullptr);
    // The advice starts at the block's first page boundary (its first bytes may share a page with malloc's header).
    const std::string flags = vm_flags_at(static_cast<const std::byte*>(big) + 4096);
    INFO("VmFlags: ", flags);
    CHECK(has_flag(flags, "hg"));
    host_free(big);
  }

  TEST_CASE("tensors of 4 MiB or more live in huge-page advised memory") {
    if (!thp_available()) return;
    Tensor<float, Cpu> t(Shape{2, 1 << 20});  // 8 MiB
    CHECK(has_flag(vm_flags_at(t.data() + 1024), "hg"));
  }
}
