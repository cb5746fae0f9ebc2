#include "io/safetensors/safetensors_file.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/bounded_read.hpp"
#include "core/error.hpp"
#include "core/input_file.hpp"
#include "io/safetensors/float_formats.hpp"

namespace l3::safetensors {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";

std::uint16_t le16(const std::byte* p) {
  return static_cast<std::uint16_t>(std::to_integer<unsigned>(p[0]) |
                                    (std::to_integer<unsigned>(p[1]) << 8U));
}

}  // namespace

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  const int fd = core::open_regular_file(path, "a safetensors file");
  struct stat info {};
  if (::fstat(fd, &info) != 0) {
    ::close(fd);
    throw core::bad_input("cannot look at the file", {.file = path});
  }
  size_ = static_cast<std::size_t>(info.st_size);
  if (size_ < 8) {
    ::close(fd);
    throw core::bad_input(fmt::format("too short for a safetensors file ({} bytes)", size_),
                          {.file = path});
  }
  void* map = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
  const int error = errno;
  if (map == MAP_FAILED) {
    ::close(fd);
    throw core::bad_input(fmt::format("cannot map: {}", core::errno_text(error)), {.file = path});
  }
  map_ = static_cast<const std::byte*>(map);
  fd_ = fd;  // kept for read_range
  try {
    header_ = parse_safetensors_header(std::span(map_, size_), size_, path);
  } catch (...) {
    ::munmap(const_cast<std::byte*>(map_), size_);  // NOLINT: munmap takes void*
    ::close(fd_);
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(const_cast<std::byte*>(map_), size_);  // NOLINT: as above
  if (fd_ >= 0) ::close(fd_);
}

std::span<const std::byte> SafetensorsFile::bytes(const SafetensorsTensor& tensor) const {
  return {map_ + header_.data_start + tensor.begin,
          static_cast<std::size_t>(tensor.end - tensor.begin)};
}

void SafetensorsFile::read(const std::string& name, std::span<float> out) const {
  const SafetensorsTensor* t = header_.find(name);
  if (t == nullptr) throw core::bad_input("no such tensor", {.file = path_, .tensor = name});
  if (static_cast<std::int64_t>(out.size()) != t->numel()) {
    throw core::bad_input(fmt::format("has {} elements, {} expected", t->numel(), out.size()),
                          {.file = path_, .tensor = name});
  }
  read_range(name, 0, out);
}

void SafetensorsFile::read_range(const std::string& name, std::int64_t first,
                                 std::span<float> out) const {
  const SafetensorsTensor* t = header_.find(name);
  if (t == nullptr) throw core::bad_input("no such tensor", {.file = path_, .tensor = name});
  const auto count = static_cast<std::int64_t>(out.size());
  if (first < 0 || first + count > t->numel()) {
    throw core::bad_input(
        fmt::format("has {} elements, [{}, {}) asked for", t->numel(), first, first + count),
        {.file = path_, .tensor = name});
  }
  // Read with pread in chunks, not through the map: the pages a read touches through a map stay
  // in this process's resident set (with the kernel's large folios, whole neighbourhoods of
  // them), so a rank reading its share of a large model would hold the files it read it from.
  const std::size_t width = dtype_bytes(t->dtype);
  constexpr std::size_t kChunk = std::size_t{1} << 20U;  // elements per read
  std::vector<std::byte> raw(std::min(out.size(), kChunk) * width);
  auto offset = static_cast<off_t>(header_.data_start + static_cast<std::uint64_t>(t->begin) +
                                   static_cast<std::uint64_t>(first) * width);
  for (std::size_t done = 0; done < out.size();) {
    const std::size_t n = std::min(kChunk, out.size() - done);
    std::size_t got = 0;
    while (got < n * width) {
      const ssize_t r =
          ::pread(fd_, raw.data() + got, n * width - got, offset + static_cast<off_t>(got));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) {
        throw core::bad_input(
            fmt::format("cannot read: {}", r < 0 ? core::errno_text(errno) : "unexpected end"),
            {.file = path_, .tensor = name});
      }
      got += static_cast<std::size_t>(r);
    }
    const std::byte* p = raw.data();
    float* to = out.data() + done;
    switch (t->dtype) {
      case SafetensorsDType::f32:
        std::memcpy(to, p, n * sizeof(float));  // little-endian (the writer checks)
        break;
      case SafetensorsDType::bf16:
        for (std::size_t i = 0; i < n; ++i) to[i] = bf16_to_float(le16(p + 2 * i));
        break;
      case SafetensorsDType::f16:
        for (std::size_t i = 0; i < n; ++i) to[i] = f16_to_float(le16(p + 2 * i));
        break;
    }
    done += n;
    offset += static_cast<off_t>(n * width);
  }
}

