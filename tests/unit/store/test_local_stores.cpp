// store: HashStore, PrefixStore and FileStore against the shared Store contract.
// SPDX-License-Identifier: MIT
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <ddp/store/file_store.hpp>
#include <ddp/store/hash_store.hpp>
#include <ddp/store/prefix_store.hpp>
#include <filesystem>

#include "store_conformance.hpp"

namespace {

std::string temp_path(const char* tag) {
  auto p = std::filesystem::temp_directory_path() /
           (std::string("ddp_store_test_") + tag + "_" + std::to_string(::getpid()) + ".log");
  std::filesystem::remove(p);
  return p.string();
}

}  // namespace

TEST_SUITE("store") {
  using namespace std::chrono_literals;

  TEST_CASE("HashStore follows the Store contract") {
    ddp::store::HashStore s(2s);
    ddp_test::check_store_semantics(s);
    ddp_test::hammer_add([&](int) -> ddp::store::Store& { return s; }, 8, 500, s);
  }

  TEST_CASE("HashStore wait times out with a message naming the keys") {
    ddp::store::HashStore s(2s);
    std::vector<std::string> keys{"a", "b"};
    CHECK_THROWS_WITH_AS(s.wait(keys, 50ms), "ddp: store wait for [a, b] timed out after 50 ms on the in-process HashStore",
                         ddp::TimeoutError);
  }

  TEST_CASE("PrefixStore writes prefix/key into its base and follows the contract") {
    ddp::store::HashStore base(2s);
    ddp::store::PrefixStore pg("pg0", base);
    ddp_test::check_store_semantics(pg);
    CHECK(base.check("pg0/bin"));
    CHECK(base.get_string("pg0/cas") == "b");
    CHECK_FALSE(base.check("bin"));
    ddp::store::PrefixStore other("pg1", base);
    CHECK_FALSE(other.check("bin"));
    other.set("bin", "x");
    CHECK(pg.get("bin") == ddp::store::Bytes{0, 1, 2, 255, 0, 10});
    // Nested prefixes compose like PyTorch's: outer/inner/key.
    ddp::store::PrefixStore nested("inner", pg);
    nested.set("k", "v");
    CHECK(base.get_string("pg0/inner/k") == "v");
  }

  TEST_CASE("FileStore follows the contract and pins its timeout message") {
    auto path = temp_path("contract");
    {
      ddp::store::FileStore s(path, 2s);
      ddp_test::check_store_semantics(s);
      std::vector<std::string> keys{"never"};
      CHECK_THROWS_WITH_AS(s.wait(keys, 30ms),
                           ("ddp: store wait(['never']) timed out after 30 ms on FileStore '" + path +
                            "'. The process that sets these keys may not have started; raise --timeout-ms "
                            "(DDP_TIMEOUT_MS) if startup is slow.").c_str(),
                           ddp::TimeoutError);
      // A second handle on the same file sees everything the first wrote.
      ddp::store::FileStore again(path, 2s);
      CHECK(again.get_string("cas") == "b");
      CHECK(again.num_keys() == s.num_keys());
      ddp_test::hammer_add([&](int t) -> ddp::store::Store& { return t % 2 ? s : again; }, 6, 200, s);
    }
    std::filesystem::remove(path);
  }

  TEST_CASE("FileStore add is atomic across processes") {
    auto path = temp_path("procs");
    constexpr int kProcs = 4, kAdds = 200;
    std::vector<pid_t> kids;
    std::fflush(nullptr);  // children must not inherit (and repeat) buffered output
    for (int p = 0; p < kProcs; ++p) {
      pid_t pid = ::fork();
      REQUIRE(pid >= 0);
      if (pid == 0) {
        int rc = 0;
        try {
          ddp::store::FileStore s(path, 2s);
          for (int i = 0; i < kAdds; ++i) s.add("n", 1);
          s.set("done/" + std::to_string(p), "1");
        } catch (...) {
          rc = 1;
        }
        ::_exit(rc);
      }
      kids.push_back(pid);
    }
    int failures = 0;
    for (pid_t pid : kids) {
      int status = 0;
      ::waitpid(pid, &status, 0);
      failures += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    CHECK(failures == 0);
    ddp::store::FileStore s(path, 2s);
    CHECK(s.add("n", 0) == kProcs * kAdds);
    CHECK(s.num_keys() == 1 + kProcs);
    std::filesystem::remove(path);
  }
}
