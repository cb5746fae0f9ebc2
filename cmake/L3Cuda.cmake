# The CUDA backend: toolkit (nvcc, cudart, cuBLAS/cuBLASLt), cuDNN 9 and NCCL 2.
#   L3_CUDA=OFF   CPU only
#   L3_CUDA=AUTO  build the CUDA backend when nvcc and all libraries are found (default)
#   L3_CUDA=ON    the same, but a missing piece is an error
#   L3_CUDA=EMULATED  for testing without a GPU: the CUDA backend built by the host compiler
#                 against tests/emulated (kernels run as CPU fibers, cuBLAS GEMMs on OpenBLAS,
#                 cuDNN declining every graph, one-rank NCCL); needs only the CUDA headers
# Sets L3_HAVE_CUDA (and L3_CUDA_EMULATED) and, when true, the targets CUDA::cudart,
# CUDA::cublas, CUDA::cublasLt, l3_cudnn and l3_nccl.
set(L3_HAVE_CUDA OFF)
set(L3_CUDA_EMULATED OFF)

function(l3_cuda_unavailable reason)
  if(L3_CUDA STREQUAL "ON")
    message(FATAL_ERROR "L3_CUDA=ON but ${reason}\n"
      "  Install the CUDA toolkit with cuDNN 9 and NCCL 2 (or: spack install cuda cudnn nccl), "
      "point CUDAToolkit_ROOT / CUDNN_ROOT / NCCL_ROOT at them, or configure with -DL3_CUDA=OFF.")
  endif()
  message(STATUS "llama3-hpc: CUDA backend disabled: ${reason}")
endfunction()

if(NOT L3_CUDA MATCHES "^(AUTO|ON|OFF|EMULATED)$")
  message(FATAL_ERROR "L3_CUDA must be AUTO, ON, OFF or EMULATED (got '${L3_CUDA}')")
endif()

if(L3_CUDA STREQUAL "EMULATED")
  # The headers of the toolkit, cuDNN and NCCL (types and declarations); no nvcc, no libraries.
  find_path(L3_CUDA_INCLUDE_DIR cuda_runtime_api.h
    HINTS ENV CUDA_HOME ENV CUDA_PATH ${CUDAToolkit_ROOT} /usr/local/cuda PATH_SUFFIXES include)
  find_path(L3_CUDNN_INCLUDE_DIR cudnn.h
    HINTS ENV CUDNN_ROOT ${CUDNN_ROOT} ${L3_CUDA_INCLUDE_DIR} PATH_SUFFIXES include)
  find_path(L3_NCCL_INCLUDE_DIR nccl.h
    HINTS ENV NCCL_ROOT ${NCCL_ROOT} ${L3_CUDA_INCLUDE_DIR} PATH_SUFFIXES include)
  if(NOT L3_CUDA_INCLUDE_DIR OR NOT L3_CUDNN_INCLUDE_DIR OR NOT L3_NCCL_INCLUDE_DIR)
    message(FATAL_ERROR "L3_CUDA=EMULATED needs the CUDA, cuDNN and NCCL headers "
                        "(set CUDAToolkit_ROOT, CUDNN_ROOT, NCCL_ROOT)")
  endif()
  set(L3_HAVE_CUDA ON)
  set(L3_CUDA_EMULATED ON)
  add_subdirectory("${PROJECT_SOURCE_DIR}/tests/emulated" "${PROJECT_BINARY_DIR}/emulated")
  foreach(_l3_target CUDA::cudart CUDA::cublas CUDA::cublasLt l3_cudnn l3_nccl)
    add_library(${_l3_target} ALIAS l3_cuda_emulation)
  endforeach()
  message(STATUS "llama3-hpc: CUDA backend EMULATED on the CPU (headers: ${L3_CUDA_INCLUDE_DIR})")
