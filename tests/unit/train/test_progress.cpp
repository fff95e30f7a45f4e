// train::Progress: the ETA's arithmetic and format, plain lines every log_every steps, and the live line redrawn
// in place ('\r' ... erase to end of line) no more often than redraw_every, ended by end_epoch.
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>
#include <stdlib.h>

#include <chrono>
#include <sstream>
#include <string>

#include <ddp/core/error.hpp>
#include <ddp/train/progress.hpp>

using ddp::train::format_eta;
using ddp::train::Progress;
using namespace std::chrono_literals;

TEST_SUITE("train") {
  TEST_CASE("format_eta: m:ss under an hour, h:mm:ss above, seconds rounded up") {
    CHECK(format_eta(0) == "0:00");
    CHECK(format_eta(-5) == "0:00");
    CHECK(format_eta(0.2) == "0:01");
    CHECK(format_eta(59) == "0:59");
    CHECK(format_eta(61) == "1:01");
    CHECK(format_eta(3599) == "59:59");
    CHECK(format_eta(3600) == "1:00:00");
    CHECK(format_eta(2 * 3600 + 5 * 60 + 7) == "2:05:07");
  }

  TEST_CASE("plain lines every log_every steps and at the epoch's last step, with the ETA of the steps left") {
    std::ostringstream out;
    const auto t0 = Progress::Clock::time_point{} + 1000s;
    {
      Progress p(out, {.total_steps = 20, .log_every = 4, .live = false}, t0);
      // 2 s per step: after step k of 20, 2 * (20 - k) s are left.
      for (long long k = 1; k <= 10; ++k) p.step(0, k, 10, 1.5, 100.0, "lr 0.1", t0 + std::chrono::seconds(2 * k));
      p.end_epoch();  // plain mode: nothing to end
    }
    CHECK(out.str() ==
          "epoch 0 step 4/10 loss 1.5000 samples/s 100.0 lr 0.1 eta 0:32\n"
          "epoch 0 step 8/10 loss 1.5000 samples/s 100.0 lr 0.1 eta 0:24\n"
          "epoch 0 step 10/10 loss 1.5000 samples/s 100.0 lr 0.1 eta 0:20\n");
  }

  TEST_CASE("live: one line redrawn in place at most every redraw_every, the epoch's last step always, then kept") {
    std::ostringstream out;
    const auto t0 = Progress::Clock::time_point{} + 1000s;
    {
      Progress p(out, {.total_steps = 6, .live = true, .redraw_every = 100ms}, t0);
      p.step(0, 1, 3, 2.0, 10.0, {}, t0 + 10ms);   // first: drawn
      p.step(0, 2, 3, 2.0, 10.0, {}, t0 + 50ms);   // 40 ms later: skipped
      p.step(0, 3, 3, 2.0, 10.0, {}, t0 + 60ms);   // the epoch's last step: drawn
      p.end_epoch();
      p.step(1, 1, 3, 1.0, 10.0, {}, t0 + 400ms);  // a new line; 400 ms for 4 steps, 2 left: 0.2 s -> 0:01
    }  // destroyed with a line open: it ends it, so the program's next output starts on a line of its own
    CHECK(out.str() ==
          "\repoch 0 step 1/3 loss 2.0000 samples/s 10.0 eta 0:01\033[K"
          "\repoch 0 step 3/3 loss 2.0000 samples/s 10.0 eta 0:01\033[K\n"
          "\repoch 1 step 1/3 loss 1.0000 samples/s 10.0 eta 0:01\033[K\n");
  }

  TEST_CASE("no total: no ETA") {
    std::ostringstream out;
    Progress p(out, {.total_steps = 0});
    p.step(2, 1, 1, 0.5, 1.0);
    CHECK(out.str() == "epoch 2 step 1/1 loss 0.5000 samples/s 1.0\n");
  }

  TEST_CASE("DDP_PROGRESS: live and lines override the terminal check; anything else is an error naming it") {
    const char* old = std::getenv("DDP_PROGRESS");
    const std::string saved = old ? old : "";
    ::setenv("DDP_PROGRESS", "live", 1);
    CHECK(ddp::train::live_progress_wanted());
    ::setenv("DDP_PROGRESS", "lines", 1);
    CHECK_FALSE(ddp::train::live_progress_wanted());
    ::setenv("DDP_PROGRESS", "fancy", 1);
    try {
      (void)ddp::train::live_progress_wanted();
      FAIL("no error for DDP_PROGRESS=fancy");
    } catch (const ddp::ConfigError& e) {
      CHECK(std::string(e.what()).find("DDP_PROGRESS='fancy' is not one of auto, live, lines") != std::string::npos);
    }
    if (old)
      ::setenv("DDP_PROGRESS", saved.c_str(), 1);
    else
      ::unsetenv("DDP_PROGRESS");
  }
}
