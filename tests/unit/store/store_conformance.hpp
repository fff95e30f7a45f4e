// Shared behaviour checks run against every Store implementation (HashStore, PrefixStore, FileStore, TcpStore).
// SPDX-License-Identifier: MIT
#pragma once

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <ddp/store/store.hpp>
#include <string>
#include <thread>
#include <vector>

namespace ddp_test {

using namespace std::chrono_literals;
using ddp::store::Bytes;
using ddp::store::to_bytes;

inline std::span<const std::uint8_t> sv(const Bytes& b) { return b; }

// Every operation of the Store contract, with values computed independently here. `other` (default: s)
// sets the key a blocked get() waits for; a TcpStore serialises calls on one connection, so it needs a
// second client for that.
inline void check_store_semantics(ddp::store::Store& s, ddp::store::Store* other = nullptr) {
  ddp::store::Store& setter_store = other ? *other : s;
  const std::int64_t keys0 = s.num_keys();

  // set/get round trip, including bytes that are not text.
  Bytes bin{0, 1, 2, 255, 0, 10};
  s.set("bin", sv(bin));
  CHECK(s.get("bin") == bin);
  s.set("k1", "v1");
  CHECK(s.get_string("k1") == "v1");
  s.set("k1", "v1b");  // overwrite
  CHECK(s.get_string("k1") == "v1b");
  s.set("empty", "");
  CHECK(s.get("empty").empty());

  // add: absent counts as 0; the value is decimal text, as PyTorch stores it.
  CHECK(s.add("ctr", 5) == 5);
  CHECK(s.add("ctr", -7) == -2);
  CHECK(s.get_string("ctr") == "-2");
  CHECK(s.add("ctr", 0) == -2);

  // compare_set, PyTorch's semantics.
  CHECK(ddp::store::to_string(s.compare_set("cas", sv(to_bytes("x")), sv(to_bytes("y")))) == "x");  // absent: echo
  CHECK_FALSE(s.check("cas"));
  CHECK(ddp::store::to_string(s.compare_set("cas", sv(Bytes{}), sv(to_bytes("a")))) == "a");  // absent+empty: set
  CHECK(s.get_string("cas") == "a");
  CHECK(ddp::store::to_string(s.compare_set("cas", sv(to_bytes("zz")), sv(to_bytes("b")))) == "a");  // mismatch
  CHECK(ddp::store::to_string(s.compare_set("cas", sv(to_bytes("a")), sv(to_bytes("b")))) == "b");    // match
  CHECK(s.get_string("cas") == "b");

  // check never blocks; every listed key must exist.
  std::vector<std::string> both{"k1", "ctr"}, one_missing{"k1", "nope"};
  CHECK(s.check(both));
  CHECK_FALSE(s.check(one_missing));
  CHECK_FALSE(s.check("nope"));

  // wait returns at once for present keys.
  s.wait(std::span<const std::string>(both), 2000ms);

  // append creates then extends.
  s.append("log", sv(to_bytes("ab")));
  s.append("log", sv(to_bytes("cd")));
  CHECK(s.get_string("log") == "abcd");

  // multi_set / multi_get.
  std::vector<std::string> mk{"m1", "m2", "m3"};
  std::vector<Bytes> mv{to_bytes("one"), to_bytes(""), to_bytes("three")};
  s.multi_set(mk, mv);
  CHECK(s.multi_get(mk) == mv);

  // num_keys counts what we created: bin k1 empty ctr cas log m1 m2 m3.
  CHECK(s.num_keys() == keys0 + 9);
  CHECK(s.delete_key("k1"));
  CHECK_FALSE(s.delete_key("k1"));
  CHECK_FALSE(s.check("k1"));
  CHECK(s.num_keys() == keys0 + 8);

  // get blocks until another thread sets the key.
  std::thread setter([&setter_store] {
    std::this_thread::sleep_for(50ms);  // lets get() start waiting first; correctness does not depend on it
    setter_store.set("late", "here");
  });
  auto t0 = std::chrono::steady_clock::now();
  CHECK(s.get_string("late") == "here");
  setter.join();
  CHECK(std::chrono::steady_clock::now() - t0 < 2s);
}

// Every thread adds 1 `per_thread` times; the final count must be exact.
template <class MakeStore>
void hammer_add(MakeStore&& store_for_thread, int threads, int per_thread, ddp::store::Store& reader) {
  std::vector<std::thread> ts;
  std::atomic<int> max_seen{0};
  for (int t = 0; t < threads; ++t)
    ts.emplace_back([&, t] {
      ddp::store::Store& s = store_for_thread(t);
      for (int i = 0; i < per_thread; ++i) {
        int v = static_cast<int>(s.add("hammer", 1));
        int prev = max_seen.load();
        while (v > prev && !max_seen.compare_exchange_weak(prev, v)) {
        }
      }
    });
  for (auto& t : ts) t.join();
  CHECK(reader.add("hammer", 0) == threads * per_thread);
  CHECK(max_seen.load() == threads * per_thread);
}

}  // namespace ddp_test
