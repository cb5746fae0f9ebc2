#include "ckpt/local_files.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cstring>
#include <filesystem>

#include "core/bounded_read.hpp"
#include "core/durable_file.hpp"
#include "core/error.hpp"
#include "core/input_file.hpp"

namespace l3::ckpt {

using nlohmann::json;

namespace {

constexpr std::string_view kStateMagic = "L3STATE1";
constexpr std::string_view kParityMagic = "L3XORP01";
constexpr std::int64_t kPrefixBytes = 24;  // magic, header length, header checksum
constexpr std::string_view kStateFormat = "llama3-hpc/local-state";
constexpr std::string_view kParityFormat = "llama3-hpc/local-parity";

std::string errno_text() { return core::errno_text(errno); }

void put_u64(std::string& out, std::uint64_t v) {
  std::array<char, 8> b{};
  std::memcpy(b.data(), &v, 8);  // little-endian hosts only (as the checkpoints' float32)
  out.append(b.data(), 8);
}

std::string prefixed(std::string_view magic, const json& header) {
  const std::string text = header.dump();
  std::string out(magic);
  put_u64(out, text.size());
  put_u64(out, xxh64(std::as_bytes(std::span(text.data(), text.size()))));
  out += text;
  return out;
}

std::span<const std::byte> bytes_of(std::span<const float> values) { return std::as_bytes(values); }

// A descriptor closed on scope exit.
struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  Fd(Fd&&) = delete;
  Fd& operator=(Fd&&) = delete;
};

void pread_all(int fd, const std::string& path, std::int64_t offset, std::span<std::byte> out) {
  std::size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = ::pread(fd, out.data() + done, out.size() - done,
                              static_cast<off_t>(offset) + static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0)
      throw core::internal_error(fmt::format("read failed: {}", errno_text()), {.file = path});
    if (n == 0) {  // past the end: zeros
      std::fill(out.begin() + static_cast<std::ptrdiff_t>(done), out.end(), std::byte{0});
      return;
    }
    done += static_cast<std::size_t>(n);
  }
}

}  // namespace

std::string_view local_kind_name(LocalFileKind kind) noexcept {
  switch (kind) {
    case LocalFileKind::state:
      return "state";
    case LocalFileKind::copy:
      return "copy";
    case LocalFileKind::parity:
      return "xor";
  }
  return "state";
}

std::string local_file_name(LocalFileKind kind, int rank) {
  return fmt::format("rank-{:05}.{}", rank, local_kind_name(kind));
}

bool parse_local_file_name(std::string_view name, LocalFileKind& kind, int& rank) {
  constexpr std::string_view kPrefix = "rank-";
  const std::size_t dot = name.find('.');
  if (!name.starts_with(kPrefix) || dot == std::string_view::npos) return false;
  const std::string_view digits = name.substr(kPrefix.size(), dot - kPrefix.size());
  const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), rank);
  if (error != std::errc() || end != digits.data() + digits.size() || digits.size() < 5 || rank < 0)
    return false;
  const std::string_view suffix = name.substr(dot + 1);
  for (const LocalFileKind k : {LocalFileKind::state, LocalFileKind::copy, LocalFileKind::parity}) {
    if (suffix == local_kind_name(k)) {
      kind = k;
      return true;
    }
  }
  return false;
}

// ---- StateImage ----------------------------------------------------------------------------

StateImage::StateImage(const model::ParameterLayout& layout, const Manifest& manifest,
                       const RankState& state, int rank, int world_size, const std::string& node)
    : state_(state) {
  json slices = json::array();
  for (const TensorSlice& s : tensor_slices(layout, state.ranges)) {
    const auto at = static_cast<std::size_t>(s.position);
    const auto n = static_cast<std::size_t>(s.count);
    slices.push_back({s.tensor, s.first, s.count, s.position,
                      to_hex(xxh64(bytes_of({state.master.data() + at, n}))),
                      to_hex(xxh64(bytes_of({state.exp_avg.data() + at, n}))),
                      to_hex(xxh64(bytes_of({state.exp_avg_sq.data() + at, n})))});
  }
  json ranges = json::array();
  for (const model::FlatRange& r : state.ranges) ranges.push_back({r.begin, r.end});
  json described = manifest.to_json();
  described.erase("tensors");
  described.erase("files");
  const json header = {{"format", kStateFormat},   {"version", 1},
                       {"step", manifest.step},    {"rank", rank},
                       {"world_size", world_size}, {"node", node},
                       {"values", state.values()}, {"ranges", ranges},
                       {"slices", slices},         {"manifest", described}};
  prefix_ = prefixed(kStateMagic, header);
  size_ = static_cast<std::int64_t>(prefix_.size()) +
          3 * state.values() * static_cast<std::int64_t>(sizeof(float));
}

