// train: device_choice.hpp, the one device resolution of the examples (resnet, multinode): every rule of
// --device x --backend x (built with CUDA) x (GPUs visible), and the GPU each local rank uses. Refusals are
// ConfigErrors whose message names the flag and the fix; the whole text is checked so a change is deliberate.
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include <ddp/core/error.hpp>
#include <ddp/train/device_choice.hpp>

using namespace ddp;
using train::choose_device;
using train::cuda_device_for;

namespace {

train::DeviceRequest req(std::string_view flag, std::string_view backend, bool cuda, int gpus) {
  return {.flag = flag, .backend = backend, .built_with_cuda = cuda, .visible_gpus = gpus};
}

}  // namespace

TEST_SUITE("train") {
  TEST_CASE("choose_device: what is allowed, and the reason logged when --device was not given") {
    struct Row {
      std::string_view flag, backend;
      bool cuda;
      int gpus;
      std::string device, reason;
    };
    const std::vector<Row> rows = {
        // --device cpu: every host backend, whatever the machine has.
        {"cpu", "gloo", true, 4, "cpu", ""},
        {"cpu", "tcp", false, 0, "cpu", ""},
        {"cpu", "mpi", true, 1, "cpu", ""},
        // --device cuda: nccl, and the host backends that stage device memory (gloo = tcp).
        {"cuda", "nccl", true, 1, "cuda", ""},
        {"cuda", "gloo", true, 1, "cuda", ""},
        {"cuda", "tcp", true, 2, "cuda", ""},
        // Picking: the GPU when built with CUDA and one is visible, except under mpi.
        {"", "nccl", true, 8, "cuda",
         "--device not given: training on the GPU (8 visible; this rank uses the one its LOCAL_RANK picks)"},
        {"", "gloo", true, 1, "cuda",
         "--device not given: training on the GPU (1 visible; this rank uses the one its LOCAL_RANK picks)"},
        {"", "mpi", true, 2, "cpu", "--device not given: training on the CPU (--backend mpi moves host memory only)"},
        {"", "gloo", true, 0, "cpu", "--device not given: training on the CPU (no CUDA device is visible)"},
        {"", "tcp", false, 0, "cpu", "--device not given: training on the CPU (built without CUDA)"},
        {"", "gloo", false, 3, "cpu", "--device not given: training on the CPU (built without CUDA)"},
    };
    for (const Row& r : rows) {
      CAPTURE(r.flag);
      CAPTURE(r.backend);
      CAPTURE(r.cuda);
      CAPTURE(r.gpus);
      const train::DeviceChoice c = choose_device(req(r.flag, r.backend, r.cuda, r.gpus));
      CHECK(c.device == r.device);
      CHECK(c.is_cuda() == (r.device == "cuda"));
      CHECK(c.reason == r.reason);
    }
  }

  TEST_CASE("choose_device: every refusal names the flag and the fix") {
    struct Row {
      std::string_view flag, backend;
      bool cuda;
      int gpus;
      const char* message;
    };
    const std::vector<Row> rows = {
        {"cpu", "nccl", true, 1,
         "ddp: --backend nccl reduces GPU memory, but --device cpu was given; use --backend gloo (or tcp, mpi) on the "
         "CPU, or drop --device cpu to train on the GPU"},
        {"cuda", "gloo", false, 0,
         "ddp: --device cuda: this program was built without CUDA; reconfigure with -DDDP_WITH_CUDA=ON (and NCCL for "
         "--backend nccl) or pass --device cpu"},
        {"cuda", "nccl", true, 0,
         "ddp: --device cuda: no CUDA device is visible (check nvidia-smi and CUDA_VISIBLE_DEVICES); pass --device cpu "
         "with --backend gloo"},
        {"cuda", "mpi", true, 2,
         "ddp: --device cuda with --backend mpi: the mpi backend moves host memory only; train on the GPU with "
         "--backend nccl (one GPU per rank) or --backend gloo (stages through host memory, ranks may share a GPU), or "
         "keep --backend mpi with --device cpu"},
        {"gpu", "gloo", true, 1, "ddp: unknown --device 'gpu'; valid: cpu, cuda (or leave --device out to pick)"},
        {"CUDA", "nccl", true, 1, "ddp: unknown --device 'CUDA'; valid: cpu, cuda (or leave --device out to pick)"},
        {"", "nccl", true, 0,
         "ddp: --backend nccl needs a GPU but no CUDA device is visible (check nvidia-smi and CUDA_VISIBLE_DEVICES); "
         "use --backend gloo to train on the CPU"},
        {"", "nccl", false, 0,
         "ddp: --backend nccl needs a build with CUDA and NCCL; this one has neither, so use --backend gloo to train "
         "on the CPU (or reconfigure with -DDDP_WITH_CUDA=ON)"},
    };
    for (const Row& r : rows) {
      CAPTURE(r.flag);
      CAPTURE(r.backend);
      CHECK_THROWS_WITH_AS(choose_device(req(r.flag, r.backend, r.cuda, r.gpus)), r.message, ConfigError);
    }
  }

  TEST_CASE("cuda_device_for: nccl uses GPU LOCAL_RANK; gloo and tcp share the visible GPUs round-robin") {
    CHECK(cuda_device_for("nccl", 0, 1) == 0);
    CHECK(cuda_device_for("nccl", 3, 4) == 3);
    for (const char* host : {"gloo", "tcp"}) {
      CAPTURE(host);
      CHECK(cuda_device_for(host, 0, 1) == 0);
      CHECK(cuda_device_for(host, 3, 1) == 0);  // world 4 on a one-GPU machine
      CHECK(cuda_device_for(host, 3, 2) == 1);
      CHECK(cuda_device_for(host, 5, 8) == 5);
    }
    CHECK_THROWS_WITH_AS(cuda_device_for("nccl", 1, 1),
                         "ddp: --backend nccl needs one GPU per process, but LOCAL_RANK 1 sees only 1 GPU(s); start at "
                         "most 1 process(es) per node (--nproc-per-node, mpirun -np/-npernode), make more GPUs visible "
                         "(CUDA_VISIBLE_DEVICES), or use --backend gloo, whose ranks can share a GPU",
                         ConfigError);
    CHECK_THROWS_WITH_AS(cuda_device_for("gloo", 0, 0),
                         "ddp: --device cuda: no CUDA device is visible (check nvidia-smi and CUDA_VISIBLE_DEVICES); "
                         "pass --device cpu with --backend gloo",
                         ConfigError);
    CHECK_THROWS_WITH_AS(cuda_device_for("tcp", -1, 2), "ddp: LOCAL_RANK must be >= 0, got -1 (--local-rank)",
                         ConfigError);
  }
}
