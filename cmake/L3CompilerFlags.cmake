# Warnings (kept clean), sanitizers. Applied through the interface target l3_flags so that
# third-party code and generated files are not affected.
add_library(l3_flags INTERFACE)

target_compile_options(l3_flags INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor
                            -Wold-style-cast -Wcast-align -Woverloaded-virtual
                            -Wimplicit-fallthrough -Wformat=2
                            # designated initializers omit fields on purpose ({.file = path})
                            -Wno-missing-field-initializers>
  # nvcc: forward warnings to the host compiler, keep device code warnings on
  $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra --Werror cross-execution-space-call>)

if(L3_SANITIZE)
  string(REPLACE ";" "," _l3_sanitizers "${L3_SANITIZE}")
  message(STATUS "llama3-hpc: building with -fsanitize=${_l3_sanitizers}")
  target_compile_options(l3_flags INTERFACE
    $<$<COMPILE_LANGUAGE:CXX,C>:-fsanitize=${_l3_sanitizers} -fno-omit-frame-pointer>
    $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-fsanitize=${_l3_sanitizers},-fno-omit-frame-pointer>)
  target_link_options(l3_flags INTERFACE -fsanitize=${_l3_sanitizers})
endif()
