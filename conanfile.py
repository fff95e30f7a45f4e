# Conan 2 recipe for ddp, a header-only C++20 distributed data-parallel training library.
# Components mirror the CMake targets: ddp::ddp, ddp::cuda, ddp::nccl, ddp::cudnn, ddp::mpi.
import os
import re

from conan import ConanFile
from conan.errors import ConanInvalidConfiguration
from conan.tools.build import check_min_cppstd
from conan.tools.cmake import CMake, CMakeDeps, CMakeToolchain, cmake_layout
from conan.tools.files import copy, load, rmdir


class DdpConan(ConanFile):
    name = "ddp"
    license = "MIT"
    description = "Header-only C++20 distributed data-parallel training: launchers, TCP store, collectives, DDP"
    topics = ("distributed", "training", "deep-learning", "header-only", "nccl", "mpi")
    package_type = "header-library"
    settings = "os", "arch", "compiler", "build_type"
    options = {"with_cuda": [True, False], "with_nccl": [True, False], "with_cudnn": [True, False],
               "with_mpi": [True, False]}
    # CUDA, NCCL, cuDNN and MPI come from the system (CUDA toolkit, libopenmpi-dev); off by default so the
    # package builds anywhere. Consumers turn them on with -o ddp/*:with_cuda=True.
    default_options = {"with_cuda": False, "with_nccl": False, "with_cudnn": False, "with_mpi": False}
    exports_sources = "include/*", "cmake/*", "CMakeLists.txt", "LICENSE"
    no_copy_source = True

    def set_version(self):
        text = load(self, os.path.join(self.recipe_folder, "include", "ddp", "version.hpp"))
        parts = [re.search(rf"#define DDP_VERSION_{p} (\d+)", text).group(1) for p in ("MAJOR", "MINOR", "PATCH")]
        self.version = ".".join(parts)

    def requirements(self):
        self.requires("cxxopts/3.1.1")
        self.requires("nlohmann_json/3.11.2")

    def build_requirements(self):
        self.test_requires("doctest/2.4.9")

    def validate(self):
        if self.settings.get_safe("compiler.cppstd"):
            check_min_cppstd(self, 20)
        if self.options.with_nccl and not self.options.with_cuda:
            raise ConanInvalidConfiguration("ddp: with_nccl=True needs with_cuda=True (NCCL runs on CUDA devices)")
        if self.options.with_cudnn and not self.options.with_cuda:
            raise ConanInvalidConfiguration("ddp: with_cudnn=True needs with_cuda=True (cuDNN runs on CUDA devices)")

    def layout(self):
        cmake_layout(self)

    def generate(self):
        tc = CMakeToolchain(self)
        for flag in ("TESTS", "EXAMPLES", "BENCH"):
            tc.cache_variables[f"DDP_BUILD_{flag}"] = False
        tc.cache_variables["DDP_WITH_CUDA"] = "ON" if self.options.with_cuda else "OFF"
        tc.cache_variables["DDP_WITH_NCCL"] = "ON" if self.options.with_nccl else "OFF"
        tc.cache_variables["DDP_WITH_CUDNN"] = "ON" if self.options.with_cudnn else "OFF"
        tc.cache_variables["DDP_WITH_MPI"] = "ON" if self.options.with_mpi else "OFF"
        tc.cache_variables["DDP_WITH_BLAS"] = "OFF"  # the Conan package uses the portable GEMM
        tc.generate()
        CMakeDeps(self).generate()

    def build(self):
        cmake = CMake(self)
        cmake.configure()

    def package(self):
        CMake(self).install()
        # Conan consumers get CMakeDeps' config; ship ours only for the system-dependency module and the find
        # modules it uses for NCCL and cuDNN (beside it, on its CMAKE_MODULE_PATH).
        rmdir(self, os.path.join(self.package_folder, "share", "cmake"))
        for pattern in (
            "ddp-conan-system-deps.cmake", "FindNCCL.cmake", "FindCUDNN.cmake", "DdpFindPrefixLibrary.cmake"):
            copy(self, pattern, os.path.join(self.source_folder, "cmake"),
                 os.path.join(self.package_folder, "lib", "cmake", "ddp"))

    def package_id(self):
        self.info.clear()

    def _is_platform(self, name):
        for req, dep in self.dependencies.items():
            if str(req.ref.name) == name:
                return getattr(dep, "recipe", None) == "Platform" or str(dep.ref.revision) == "platform"
        return True  # not in the graph at all: treat as system-provided

    def package_info(self):
        self.cpp_info.set_property("cmake_file_name", "ddp")
        self.cpp_info.set_property("cmake_target_name", "ddp::ddp_all")
        self.cpp_info.bindirs = []
        self.cpp_info.libdirs = []
        self.cpp_info.set_property("cmake_build_modules", [os.path.join("lib", "cmake", "ddp", "ddp-conan-system-deps.cmake")])

        core = self.cpp_info.components["ddp"]
        core.set_property("cmake_target_name", "ddp::ddp")
        # A dependency provided by the platform ([platform_requires] in a profile, as in CI here) has no Conan
        # package, and CMakeDeps rejects component requires on it (conan-io/conan#17348); the build module
        # ddp-conan-system-deps.cmake finds such dependencies with find_package and links them instead.
        core.requires = [f"{name}::{name}" for name in ("cxxopts", "nlohmann_json") if not self._is_platform(name)]
        core.system_libs = ["pthread"] if self.settings.os == "Linux" else []
        core.bindirs = []
        core.libdirs = []
        for name, enabled in (("cuda", self.options.with_cuda), ("nccl", self.options.with_nccl),
                              ("cudnn", self.options.with_cudnn), ("mpi", self.options.with_mpi)):
            if not enabled:
                continue
            comp = self.cpp_info.components[name]
            comp.set_property("cmake_target_name", f"ddp::{name}")
            comp.requires = ["cuda"] if name in ("nccl", "cudnn") else ["ddp"]
            comp.defines = [f"DDP_WITH_{name.upper()}=1"]
            comp.bindirs = []
            comp.libdirs = []
