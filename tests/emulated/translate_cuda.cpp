// Rewrites a kernel file (.cu) into C++ for the CPU emulation (cuda_emulation.hpp): the two
// constructs that are not C++ syntax become calls.
//   kernel<<<grid, block, shared, stream>>>(args)
//     -> ::l3emu::launch(::l3emu::config(grid, block, shared, stream),
//                        [](const auto&... a) { kernel(a...); })(args)
//   extern __shared__ float name[];  ->  float* const name = ::l3emu::dynamic_shared<float>();
//   #include <cub/cub.cuh>  ->  #include "emulated_cub.cuh" (host models of the CUB calls)
//   reinterpret_cast<T>(x)  ->  ::l3emu::checked_cast<T>(x) (a misaligned vector pointer is an
//                               error, as its access would be on a GPU)
// Usage: translate_cuda IN.cu OUT.cpp (OUT is rewritten only when its text changes).
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <regex>
#include <sstream>
#include <string>

namespace {

std::string read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path + ": cannot open");
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::string translate(const std::string& source) {
  // The kernel: a name with optional template arguments; the configuration: up to `>>>`
  // (it may contain casts with `<...>`, never a `;`).
  static const std::regex launch(
      R"(([A-Za-z_][A-Za-z_0-9:]*(?:<[^<>;()]*>)?)\s*<<<([^;]*?)>>>\s*\()");
  static const std::regex dynamic_shared(
      R"(extern\s+__shared__\s+(?:alignas\(\d+\)\s+)?([A-Za-z_][A-Za-z_0-9:]*)\s+([A-Za-z_][A-Za-z_0-9]*)\s*\[\s*\]\s*;)");
  std::string out = std::regex_replace(source, launch,
                                       "::l3emu::launch(::l3emu::config($2), [](const auto&... "
                                       "l3emu_args) { $1(l3emu_args...); })(");
  out = std::regex_replace(out, dynamic_shared, "$1* const $2 = ::l3emu::dynamic_shared<$1>();");
  static const std::regex cub_include(R"(#include\s*<cub/cub\.cuh>)");
  out = std::regex_replace(out, cub_include, "#include \"emulated_cub.cuh\"");
  static const std::regex pointer_cast(R"(\breinterpret_cast\s*<)");
  out = std::regex_replace(out, pointer_cast, "::l3emu::checked_cast<");
  if (out.find("<<<") != std::string::npos) throw std::runtime_error("a launch left untranslated");
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: translate_cuda IN.cu OUT.cpp\n";
    return 2;
  }
  try {
    const std::string text =
        "#line 1 \"" + std::string(argv[1]) + "\"\n" + translate(read(argv[1]));
    std::ifstream existing(argv[2], std::ios::binary);
    if (existing) {
      std::ostringstream old;
      old << existing.rdbuf();
      if (old.str() == text) return 0;
    }
    const std::filesystem::path target(argv[2]);
    if (target.has_parent_path()) std::filesystem::create_directories(target.parent_path());
    std::ofstream out(target, std::ios::binary | std::ios::trunc);
    out << text;
    if (!out) throw std::runtime_error(std::string(argv[2]) + ": cannot write");
  } catch (const std::exception& e) {
    std::cerr << "translate_cuda: " << argv[1] << ": " << e.what() << '\n';
    return 1;
  }
  return 0;
}