void StateImage::copy(std::int64_t offset, std::span<std::byte> out) const {
  std::size_t done = 0;
  const auto take = [&](std::span<const std::byte> part, std::int64_t part_start) {
    // The overlap of [offset + done, offset + out.size()) with this part.
    const std::int64_t from = offset + static_cast<std::int64_t>(done);
    const std::int64_t end = offset + static_cast<std::int64_t>(out.size());
    const std::int64_t part_end = part_start + static_cast<std::int64_t>(part.size());
    if (from >= part_end || end <= part_start || from < part_start) return;
    const std::int64_t n = std::min(end, part_end) - from;
    std::memcpy(out.data() + done, part.data() + (from - part_start), static_cast<std::size_t>(n));
    done += static_cast<std::size_t>(n);
  };
  const auto values = static_cast<std::int64_t>(state_.master.size()) * 4;
  const auto prefix = static_cast<std::int64_t>(prefix_.size());
  take(std::as_bytes(std::span(prefix_.data(), prefix_.size())), 0);
  take(bytes_of(state_.master), prefix);
  take(bytes_of(state_.exp_avg), prefix + values);
  take(bytes_of(state_.exp_avg_sq), prefix + 2 * values);
  std::fill(out.begin() + static_cast<std::ptrdiff_t>(done), out.end(), std::byte{0});
}

void StateImage::write_file(const std::string& path, const std::string& recycle) const {
  LocalFileWriter file(path, recycle);
  file.write_at(0, std::as_bytes(std::span(prefix_.data(), prefix_.size())));
  auto at = static_cast<std::int64_t>(prefix_.size());
  for (const std::vector<float>* a : {&state_.master, &state_.exp_avg, &state_.exp_avg_sq}) {
    file.write_at(at, bytes_of(*a));
    at += static_cast<std::int64_t>(a->size() * sizeof(float));
  }
  file.truncate(size_);
  file.commit();
}

// ---- LocalFileWriter, ParityFileWriter ------------------------------------------------------

LocalFileWriter::LocalFileWriter(std::string path, const std::string& recycle)
    : path_(std::move(path)), temporary_(core::temporary_name_for(path_)) {
  // Only a file of one name is written over: with a second hard link (a user's backup of an
  // older step), writing in place would change the backup too.
  struct stat info {};
  if (!recycle.empty() && ::lstat(recycle.c_str(), &info) == 0 && S_ISREG(info.st_mode) &&
      info.st_nlink == 1 && std::rename(recycle.c_str(), temporary_.c_str()) == 0) {
    fd_ = ::open(temporary_.c_str(),  // NOLINT(cppcoreguidelines-pro-type-vararg)
                 O_WRONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd_ >= 0) return;
    ::unlink(temporary_.c_str());
  }
  fd_ = core::create_exclusive(temporary_);
}

LocalFileWriter::~LocalFileWriter() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(temporary_.c_str());
  }
}

void LocalFileWriter::write_at(std::int64_t offset, std::span<const std::byte> bytes) {
  std::size_t done = 0;
  while (done < bytes.size()) {
    const std::size_t piece = std::min<std::size_t>(bytes.size() - done, std::size_t{1} << 30);
    const ssize_t n = ::pwrite(fd_, bytes.data() + done, piece,
                               static_cast<off_t>(offset) + static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      throw core::internal_error(fmt::format("write failed: {}", errno_text()),
                                 {.file = temporary_});
    }
    done += static_cast<std::size_t>(n);
  }
}

