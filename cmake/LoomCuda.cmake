# LoomCuda.cmake - the optional CUDA backend (src/backend/cuda -> loom_cuda).
#
# LOOM_CUDA=AUTO (default) builds it when a CUDA compiler (nvcc) is found,
# ON requires it, OFF skips it. The library needs the CUDA runtime, cuBLAS,
# cuBLASLt and NCCL; loomlib never links it (the backend table's integrator
# decides), tests/gpu links both. Included from the top-level CMakeLists.txt
# after loomlib is defined, so enable_language runs at the top level.
set(LOOM_CUDA AUTO CACHE STRING "Build the CUDA backend: AUTO (when nvcc is found), ON, OFF")
set_property(CACHE LOOM_CUDA PROPERTY STRINGS AUTO ON OFF)
set(LOOM_CUDA_ENABLED OFF)

if(NOT LOOM_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX} AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)  # installed but not on PATH
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    find_package(CUDAToolkit)
  endif()
  if(CMAKE_CUDA_COMPILER AND CUDAToolkit_FOUND)
    # NCCL: Debian/NVIDIA packages put it in /usr/include + /usr/lib/x86_64-linux-gnu,
    # the toolkit tarball in /usr/local/cuda/{include,lib,lib64}.
    find_path(LOOM_NCCL_INCLUDE nccl.h
      HINTS ${CUDAToolkit_INCLUDE_DIRS} ENV NCCL_HOME
      PATHS /usr/include /usr/local/include /usr/local/cuda/include
      PATH_SUFFIXES include)
    find_library(LOOM_NCCL_LIB nccl
      HINTS ${CUDAToolkit_LIBRARY_DIR} ENV NCCL_HOME
      PATHS /usr/lib/x86_64-linux-gnu /usr/local/cuda/lib64 /usr/local/cuda/lib
      PATH_SUFFIXES lib lib64)
    if(LOOM_NCCL_INCLUDE AND LOOM_NCCL_LIB)
      set(LOOM_CUDA_ENABLED ON)
    else()
      set(LOOM_CUDA_WHY "NCCL (nccl.h, libnccl) not found")
    endif()
  else()
    set(LOOM_CUDA_WHY "no CUDA compiler (nvcc) / CUDA toolkit found")
  endif()
  if(NOT LOOM_CUDA_ENABLED AND LOOM_CUDA STREQUAL "ON")
    message(FATAL_ERROR "LOOM_CUDA=ON but ${LOOM_CUDA_WHY}")
  endif()
endif()

if(LOOM_CUDA_ENABLED)
  if(NOT CMAKE_CUDA_ARCHITECTURES)  # before enable_language, or nvcc's default wins
    set(CMAKE_CUDA_ARCHITECTURES "80;90" CACHE STRING "GPU architectures of loom_cuda (A100; H100/H200)")
  endif()
  enable_language(CUDA)
  set(CMAKE_CUDA_STANDARD 17)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  message(STATUS "loom: CUDA backend ON (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, sm ${CMAKE_CUDA_ARCHITECTURES}, "
                 "NCCL ${LOOM_NCCL_LIB})")
  # the kernels, and the NCCL implementation of the communicator (src/comm)
  file(GLOB LOOM_CUDA_SOURCES CONFIGURE_DEPENDS
    ${PROJECT_SOURCE_DIR}/src/backend/cuda/*.cu ${PROJECT_SOURCE_DIR}/src/backend/cuda/*.c)
  list(APPEND LOOM_CUDA_SOURCES ${PROJECT_SOURCE_DIR}/src/comm/comm_nccl.c)
  add_library(loom_cuda STATIC ${LOOM_CUDA_SOURCES})
  target_include_directories(loom_cuda
    PUBLIC ${PROJECT_SOURCE_DIR}/src/backend/cuda
    PRIVATE ${PROJECT_SOURCE_DIR}/include ${PROJECT_SOURCE_DIR}/src ${LOOM_NCCL_INCLUDE})
  # host C: the project's warnings, and no contraction as at the top level;
  # device code: warnings as errors, no FMA contraction (the CPU kernels
  # are built with -ffp-contract=off, so elementwise kernels round as they
  # do), IEEE division and sqrt (nvcc's default, stated here so no global
  # flag can change it).
  # The top-level add_compile_options (gcc flags) would reach nvcc too: start
  # from an empty list and give each language its own.
  set_property(TARGET loom_cuda PROPERTY COMPILE_OPTIONS "")
  target_compile_options(loom_cuda PRIVATE
    $<$<COMPILE_LANGUAGE:C>:-Wall -Wextra -Werror -D_GNU_SOURCE -ffp-contract=off>
    $<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings --fmad=false -prec-div=true -prec-sqrt=true
      -Xcompiler=-Wall,-Wextra,-Werror -Xcudafe=--display_error_number>)
  target_link_libraries(loom_cuda PUBLIC CUDA::cudart CUDA::cublas CUDA::cublasLt ${LOOM_NCCL_LIB} MPI::MPI_C)
  target_compile_definitions(loom_cuda PUBLIC LOOM_HAVE_CUDA=1)
else()
  if(LOOM_CUDA STREQUAL "OFF")
    message(STATUS "loom: CUDA backend OFF (LOOM_CUDA=OFF)")
  else()
    message(STATUS "loom: CUDA backend OFF: ${LOOM_CUDA_WHY} (LOOM_CUDA=AUTO)")
  endif()
endif()
