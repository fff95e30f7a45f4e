// <ddp/ddp.hpp> alone gives the names of the headers it used to leave out (docs/decisions/0066); before, this
// failed with "'save_snapshot_on_rank0' is not a member of 'ddp::train'". Compiled, never run: check_umbrella.cmake
// proves that the umbrella reaches every public header, this file that a program can use their names.
// SPDX-License-Identifier: MIT
#include <ddp/ddp.hpp>
#include <string>

namespace umbrella_names {

[[maybe_unused]] void uses() {
  // train/snapshot_io.hpp (qualified names are looked up here, even inside the generic lambda)
  [[maybe_unused]] auto save = [](auto& comm, auto& exec, auto& net, auto& opt) {
    const long epoch = ddp::train::resume_snapshot(comm, std::string("s.safetensors"), exec, net, opt).epoch;
    ddp::train::save_snapshot_on_rank0(comm, std::string("s.safetensors"), exec, net, opt, {.epoch = epoch + 1});
  };
  ddp::train::prepare_snapshot_path("s.safetensors", "--snapshot_path", 0, 1);
  // train/optim_flags.hpp
  [[maybe_unused]] ddp::train::OptimFlags optim_flags{};
  // data/image_decode.hpp, image_folder.hpp, image_transform.hpp
  [[maybe_unused]] ddp::data::ImageFolderOptions image_options{};
  [[maybe_unused]] ddp::data::CropParams crop{};
  [[maybe_unused]] constexpr bool decoders = ddp::data::image_decoders_available();
  // kernels/bn_stats.hpp, conv_gemm_maps.hpp, op_profile.hpp
  [[maybe_unused]] ddp::kernels::BnMoments moments{};
  [[maybe_unused]] ddp::kernels::OpProfile* profile = nullptr;
  [[maybe_unused]] ddp::kernels::ConvFpropMap<float>* fprop = nullptr;
  // comm/staging/staged_communicator.hpp
  [[maybe_unused]] auto staged = [](auto ops) { return sizeof(ddp::comm::StagedCommunicator<decltype(ops)>); };
  // launch/*.hpp (ddprun's library)
  [[maybe_unused]] ddp::launch::LaunchOptions launch_options{};
  [[maybe_unused]] auto parse = &ddp::launch::parse_launch_args;
  [[maybe_unused]] auto agent = &ddp::launch::run_agent;
  // core/wait_report.hpp
  ddp::set_wait_report_interval(std::chrono::seconds(20));
}

}  // namespace umbrella_names