void LocalFileWriter::truncate(std::int64_t size) {
  if (::ftruncate(fd_, static_cast<off_t>(size)) != 0)
    throw core::internal_error(fmt::format("truncate failed: {}", errno_text()),
                               {.file = temporary_});
}

void LocalFileWriter::commit() {
  if (::close(fd_) != 0) {
    fd_ = -1;
    ::unlink(temporary_.c_str());
    throw core::internal_error(fmt::format("close failed: {}", errno_text()), {.file = temporary_});
  }
  fd_ = -1;
  try {
    core::rename_path(temporary_, path_);
  } catch (...) {
    ::unlink(temporary_.c_str());
    throw;
  }
}

ParityFileWriter::ParityFileWriter(const std::string& path, const json& header,
                                   const std::string& recycle)
    : file_(path, recycle) {
  const std::string prefix = prefixed(kParityMagic, header);
  file_.write_at(0, std::as_bytes(std::span(prefix.data(), prefix.size())));
  at_ = static_cast<std::int64_t>(prefix.size());
}

void ParityFileWriter::append(std::span<const std::byte> bytes) {
  file_.write_at(at_, bytes);
  hash_.update(bytes);
  at_ += static_cast<std::int64_t>(bytes.size());
}

void ParityFileWriter::commit() {
  std::string tail;
  put_u64(tail, hash_.digest());
  file_.write_at(at_, std::as_bytes(std::span(tail.data(), tail.size())));
  file_.truncate(at_ + static_cast<std::int64_t>(tail.size()));
  file_.commit();
}

// ---- reading -------------------------------------------------------------------------------

void read_file_bytes(const std::string& path, std::int64_t offset, std::span<std::byte> out) {
  const Fd f(core::open_regular_file(path, "a node-local checkpoint file"));
  pread_all(f.fd, path, offset, out);
}