bool has_safetensors_model(const std::string& directory) {
  std::error_code ec;
  return fs::is_regular_file(fs::path(directory) / kIndexFile, ec) ||
         fs::is_regular_file(fs::path(directory) / kSingleFile, ec);
}

SafetensorsModel::SafetensorsModel(const std::string& directory) : directory_(directory) {
  const fs::path dir(directory);
  const fs::path index_path = dir / kIndexFile;
  if (!fs::is_regular_file(index_path)) {
    if (!fs::is_regular_file(dir / kSingleFile)) {
      throw core::bad_input(fmt::format("no {} and no {}: not a Hugging Face safetensors model",
                                        kSingleFile, kIndexFile),
                            {.file = directory});
    }
    files_.push_back(std::make_unique<SafetensorsFile>((dir / kSingleFile).string()));
    for (const SafetensorsTensor& t : files_.back()->header().tensors)
      owner_[t.name] = files_.back().get();
    return;
  }
  json index = core::read_json_object(index_path.string(), "a safetensors index");
  if (!index.contains("weight_map") || !index["weight_map"].is_object())
    throw core::bad_input("no \"weight_map\" object", {.file = index_path.string()});
  std::map<std::string, const SafetensorsFile*> by_file;
  for (const auto& [name, file] : index["weight_map"].items()) {
    if (!file.is_string()) {
      throw core::bad_input("a weight_map entry is not a file name",
                            {.file = index_path.string(), .tensor = name});
    }
    const std::string shard = file.get<std::string>();
    if (shard.empty() || shard.find('/') != std::string::npos || shard == "." || shard == "..") {
      throw core::bad_input(
          fmt::format("weight_map names '{}', not a file in the directory", shard),
          {.file = index_path.string(), .tensor = name});
    }
    if (!by_file.contains(shard)) {
      std::error_code ec;
      if (!fs::exists(dir / shard, ec)) {
        throw core::bad_input(fmt::format("the index names {}, which is missing", shard),
                              {.file = index_path.string(), .tensor = name});
      }
      files_.push_back(std::make_unique<SafetensorsFile>((dir / shard).string()));
      by_file[shard] = files_.back().get();
    }
    const SafetensorsFile* owner = by_file[shard];
    if (owner->header().find(name) == nullptr) {
      throw core::bad_input(fmt::format("the index puts it in {}, which does not hold it", shard),
                            {.file = index_path.string(), .tensor = name});
    }
    owner_[name] = owner;
  }
  for (const auto& file : files_) {
    for (const SafetensorsTensor& t : file->header().tensors) {
      const auto it = owner_.find(t.name);
      if (it != owner_.end() && it->second != file.get()) {
        throw core::bad_input(fmt::format("also in {}: a tensor in two shards", it->second->path()),
                              {.file = file->path(), .tensor = t.name});
      }
    }
  }
}

const SafetensorsTensor* SafetensorsModel::find(const std::string& name) const {
  const auto it = owner_.find(name);
  return it == owner_.end() ? nullptr : it->second->header().find(name);
}

void SafetensorsModel::read(const std::string& name, std::span<float> out) const {
  const auto it = owner_.find(name);
  if (it == owner_.end())
    throw core::bad_input("no such tensor in the model", {.file = directory_, .tensor = name});
  it->second->read(name, out);
}

void SafetensorsModel::read_range(const std::string& name, std::int64_t first,
                                  std::span<float> out) const {
  const auto it = owner_.find(name);
  if (it == owner_.end())
    throw core::bad_input("no such tensor in the model", {.file = directory_, .tensor = name});
  it->second->read_range(name, first, out);
}

std::vector<std::string> SafetensorsModel::names() const {
  std::vector<std::string> names;
  names.reserve(owner_.size());
  for (const auto& [name, file] : owner_) names.push_back(name);
  return names;
}

}  // namespace l3::safetensors
