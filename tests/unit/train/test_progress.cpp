// train::Progress: the ETA's arithmetic and format, plain lines every log_every steps, and the live line redrawn
// in place ('\r' ... erase to end of line) no more often than redraw_every, ended by end_epoch.
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>
#include <stdlib.h>

#include <chrono>
#include <sstream>
#include <string>
#include <string_view>

#include <ddp/core/error.hpp>
#include <ddp/env/env.hpp>
#include <ddp/train/progress.hpp>

#include "unit/env/launch_envs.hpp"

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
    const auto t0 = ddp::Clock::time_point{} + 1000s;
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
    const auto t0 = ddp::Clock::time_point{} + 1000s;
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

  TEST_CASE("live progress by default only on a terminal of its own: not under mpirun, srun or shared torchrun") {
    using ddp::env::Env;
    using ddp::train::live_progress_wanted;
    using ddp::train::stdout_shared_by;
    const Env term = Env::from({{"TERM", "xterm-256color"}});
    CHECK(live_progress_wanted(term, true));
    CHECK_FALSE(live_progress_wanted(term, false));  // a pipe or a file
    CHECK_FALSE(live_progress_wanted(Env{}, true));  // no TERM
    CHECK_FALSE(live_progress_wanted(term.with("TERM", "dumb"), true));
    CHECK(live_progress_wanted(term.with("DDP_PROGRESS", "auto"), true));
    CHECK(live_progress_wanted(term.with("DDP_PROGRESS", ""), true));  // empty counts as unset: auto

    // The launchers' environments as they export them (tests/unit/env/launch_envs.hpp, most captured from the
    // real launchers): the terminal is shared with other ranks or reached through the launcher.
    const struct {
      const char* launcher;
      Env env;
      std::string_view var;
    } shared[] = {
        {"Open MPI mpirun (a pty per rank)", ddp_test::openmpi_rank1(), "OMPI_COMM_WORLD_SIZE"},
        {"prterun / srun --mpi=pmix", Env::from({{"PMIX_RANK", "0"}, {"PMIX_NAMESPACE", "prterun-vm-1@1"}}),
         "PMIX_RANK"},
        {"MPICH Hydra", ddp_test::mpich_hydra_local_rank1(), "PMI_RANK"},
        {"MPICH Hydra -pmi-port", ddp_test::mpich_hydra_pmi_port_rank1(), "PMI_ID"},
        {"Cray PALS mpiexec", ddp_test::cray_pals_rank6(), "PMI_RANK"},
        {"MVAPICH2 mpirun_rsh", ddp_test::mvapich_rank2(), "MV2_COMM_WORLD_SIZE"},
        {"srun", ddp_test::srun_captured_task1(), "SLURM_STEP_ID"},
        {"srun, one task", ddp_test::srun_captured_task1().with("SLURM_STEP_NUM_TASKS", "1"), "SLURM_STEP_ID"},
        {"torchrun, 2 local workers", ddp_test::torchrun_standalone_rank0(), "LOCAL_WORLD_SIZE"},
        {"mpirun inside an sbatch script", ddp_test::nested(ddp_test::sbatch_allocation(), ddp_test::openmpi_rank1()),
         "OMPI_COMM_WORLD_SIZE"},
    };
    for (const auto& row : shared) {
      CAPTURE(row.launcher);
      const Env env = row.env.with("TERM", "xterm");
      CHECK(stdout_shared_by(env) == row.var);
      CHECK_FALSE(live_progress_wanted(env, true));
      CHECK(live_progress_wanted(env.with("DDP_PROGRESS", "live"), true));  // the explicit override still wins
      CHECK_FALSE(live_progress_wanted(env.with("DDP_PROGRESS", "lines"), true));
    }

    // Nothing says the terminal is shared: one torchrun worker on this node, the sbatch script itself (no step),
    // processes started by hand with env:// variables.
    const Env alone[] = {
        ddp_test::torchrun_node1_rank5().with("LOCAL_WORLD_SIZE", "1"),
        ddp_test::sbatch_allocation(),
        Env::from({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "29500"}}),
    };
    for (const Env& env : alone) {
      CHECK(stdout_shared_by(env).empty());
      CHECK(live_progress_wanted(env.with("TERM", "xterm"), true));
    }
    CHECK(live_progress_wanted(Env::from({{"LOCAL_WORLD_SIZE", "2"}, {"DDP_PROGRESS", "live"}}), false));
    CHECK_THROWS_WITH_AS(live_progress_wanted(term.with("DDP_PROGRESS", "fancy"), true),
                         doctest::Contains("DDP_PROGRESS='fancy' is not one of auto, live, lines"), ddp::ConfigError);
  }
}