namespace {

// Checks the prefix and header of a local file; returns the header, or throws a bad_input
// Error naming the file.
json read_header(int fd, const std::string& path, std::int64_t file_bytes,
                 std::string_view& magic_found, std::int64_t& payload_offset) {
  if (file_bytes < kPrefixBytes)
    throw core::bad_input("truncated: shorter than its header", {.file = path});
  std::array<std::byte, kPrefixBytes> prefix{};
  pread_all(fd, path, 0, prefix);
  const std::string_view magic(reinterpret_cast<const char*>(prefix.data()), 8);  // NOLINT
  if (magic == kStateMagic) {
    magic_found = kStateMagic;
  } else if (magic == kParityMagic) {
    magic_found = kParityMagic;
  } else {
    throw core::bad_input("not a node-local checkpoint file (bad magic)", {.file = path});
  }
  std::uint64_t length = 0;
  std::uint64_t hash = 0;
  std::memcpy(&length, prefix.data() + 8, 8);
  std::memcpy(&hash, prefix.data() + 16, 8);
  if (length > static_cast<std::uint64_t>(file_bytes - kPrefixBytes) || length > (64ULL << 20))
    throw core::bad_input("truncated or damaged header", {.file = path});
  std::string text(static_cast<std::size_t>(length), '\0');
  pread_all(fd, path, kPrefixBytes, std::as_writable_bytes(std::span(text.data(), text.size())));
  if (xxh64(std::as_bytes(std::span(text.data(), text.size()))) != hash)
    throw core::bad_input("header checksum mismatch", {.file = path});
  payload_offset = kPrefixBytes + static_cast<std::int64_t>(length);
  return core::parse_json(text, "a node-local checkpoint header", {.file = path});
}

std::int64_t file_size_of(int fd, const std::string& path) {
  struct stat st {};
  if (::fstat(fd, &st) != 0)
    throw core::internal_error(fmt::format("stat failed: {}", errno_text()), {.file = path});
  return static_cast<std::int64_t>(st.st_size);
}

// Checks the slices of a state held in memory against the header's checksums; bad_input Error
// naming the file and the slice otherwise.
void check_state_slices(const json& header, const RankState& s, const std::string& path) {
  const auto n = static_cast<std::int64_t>(s.master.size());
  for (const json& slice : header.at("slices")) {
    const std::int64_t position = slice.at(3).get<std::int64_t>();
    const std::int64_t count = slice.at(2).get<std::int64_t>();
    if (position < 0 || count < 0 || position + count > n)
      throw core::bad_input("a slice lies outside the state", {.file = path});
    const auto at = static_cast<std::size_t>(position);
    const auto c = static_cast<std::size_t>(count);
    const std::array<const std::vector<float>*, 3> arrays{&s.master, &s.exp_avg, &s.exp_avg_sq};
    for (std::size_t a = 0; a < 3; ++a) {
      if (to_hex(xxh64(bytes_of({arrays[a]->data() + at, c}))) !=
          slice.at(4 + a).get<std::string>()) {
        throw core::bad_input(
            fmt::format("checksum mismatch in tensor {} at element {} ({})",
                        slice.at(0).get<std::int64_t>(), slice.at(1).get<std::int64_t>(),
                        std::array{"master", "exp_avg", "exp_avg_sq"}[a]),
            {.file = path});
      }
    }
  }
}

// The same check reading the file piece by piece (8 MiB at a time), without holding the state.
void check_state_file_slices(int fd, const std::string& path, const json& header,
                             std::int64_t payload) {
  const std::int64_t values = header.at("values").get<std::int64_t>();
  std::vector<std::byte> piece(std::size_t{8} << 20);
  for (const json& slice : header.at("slices")) {
    const std::int64_t position = slice.at(3).get<std::int64_t>();
    const std::int64_t count = slice.at(2).get<std::int64_t>();
    if (position < 0 || count < 0 || position + count > values)
      throw core::bad_input("a slice lies outside the state", {.file = path});
    for (std::size_t a = 0; a < 3; ++a) {
      Xxh64Stream hash;
      const std::int64_t begin = payload + (static_cast<std::int64_t>(a) * values + position) * 4;
      for (std::int64_t at = 0; at < count * 4; at += static_cast<std::int64_t>(piece.size())) {
        const std::span<std::byte> part(
            piece.data(), static_cast<std::size_t>(std::min<std::int64_t>(
                              count * 4 - at, static_cast<std::int64_t>(piece.size()))));
        pread_all(fd, path, begin + at, part);
        hash.update(part);
      }
      if (to_hex(hash.digest()) != slice.at(4 + a).get<std::string>()) {
        throw core::bad_input(
            fmt::format("checksum mismatch in tensor {} at element {} ({})",
                        slice.at(0).get<std::int64_t>(), slice.at(1).get<std::int64_t>(),
                        std::array{"master", "exp_avg", "exp_avg_sq"}[a]),
            {.file = path});
      }
    }
  }
}

// The header's count of values per array, checked against the file's size before anything is
// allocated for them: a state takes three arrays of `values` floats after the header.
std::int64_t checked_values(const json& header, const std::string& path, std::int64_t bytes,
                            std::int64_t payload) {
  const std::int64_t values = header.at("values").get<std::int64_t>();
  const std::int64_t room = bytes - payload;
  if (values < 0 || room < 0 || values > room / 12 || 12 * values != room) {
    throw core::bad_input(
        fmt::format("{} bytes, its header says {} values per array ({} bytes)", bytes, values,
                    values >= 0 && values <= room ? payload + 12 * values : -1),
        {.file = path});
  }
  return values;
}

// `parameters`: the trainable parameters of the model its manifest describes; every range lies
// within them, checked before anything is allocated (a sparse file of the size a header
// claiming 402 M values needs passes the size check, and would have taken 4.7 GB).
RankState state_from(int fd, const std::string& path, const json& header, std::int64_t payload,
                     std::int64_t parameters) {
  RankState s;
  std::vector<model::FlatRange> ranges;
  const std::int64_t values = header.at("values").get<std::int64_t>();
  if (values > parameters) {
    throw core::bad_input(fmt::format("its header says {} values per array, more than the {} "
                                      "trainable parameters of the model its manifest describes",
                                      values, parameters),
                          {.file = path});
  }
  std::int64_t total = 0;  // checked before allocating: the ranges must hold `values` in all
  for (const json& r : header.at("ranges")) {
    const model::FlatRange range{r.at(0).get<std::int64_t>(), r.at(1).get<std::int64_t>()};
    if (range.begin < 0 || range.end < range.begin || range.end > parameters ||
        range.end - range.begin > values - total)
      throw core::bad_input("its ranges do not add up to its values", {.file = path});
    total += range.end - range.begin;
    ranges.push_back(range);
  }
  if (total != values)
    throw core::bad_input("its ranges do not add up to its values", {.file = path});
  s.allocate(std::move(ranges));
  std::int64_t at = payload;
  for (std::vector<float>* a : {&s.master, &s.exp_avg, &s.exp_avg_sq}) {
    pread_all(fd, path, at, std::as_writable_bytes(std::span(*a)));
    at += static_cast<std::int64_t>(a->size() * sizeof(float));
  }
  return s;
}

}  // namespace

