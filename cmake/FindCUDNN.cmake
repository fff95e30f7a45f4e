# Finds cuDNN (8 or 9) and defines the imported target CUDNN::cudnn.
# Looks in CUDNN_ROOT (CMake or environment variable; when set, only there), else CUDNN_HOME, CUDAToolkit_ROOT /
# CUDA_HOME / CUDA_PATH, /usr/local/cuda and the default paths. PyTorch's nvidia-cudnn-cu13 wheel is such a prefix
# (include/cudnn.h, lib/libcudnn.so.9 with no unversioned link): scripts/gpu_check.sh passes it as CUDNN_ROOT.
# Sets CUDNN_FOUND, CUDNN_INCLUDE_DIR, CUDNN_LIBRARY, CUDNN_VERSION (from cudnn_version.h, cuDNN 8 and later).
include_guard(GLOBAL)
include(${CMAKE_CURRENT_LIST_DIR}/DdpFindPrefixLibrary.cmake)

ddp_find_prefix_library(CUDNN HEADER cudnn.h VERSION_HEADER cudnn_version.h
                        VERSION_MACROS CUDNN_MAJOR CUDNN_MINOR CUDNN_PATCHLEVEL
                        LIBRARY_NAMES cudnn libcudnn.so.9 libcudnn.so.8 TARGET cudnn
                        HINTS $ENV{CUDNN_HOME} ${CUDAToolkit_ROOT} $ENV{CUDA_HOME} $ENV{CUDA_PATH}
                              ${CUDAToolkit_LIBRARY_ROOT} /usr/local/cuda)
