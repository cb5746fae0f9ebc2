// libFuzzer target for the safetensors header parser: any bytes, taken as a whole file, must
// either parse into a header whose tensors lie inside the file or be refused with a bad_input
// Error; never a crash, a hang or an out-of-bounds read (run under ASan + UBSan).
//   CXX=clang++ cmake -B build-fuzz -DL3_FUZZ=ON -DL3_CUDA=OFF
//   cmake --build build-fuzz --target l3-fuzz-safetensors-header
//   cp -r fuzz/corpus/safetensors /tmp/corpus   # the fuzzer adds to its corpus directory
//   build-fuzz/bin/l3-fuzz-safetensors-header -max_total_time=60 /tmp/corpus
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "core/error.hpp"
#include "io/safetensors/safetensors_header.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> file(reinterpret_cast<const std::byte*>(data), size);
  try {
    const l3::safetensors::SafetensorsHeader header =
        l3::safetensors::parse_safetensors_header(file, size, "fuzz");
    for (const l3::safetensors::SafetensorsTensor& t : header.tensors) {
      // What a reader relies on: every byte range inside the file.
      if (t.begin > t.end || header.data_start + t.end > size) std::abort();
    }
  } catch (const l3::core::Error& e) {
    if (e.kind() != l3::core::ErrorKind::bad_input) std::abort();
  }
  return 0;
}
