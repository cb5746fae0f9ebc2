// Hugging Face safetensors I/O for the mid-size model (156M parameters), each next to a baseline
// measured in the same run on the same file system:
//  - writing fp32 and bf16 files (header, conversion, write, fsync, rename) against a raw
//    write()+fsync of the same number of bytes;
//  - reading them back to fp32 (open, map, header checks, conversion) against a raw read() of
//    the same file, both from the page cache (the file was just written) and after dropping it
//    (POSIX_FADV_DONTNEED) where the file system honours that.
//
//   l3-bench-safetensors [--dir DIR] [--repeats N] [--json FILE]
#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <vector>

#include "bench_stats.hpp"
#include "core/build_info.hpp"
#include "core/timer.hpp"
#include "io/safetensors/safetensors_file.hpp"
#include "io/safetensors/safetensors_writer.hpp"
#include "mid_model_inputs.hpp"
#include "model/parameter_layout.hpp"

namespace fs = std::filesystem;
using l3::bench::median;
using l3::core::Stopwatch;

namespace {

void drop_cache(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  (void)::fdatasync(fd);
  (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

double raw_write(const std::string& path, const std::vector<char>& bytes) {
  const Stopwatch start;
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error("cannot create " + path);
  for (std::size_t at = 0; at < bytes.size();) {
    const ssize_t n =
        ::write(fd, bytes.data() + at, std::min<std::size_t>(64U << 20U, bytes.size() - at));
    if (n <= 0) throw std::runtime_error("write failed");
    at += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0) throw std::runtime_error("fsync failed");
  ::close(fd);
  return start.seconds();
}

double raw_read(const std::string& path, std::vector<char>& into) {
  const Stopwatch start;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error("cannot open " + path);
  std::size_t at = 0;
  for (;;) {
    const ssize_t n =
        ::read(fd, into.data() + at, std::min<std::size_t>(64U << 20U, into.size() - at));
    if (n <= 0) break;
    at += static_cast<std::size_t>(n);
    if (at == into.size()) break;
  }
  ::close(fd);
  return start.seconds();
}

}  // namespace

int main(int argc, char** argv) try {
  std::string dir = (fs::temp_directory_path() / "l3-bench-safetensors").string();
  std::string json_path;
  int repeats = 3;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--dir" && i + 1 < argc) dir = argv[++i];
    if (a == "--json" && i + 1 < argc) json_path = argv[++i];
    if (a == "--repeats" && i + 1 < argc) repeats = std::stoi(argv[++i]);
  }
  fs::remove_all(dir);
  fs::create_directories(dir);
  const l3::model::ParameterLayout layout(l3::bench::mid_model(),
                                          l3::model::HeadKind::language_model);
  std::vector<float> flat(static_cast<std::size_t>(layout.total()));
  for (std::size_t i = 0; i < flat.size(); ++i) flat[i] = std::sin(static_cast<float>(i)) * 0.02F;
  std::vector<l3::safetensors::TensorToWrite> tensors;
  for (const l3::model::TensorInfo& t : layout.tensors()) {
    tensors.push_back({t.name, t.shape,
                       std::span<const float>(flat).subspan(static_cast<std::size_t>(t.offset),
                                                            static_cast<std::size_t>(t.numel))});
  }
  nlohmann::json results = nlohmann::json::array();
  std::vector<float> back(flat.size());
  for (const auto dtype :
       {l3::safetensors::SafetensorsDType::f32, l3::safetensors::SafetensorsDType::bf16}) {
    const std::string path = dir + "/model.safetensors";
    const std::string raw_path = dir + "/raw.bin";
    std::vector<double> write_s;
    std::vector<double> raw_write_s;
    std::vector<double> read_warm;
    std::vector<double> raw_read_warm;
    std::vector<double> read_cold;
    std::vector<double> raw_read_cold;
    double bytes = 0;
    for (int r = 0; r < repeats; ++r) {
      // The very bytes of the file (storage may compress or deduplicate simple patterns), and
      // alternated order: neither write always follows the other's dirty pages.
      if (r == 0) l3::safetensors::write_safetensors(path, tensors, dtype, {});
      std::vector<char> same(fs::file_size(path));
      (void)raw_read(path, same);
      if (r % 2 == 1) raw_write_s.push_back(raw_write(raw_path, same));
      Stopwatch start;
      l3::safetensors::write_safetensors(path, tensors, dtype, {});
      write_s.push_back(start.seconds());
      bytes = static_cast<double>(fs::file_size(path));
      if (r % 2 == 0) raw_write_s.push_back(raw_write(raw_path, same));
      for (const bool cold : {false, true}) {
        if (cold) {
          drop_cache(path);
          drop_cache(raw_path);
        }
        start.reset();
        {
          const l3::safetensors::SafetensorsFile file(path);
          for (const l3::model::TensorInfo& t : layout.tensors()) {
            file.read(t.name, std::span<float>(back).subspan(static_cast<std::size_t>(t.offset),
                                                             static_cast<std::size_t>(t.numel)));
          }
        }
        (cold ? read_cold : read_warm).push_back(start.seconds());
        (cold ? raw_read_cold : raw_read_warm).push_back(raw_read(raw_path, same));
      }
    }
    const char* name = l3::safetensors::dtype_name(dtype);
    const double w = median(write_s);
    const double rw = median(raw_write_s);
    const double rdw = median(read_warm);
    const double rrw = median(raw_read_warm);
    const double rdc = median(read_cold);
    const double rrc = median(raw_read_cold);
    fmt::print(
        "safetensors {} ({:.2f} GB, 156M parameters):\n"
        "  write {:.2f} s = {:.2f} GB/s; raw write()+fsync {:.2f} s -> {:.0f}% of raw\n"
        "  read to fp32, cached {:.2f} s = {:.2f} GB/s; raw read() {:.2f} s -> {:.0f}% of raw\n"
        "  read to fp32, cache dropped {:.2f} s; raw read() {:.2f} s -> {:.0f}% of raw\n",
        name, bytes / 1e9, w, bytes / w / 1e9, rw, 100 * rw / w, rdw, bytes / rdw / 1e9, rrw,
        100 * rrw / rdw, rdc, rrc, 100 * rrc / rdc);
    results.push_back({{"dtype", name},
                       {"bytes", bytes},
                       {"write_seconds", w},
                       {"raw_write_seconds", rw},
                       {"read_cached_seconds", rdw},
                       {"raw_read_cached_seconds", rrw},
                       {"read_dropped_seconds", rdc},
                       {"raw_read_dropped_seconds", rrc}});
  }
  if (!json_path.empty()) {
    std::ofstream(json_path) << nlohmann::json{{"benchmark", "safetensors"},
                                               {"git_commit", l3::core::build_info().git_commit},
                                               {"repeats", repeats},
                                               {"results", results}}
                                    .dump(2)
                             << '\n';
  }
  fs::remove_all(dir);
  return 0;
} catch (const std::exception& e) {
  fmt::print(stderr, "error: {}\n", e.what());
  return 1;
}