LocalFileCheck check_local_file(const std::string& path, bool checksums) {
  LocalFileCheck c;
  try {
    const Fd f(core::open_regular_file(path, "a node-local checkpoint file"));
    c.bytes = file_size_of(f.fd, path);
    std::string_view magic;
    c.header = read_header(f.fd, path, c.bytes, magic, c.payload_offset);
    if (magic == kStateMagic) {
      if (c.header.value("format", "") != kStateFormat || c.header.value("version", 0) != 1)
        throw core::bad_input("unknown format or version", {.file = path});
      (void)checked_values(c.header, path, c.bytes, c.payload_offset);
      if (checksums) check_state_file_slices(f.fd, path, c.header, c.payload_offset);
    } else {
      if (c.header.value("format", "") != kParityFormat || c.header.value("version", 0) != 1)
        throw core::bad_input("unknown format or version", {.file = path});
      const std::int64_t chunk = c.header.at("chunk").get<std::int64_t>();
      if (chunk < 0 || chunk > c.bytes || c.bytes != c.payload_offset + chunk + 8)
        throw core::bad_input(
            fmt::format("{} bytes, its header says {}", c.bytes, c.payload_offset + chunk + 8),
            {.file = path});
      if (checksums) {
        Xxh64Stream hash;
        std::vector<std::byte> piece(std::size_t{8} << 20);
        for (std::int64_t at = 0; at < chunk; at += static_cast<std::int64_t>(piece.size())) {
          const std::span<std::byte> part(
              piece.data(), static_cast<std::size_t>(std::min<std::int64_t>(
                                chunk - at, static_cast<std::int64_t>(piece.size()))));
          pread_all(f.fd, path, c.payload_offset + at, part);
          hash.update(part);
        }
        std::array<std::byte, 8> tail{};
        pread_all(f.fd, path, c.payload_offset + chunk, tail);
        std::uint64_t stored = 0;
        std::memcpy(&stored, tail.data(), 8);
        if (stored != hash.digest())
          throw core::bad_input("parity checksum mismatch", {.file = path});
      }
    }
    c.ok = true;
  } catch (const core::Error& e) {
    c.problem = e.what();
  } catch (const std::exception& e) {  // a header missing a field
    c.problem = fmt::format("{}: malformed header: {}", path, e.what());
  }
  return c;
}

LocalState read_local_state(const std::string& path) {
  const Fd f(core::open_regular_file(path, "a node-local checkpoint file"));
  const std::int64_t bytes = file_size_of(f.fd, path);
  std::string_view magic;
  std::int64_t payload = 0;
  const json header = read_header(f.fd, path, bytes, magic, payload);
  if (magic != kStateMagic || header.value("format", "") != kStateFormat)
    throw core::bad_input("not a node-local state file", {.file = path});
  try {
    LocalState out;
    (void)checked_values(header, path, bytes, payload);
    json manifest = header.at("manifest");
    manifest["tensors"] = json::array();
    out.manifest = Manifest::from_json(manifest, path);
    out.state = state_from(f.fd, path, header, payload, out.manifest.layout().total());
    check_state_slices(header, out.state, path);
    out.rank = header.at("rank").get<int>();
    out.world_size = header.at("world_size").get<int>();
    return out;
  } catch (const core::Error&) {
    throw;
  } catch (const std::exception& e) {
    throw core::bad_input(fmt::format("malformed header: {}", e.what()), {.file = path});
  }
}

}  // namespace l3::ckpt
