# Finds NCCL and defines the imported target NCCL::NCCL.
# Looks in NCCL_ROOT (CMake or environment variable; when set, only there), else NCCL_HOME, CUDAToolkit_ROOT /
# CUDA_HOME / CUDA_PATH, /usr/local/cuda and the default paths.
# Sets NCCL_FOUND, NCCL_INCLUDE_DIR, NCCL_LIBRARY, NCCL_VERSION.
include_guard(GLOBAL)
include(${CMAKE_CURRENT_LIST_DIR}/DdpFindPrefixLibrary.cmake)

ddp_find_prefix_library(NCCL HEADER nccl.h VERSION_HEADER nccl.h VERSION_MACROS NCCL_MAJOR NCCL_MINOR NCCL_PATCH
                        LIBRARY_NAMES nccl libnccl.so.2
                        HINTS $ENV{NCCL_HOME} ${CUDAToolkit_ROOT} $ENV{CUDA_HOME} $ENV{CUDA_PATH}
                              ${CUDAToolkit_LIBRARY_ROOT} /usr/local/cuda)
