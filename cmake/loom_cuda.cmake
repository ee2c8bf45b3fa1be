# CUDA: found or not, once. Where a CUDA compiler and toolkit exist, LOOM_CUDA_ENABLED is ON,
# and loom_add_cuda_sources() adds a folder's .cu files to a folder library (the CUDA kernels
# join loom_kernels, the device allocator loom_core) with LOOM_HAVE_CUDA defined for everything
# that links it. CPU-only machines (CI) skip it with a message saying why.
# Compiling needs no GPU; running the kernels (tests/gpu) does.
option(LOOM_WITH_CUDA "Build the CUDA kernels and GPU tests when a CUDA compiler is found" ON)
include(CheckLanguage)
set(LOOM_CUDA_DISABLED_REASON "")
set(LOOM_CUDA_ENABLED OFF)
if(LOOM_WITH_CUDA)
  check_language(CUDA)
endif()
if(NOT LOOM_WITH_CUDA)
  set(LOOM_CUDA_DISABLED_REASON "LOOM_WITH_CUDA=OFF")
elseif(NOT CMAKE_CUDA_COMPILER)
  set(LOOM_CUDA_DISABLED_REASON "no CUDA compiler found (set CUDACXX or CMAKE_CUDA_COMPILER)")
else()
  find_package(CUDAToolkit QUIET)
  if(NOT CUDAToolkit_FOUND)
    set(LOOM_CUDA_DISABLED_REASON "CUDA toolkit (cudart, cuBLASLt) not found")
  elseif(NOT TARGET CUDA::cublasLt)
    set(LOOM_CUDA_DISABLED_REASON "cuBLASLt not found in the CUDA toolkit")
  endif()
endif()

# The directory-wide flags (-Wall -Wpedantic -Werror -march=native ...) are GCC flags that nvcc
# rejects: keep them for a target's C++ sources only and give nvcc its own equivalents, host-side
# warnings through -Xcompiler and every nvcc warning as an error when LOOM_WERROR is on.
function(loom_cxx_only_directory_options target)
  get_property(directory_options DIRECTORY ${PROJECT_SOURCE_DIR} PROPERTY COMPILE_OPTIONS)
  set_property(TARGET ${target} PROPERTY COMPILE_OPTIONS "")
  foreach(option IN LISTS directory_options)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${option}>)
  endforeach()
  # --extended-lambda: the pointwise kernels take __device__ lambdas from host functions.
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:--extended-lambda>
                                            $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra>)
  if(LOOM_WERROR)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings>
                                              $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Werror>)
  endif()
  # One CUDA runtime per process: the shared libcudart that CUDA::cudart (and the NCCL
  # backend) link, not CMake's default static copy for CUDA targets.
  set_target_properties(${target} PROPERTIES CUDA_RUNTIME_LIBRARY Shared)
endfunction()

# Adds `folder`'s .cu files to `target` and makes it a CUDA-enabled library.
function(loom_add_cuda_sources target folder)
  file(GLOB sources CONFIGURE_DEPENDS ${folder}/*.cu)
  target_sources(${target} PRIVATE ${sources})
  loom_cxx_only_directory_options(${target})
  target_link_libraries(${target} PUBLIC CUDA::cudart CUDA::cublasLt)
  target_compile_definitions(${target} PUBLIC LOOM_HAVE_CUDA=1)
endfunction()

if(LOOM_CUDA_DISABLED_REASON)
  message(STATUS "loom: CUDA kernels skipped (${LOOM_CUDA_DISABLED_REASON})")
else()
  set(LOOM_CUDA_ENABLED ON)
  # Ampere (A100) and Hopper (H100/H200) by default; override with -DCMAKE_CUDA_ARCHITECTURES.
  # Must be set before enable_language, which otherwise picks the compiler's own default.
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES OR CMAKE_CUDA_ARCHITECTURES STREQUAL "")
    set(CMAKE_CUDA_ARCHITECTURES "80;90")
  endif()
  enable_language(CUDA)
  # CMake before 3.26 knows no C++20 flag for nvcc (nvcc has had -std=c++20 since CUDA 12.0).
  # The standard is set after enable_language so CMake's own compiler probe does not ask for it.
  if(NOT DEFINED CMAKE_CUDA20_STANDARD_COMPILE_OPTION
     AND CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 12.0)
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
  endif()
  set(CMAKE_CUDA_STANDARD 20)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  message(STATUS "loom: CUDA kernels enabled (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, "
                 "architectures ${CMAKE_CUDA_ARCHITECTURES})")
endif()

# cuDNN's fused flash attention (LOOM_CUDA_ATTENTION=cudnn) lives in a plugin, libloom_cudnn.so
# (src/loom/kernels/cuda/cudnn/), built where NVIDIA's header-only cudnn-frontend and cuDNN 9
# (headers and libcudnn) are found. loom opens it at run time, only when asked
# (kernels/cuda/attention_cudnn.cu): loom's binaries need neither the plugin nor libcudnn to
# start, and the plugin links the same libcudart as loom.
set(LOOM_CUDNN_FRONTEND_INCLUDE "${PROJECT_SOURCE_DIR}/.device/cudnn-frontend/include"
    CACHE PATH "cudnn-frontend's include directory, for cuDNN attention")
function(loom_add_cudnn_attention target)
  find_path(LOOM_CUDNN_INCLUDE cudnn.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
  find_library(LOOM_CUDNN_LIBRARY cudnn HINTS ${CUDAToolkit_LIBRARY_DIR})
  if(NOT EXISTS "${LOOM_CUDNN_FRONTEND_INCLUDE}/cudnn_frontend.h")
    message(STATUS "loom: cuDNN attention not built (no cudnn_frontend.h in "
                   "LOOM_CUDNN_FRONTEND_INCLUDE=${LOOM_CUDNN_FRONTEND_INCLUDE})")
    return()
  endif()
  if(NOT LOOM_CUDNN_INCLUDE OR NOT LOOM_CUDNN_LIBRARY)
    message(STATUS "loom: cuDNN attention not built (cudnn.h or libcudnn not found)")
    return()
  endif()
  add_library(loom_cudnn SHARED
              ${PROJECT_SOURCE_DIR}/src/loom/kernels/cuda/cudnn/attention_cudnn_plugin.cpp)
  target_include_directories(loom_cudnn PRIVATE ${PROJECT_SOURCE_DIR}/src)
  target_include_directories(loom_cudnn SYSTEM PRIVATE ${LOOM_CUDNN_FRONTEND_INCLUDE}
                                                       ${LOOM_CUDNN_INCLUDE})
  # The frontend's own engines compile with NVRTC and call the driver API (llm.c links the same).
  target_link_libraries(loom_cudnn PRIVATE CUDA::cudart CUDA::nvrtc CUDA::cuda_driver
                                           ${LOOM_CUDNN_LIBRARY})
  set_target_properties(loom_cudnn PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR})
  target_compile_definitions(${target} PRIVATE LOOM_CUDNN_PLUGIN_PATH="$<TARGET_FILE:loom_cudnn>")
  add_dependencies(${target} loom_cudnn)
  message(STATUS "loom: cuDNN attention plugin built (cudnn-frontend ${LOOM_CUDNN_FRONTEND_INCLUDE}, "
                 "${LOOM_CUDNN_LIBRARY})")
endfunction()
