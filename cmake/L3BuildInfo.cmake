# Build facts compiled into the program (`llama3-hpc --version`, checkpoint manifests):
# version and build settings at configure time; the git commit at every build, rewritten only
# when it changes so that an unchanged tree does not relink.
set(L3_GENERATED_DIR "${PROJECT_BINARY_DIR}/generated")
string(REPLACE ";" "," L3_CUDA_ARCHS_STRING "${L3_CUDA_ARCHS}")
if(L3_CUDA_EMULATED)  # --version then says "compiled for sm EMULATED (CPU, tests only)"
  set(L3_CUDA_ARCHS_STRING "EMULATED (CPU, tests only)")
endif()
configure_file("${PROJECT_SOURCE_DIR}/cmake/build_config.hpp.in"
               "${L3_GENERATED_DIR}/l3_build_config.hpp" @ONLY)

add_custom_target(l3_git_info
  COMMAND ${CMAKE_COMMAND} -DSOURCE_DIR=${PROJECT_SOURCE_DIR}
          -DOUTPUT=${L3_GENERATED_DIR}/l3_git_info.cpp -P ${PROJECT_SOURCE_DIR}/cmake/GitInfo.cmake
  BYPRODUCTS "${L3_GENERATED_DIR}/l3_git_info.cpp"
  COMMENT "Recording the git commit"
  VERBATIM)
