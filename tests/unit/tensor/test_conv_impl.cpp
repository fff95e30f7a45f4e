// ConvImpl (tensor/conv_impl.hpp): the --conv flag's words, and the refusal of a cuDNN mode in a program built
// without cuDNN (this executable does not link ddp::cudnn; tests/gpu/cudnn checks the other side).
// SPDX-License-Identifier: MIT
#include <doctest/doctest.h>

#include <ddp/core/error.hpp>
#include <ddp/tensor/conv_impl.hpp>

TEST_SUITE("conv_impl") {
  TEST_CASE("--conv words round-trip and a bad one names the flag and the choices") {
    for (ddp::ConvImpl c : {ddp::ConvImpl::Auto, ddp::ConvImpl::Own, ddp::ConvImpl::Cudnn, ddp::ConvImpl::CudnnFind})
      CHECK(ddp::parse_conv_impl(ddp::conv_impl_name(c)) == c);
    CHECK(ddp::parse_conv_impl("cudnn_find") == ddp::ConvImpl::CudnnFind);
    CHECK_THROWS_WITH_AS(ddp::parse_conv_impl("cuDNN"),
                         "ddp: unknown --conv 'cuDNN'; valid: auto (cuDNN when built with it, else own), own, cudnn, "
                         "cudnn_find",
                         ddp::ConfigError);
    CHECK_THROWS_AS(ddp::parse_conv_impl(""), ddp::ConfigError);
  }

  TEST_CASE("without cuDNN in the build, auto and own run and the cuDNN modes are refused by name") {
    CHECK(ddp::resolve_conv_impl(ddp::ConvImpl::Auto) == ddp::ConvImpl::Own);
    CHECK(ddp::resolve_conv_impl(ddp::ConvImpl::Own) == ddp::ConvImpl::Own);
    CHECK_THROWS_WITH_AS(ddp::resolve_conv_impl(ddp::ConvImpl::Cudnn),
                         "ddp: --conv cudnn needs cuDNN, but this program was built without it (it must link "
                         "ddp::cudnn, which CMake defines where it finds cuDNN: -DDDP_WITH_CUDNN=ON "
                         "-DCUDNN_ROOT=<prefix>); use --conv own or auto",
                         ddp::ConfigError);
    CHECK_THROWS_AS(ddp::resolve_conv_impl(ddp::ConvImpl::CudnnFind), ddp::ConfigError);
  }
}
