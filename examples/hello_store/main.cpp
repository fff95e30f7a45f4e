// hello_store: N ranks (threads) meet through a Store, sum their ranks with add(), and check the
// result.
// SPDX-License-Identifier: MIT
//
// Usage:           hello_store [--ranks N]
// Expected output: one line per rank, then "sum of ranks = N*(N-1)/2 (expected ...)": e.g. for 4
//                  ranks "ddp[rank 0/4] INFO: joined; 4 ranks present" ... "sum of ranks = 6
//                  (expected 6)"
#include <cxxopts.hpp>
#include <ddp/ddp.hpp>
#include <ddp/train/parse_args.hpp>
#include <iostream>
#include <thread>
#include <vector>

int main(int argc, char** argv) {
  cxxopts::Options options("hello_store",
                           "Ranks as threads rendezvous through an in-process store");
  options.add_options()("ranks", "number of ranks", cxxopts::value<int>()->default_value("4"))(
      "h,help", "help");
  try {
    auto args = ddp::train::parse_args(options, argc, argv);
    if (args.count("help")) {
      std::cout << options.help() << '\n';
      return 0;
    }
    const int ranks = args["ranks"].as<int>();
    if (ranks < 1) throw ddp::ConfigError("ddp: --ranks must be at least 1");
    ddp::log::init();
    ddp::store::HashStore store(std::chrono::milliseconds(5000));
    std::vector<std::thread> threads;
    for (int r = 0; r < ranks; ++r) {
      threads.emplace_back([&store, r, ranks] {
        store.add("sum", r);
        store.add("arrived", 1);
        store.set("rank/" + std::to_string(r), std::string_view("here"));
        std::vector<std::string> keys;
        for (int i = 0; i < ranks; ++i) keys.push_back("rank/" + std::to_string(i));
        store.wait(keys);
        std::cout << "rank " << r << ": joined; " << ranks << " ranks present\n";
      });
    }
    for (auto& t : threads) t.join();
    const auto sum = store.add("sum", 0);
    std::cout << "sum of ranks = " << sum << " (expected " << ranks * (ranks - 1) / 2 << ")\n";
    return sum == ranks * (ranks - 1) / 2 ? 0 : 1;
  } catch (const std::exception& e) {
    std::cerr << e.what() << '\n';
    return 1;
  }
}
