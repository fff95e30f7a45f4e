// interop: ddp's store against the real PyTorch TCPStore, both directions.
// SPDX-License-Identifier: MIT
//
//   test_torch_interop PYTHON SCRIPT_DIR
// PYTHON must be able to import torch.distributed (Debian's /usr/bin/python3 has torch 1.13); when it
// cannot, the test prints why and exits 77 (ctest: skipped).
//   1. A PyTorch client (torch_client.py) against our TcpStoreServer: every operation its TCPStore has.
//   2. Our TcpStore against PyTorch's server (torch_server.py): the whole Store contract, including the
//      operations 1.13 lacks (append, multi_get/multi_set) that our client emulates.
// Every subprocess is killed and reaped on every path (Child's destructor).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <stdexcept>
#include <ddp/store/tcp_store.hpp>
#include <ddp/store/tcp_store_server.hpp>
#include <string>
#include <vector>

#include "unit/store/store_conformance.hpp"

namespace {

using namespace std::chrono_literals;
using ddp::Clock;

std::string g_python;
std::string g_dir;

// A child process with its stdout on a pipe. The destructor kills (SIGKILL) and reaps it if still running.
class Child {
 public:
  explicit Child(std::vector<std::string> argv) {
    int fds[2];
    // Plain exceptions, not REQUIRE: this also runs before doctest's context exists (torch_available).
    if (::pipe(fds) != 0) throw std::runtime_error("pipe failed");
    pid_ = ::fork();
    if (pid_ < 0) throw std::runtime_error("fork failed");
    if (pid_ == 0) {
      ::dup2(fds[1], 1);
      ::close(fds[0]);
      ::close(fds[1]);
      std::vector<char*> args;
      for (auto& a : argv) args.push_back(a.data());
      args.push_back(nullptr);
      ::execv(args[0], args.data());
      ::_exit(127);
    }
    ::close(fds[1]);
    out_ = fds[0];
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  ~Child() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (out_ >= 0) ::close(out_);
  }
  // One line of stdout (without '\n'); empty on EOF or when the deadline passes.
  std::string read_line(Clock::time_point deadline) {
    std::string line;
    for (;;) {
      if (!ddp::net::poll_until(out_, POLLIN, deadline)) return line;
      char c;
      if (::read(out_, &c, 1) != 1 || c == '\n') return line;
      line.push_back(c);
    }
  }
  // Exit code after at most `timeout` (-1: still running, killed).
  int wait_exit(std::chrono::milliseconds timeout) {
    auto deadline = Clock::now() + timeout;
    for (;;) {
      int status = 0;
      pid_t r = ::waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      if (Clock::now() >= deadline) return -1;
      std::this_thread::sleep_for(5ms);  // polling a child's exit; bounded by the deadline
    }
  }
  // Everything left on stdout (after exit).
  std::string rest() {
    std::string all, line;
    while (!(line = read_line(Clock::now() + 100ms)).empty()) all += line + "\n";
    return all;
  }

 private:
  pid_t pid_ = -1;
  int out_ = -1;
};

bool torch_available(std::string& why) {
  Child probe({g_python, "-c", "import torch.distributed as d; assert d.is_available(); print('ok')"});
  std::string line = probe.read_line(Clock::now() + 60s);
  int rc = probe.wait_exit(10s);
  if (line == "ok" && rc == 0) return true;
  why = g_python + " cannot import torch.distributed (install python3-torch: scripts/setup.sh)";
  return false;
}

}  // namespace

TEST_SUITE("interop") {
  TEST_CASE("a PyTorch TCPStore client against ddp's TcpStoreServer") {
    ddp::store::TcpStoreServer server("127.0.0.1", 0);
    ddp::store::TcpStore ours("127.0.0.1", server.port(), {.timeout = 5s});
    ours.set("from_cpp", "cpp-value");
    // A client stuck in the middle of a frame for the whole test: PyTorch 1.13's own server would stall
    // every other client behind it; ours must keep serving the Python client.
    ddp::Fd stuck = ddp::store::connect_tcp("127.0.0.1", server.port(), Clock::now() + 5s);
    const std::uint8_t half_set[] = {0, 3, 0, 0};
    ddp::store::write_all(stuck, half_set, Clock::now() + 5s, "stuck client");
    Child py({g_python, g_dir + "/torch_client.py", std::to_string(server.port())});
    int rc = py.wait_exit(60s);
    std::string out = py.rest();
    INFO("torch_client.py output:\n", out);
    CHECK(rc == 0);
    CHECK(out.find("client checks: ok") != std::string::npos);
    // What the Python client wrote, read back through our client.
    CHECK(ours.get_string("from_py") == "py-value");
    CHECK(ours.get_string("cas") == "b");
    CHECK(ours.add("ctr", 0) == 3);
  }

  TEST_CASE("ddp's TcpStore against PyTorch's TCPStore server") {
    Child py({g_python, g_dir + "/torch_server.py"});
    std::string line = py.read_line(Clock::now() + 60s);
    REQUIRE_MESSAGE(line.rfind("PORT ", 0) == 0, "torch_server.py printed: ", line);
    auto port = static_cast<std::uint16_t>(std::stoi(line.substr(5)));
    ddp::store::TcpStore s("127.0.0.1", port, {.timeout = 5s});
    ddp::store::TcpStore other("127.0.0.1", port, {.timeout = 5s});
    INFO("protocol: ", ddp::store::wire::protocol_name(s.protocol()));
    s.set("from_cpp", "cpp-value");
    CHECK(s.get_string("from_py") == "py-value");  // PyTorch read our key and answered under its own
    ddp_test::check_store_semantics(s, &other);
    ddp_test::hammer_add([&](int t) -> ddp::store::Store& { return t % 2 ? s : other; }, 4, 100, s);
    std::vector<std::string> missing{"never"};
    CHECK_THROWS_AS(s.wait(missing, 100ms), ddp::TimeoutError);
    CHECK(s.add("after_timeout", 2) == 2);  // the client recovered from the abandoned WAIT
    s.set("done", "1");
    CHECK(py.wait_exit(30s) == 0);
    MESSAGE(py.rest());
  }
}

int main(int argc, char** argv) {
  g_python = argc > 1 ? argv[1] : "/usr/bin/python3";
  g_dir = argc > 2 ? argv[2] : ".";
  ::signal(SIGPIPE, SIG_IGN);
  std::string why;
  if (!torch_available(why)) {
    std::printf("SKIP: %s\n", why.c_str());
    return 77;
  }
  doctest::Context ctx;
  ctx.applyCommandLine(argc, argv);
  return ctx.run();
}