elseif(NOT L3_CUDA STREQUAL "OFF")
  # nvcc is often not on PATH on build machines; look where the toolkit usually lives.
  if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX})
    find_program(_l3_nvcc nvcc HINTS ENV CUDA_HOME ENV CUDA_PATH /usr/local/cuda PATH_SUFFIXES bin)
    if(_l3_nvcc)
      set(CMAKE_CUDA_COMPILER "${_l3_nvcc}" CACHE FILEPATH "CUDA compiler")
    endif()
  endif()

  # Real code for every listed architecture, PTX for the newest so that later GPUs can JIT it.
  # Set before enable_language(CUDA) so that CMake does not probe for a GPU that is not there.
  list(SORT L3_CUDA_ARCHS COMPARE NATURAL)
  set(_l3_archs "")
  list(LENGTH L3_CUDA_ARCHS _l3_n)
  math(EXPR _l3_last "${_l3_n} - 1")
  foreach(_i RANGE 0 ${_l3_last})
    list(GET L3_CUDA_ARCHS ${_i} _a)
    if(_i EQUAL _l3_last)
      list(APPEND _l3_archs "${_a}")         # SASS + PTX
    else()
      list(APPEND _l3_archs "${_a}-real")    # SASS only
    endif()
  endforeach()
  set(CMAKE_CUDA_ARCHITECTURES "${_l3_archs}")

  include(CheckLanguage)
  check_language(CUDA)
  if(NOT CMAKE_CUDA_COMPILER)
    l3_cuda_unavailable("no CUDA compiler (nvcc) was found")
  else()
    enable_language(CUDA)
    # The kernels share headers with the C++20 host code. CMake < 3.26 does not know nvcc's
    # C++20 flag (nvcc >= 12 has it): tell it.
    if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
      set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
      set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    endif()
    set(CMAKE_CUDA_STANDARD 20)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    find_package(CUDAToolkit)

    find_path(L3_CUDNN_INCLUDE_DIR cudnn.h
      HINTS ENV CUDNN_ROOT ${CUDNN_ROOT} ${CUDAToolkit_INCLUDE_DIRS} PATH_SUFFIXES include)
    find_library(L3_CUDNN_LIBRARY cudnn
      HINTS ENV CUDNN_ROOT ${CUDNN_ROOT} ${CUDAToolkit_LIBRARY_DIR} PATH_SUFFIXES lib lib64)
    find_path(L3_NCCL_INCLUDE_DIR nccl.h
      HINTS ENV NCCL_ROOT ${NCCL_ROOT} ${CUDAToolkit_INCLUDE_DIRS} PATH_SUFFIXES include)
    find_library(L3_NCCL_LIBRARY nccl
      HINTS ENV NCCL_ROOT ${NCCL_ROOT} ${CUDAToolkit_LIBRARY_DIR} PATH_SUFFIXES lib lib64)

    if(L3_CUDNN_INCLUDE_DIR)
      file(STRINGS "${L3_CUDNN_INCLUDE_DIR}/cudnn_version.h" _l3_cudnn_major
           REGEX "^#define CUDNN_MAJOR [0-9]+")
      string(REGEX MATCH "[0-9]+" L3_CUDNN_MAJOR "${_l3_cudnn_major}")
    endif()

    if(NOT CUDAToolkit_FOUND OR NOT TARGET CUDA::cublasLt)
      l3_cuda_unavailable("the CUDA toolkit libraries (cudart, cuBLAS, cuBLASLt) were not found")
    elseif(NOT L3_CUDNN_LIBRARY OR NOT L3_CUDNN_INCLUDE_DIR)
      l3_cuda_unavailable("cuDNN was not found (set CUDNN_ROOT)")
    elseif(L3_CUDNN_MAJOR LESS 9)
      l3_cuda_unavailable("cuDNN ${L3_CUDNN_MAJOR} found, cuDNN 9 or newer is needed")
    elseif(NOT L3_NCCL_LIBRARY OR NOT L3_NCCL_INCLUDE_DIR)
      l3_cuda_unavailable("NCCL was not found (set NCCL_ROOT)")
    else()
      l3_record_dependency("cuda" "+cuda")
      l3_record_dependency("cudnn" "+cuda")
      l3_record_dependency("nccl" "+cuda")
      add_library(l3_cudnn UNKNOWN IMPORTED)
      set_target_properties(l3_cudnn PROPERTIES IMPORTED_LOCATION "${L3_CUDNN_LIBRARY}"
        INTERFACE_INCLUDE_DIRECTORIES "${L3_CUDNN_INCLUDE_DIR}")
      add_library(l3_nccl UNKNOWN IMPORTED)
      set_target_properties(l3_nccl PROPERTIES IMPORTED_LOCATION "${L3_NCCL_LIBRARY}"
        INTERFACE_INCLUDE_DIRECTORIES "${L3_NCCL_INCLUDE_DIR}")
      set(L3_HAVE_CUDA ON)
      message(STATUS "llama3-hpc: CUDA backend ON: nvcc ${CMAKE_CUDA_COMPILER_VERSION}, "
                     "archs ${CMAKE_CUDA_ARCHITECTURES}, cuDNN ${L3_CUDNN_MAJOR} "
                     "(${L3_CUDNN_LIBRARY}), NCCL (${L3_NCCL_LIBRARY})")
    endif()
  endif()
endif()
