#include "ckpt/tensor_file.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string_view>

#include "core/durable_file.hpp"
#include "core/error.hpp"
#include "core/input_file.hpp"
#include "io/h5/h5.hpp"

namespace l3::ckpt {

static_assert(std::endian::native == std::endian::little,
              "raw checkpoint writes assume a little-endian host (the files are little-endian)");

namespace {

std::int64_t numel(std::span<const std::int64_t> shape) {
  std::int64_t n = 1;
  for (const std::int64_t d : shape) n *= d;
  return n;
}

// Creates the groups along `name` ("exp_avg/model.norm.weight" -> group "exp_avg").
void create_parents(hid_t file, const std::string& name, const std::string& path) {
  for (std::size_t slash = name.find('/'); slash != std::string::npos;
       slash = name.find('/', slash + 1)) {
    const std::string group = name.substr(0, slash);
    if (H5Lexists(file, group.c_str(), H5P_DEFAULT) > 0) continue;
    const h5::Handle g(H5Gcreate2(file, group.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                       H5Gclose);
    if (!g.valid())
      throw core::internal_error("cannot create group", {.file = path, .tensor = group});
  }
}

// Makes sure the file system will take `bytes` in `path` (space, RLIMIT_FSIZE, quotas) before
// HDF5 is involved: HDF5 extends the file when it closes it, and a failed close leaves the
// library with a half-closed file that crashes it at exit. The probe reserves the blocks
// (fallocate) where the file system supports that, else checks the size limit (ftruncate).
void probe_space(const std::string& path, std::int64_t bytes) {
  const int fd = core::create_exclusive(path);
  int rc = ::fallocate(fd, 0, 0, static_cast<off_t>(bytes));
  if (rc != 0 && (errno == EOPNOTSUPP || errno == ENOSYS))
    rc = ::ftruncate(fd, static_cast<off_t>(bytes));
  const int error = rc != 0 ? errno : 0;
  ::close(fd);
  if (error != 0) {
    throw core::internal_error(
        fmt::format("no room for {:.1f} MB: {}", static_cast<double>(bytes) / 1e6,
                    core::errno_text(error)),
        {.file = path});
  }
}

}  // namespace

std::vector<std::int64_t> create_tensor_file(const std::string& path,
                                             const std::vector<DatasetSpec>& sets,
                                             const FileAttributes& attributes) {
  std::vector<std::int64_t> offsets;
  offsets.reserve(sets.size());
  std::int64_t bytes = 1 << 20;  // metadata: well under 1 MiB for any Llama layout
  for (const DatasetSpec& s : sets)
    bytes += numel(s.shape) * static_cast<std::int64_t>(sizeof(float));
  probe_space(path, bytes);
  {
    const h5::Handle file = h5::create_file(path);
    const std::scoped_lock guard(h5::library_lock());
    const h5::Handle create(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
    H5Pset_layout(create.get(), H5D_CONTIGUOUS);
    H5Pset_alloc_time(create.get(), H5D_ALLOC_TIME_EARLY);
    H5Pset_fill_time(create.get(), H5D_FILL_TIME_NEVER);
    for (const DatasetSpec& s : sets) {
      create_parents(file.get(), s.name, path);
      const std::vector<hsize_t> dims(s.shape.begin(), s.shape.end());
      const h5::Handle space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
                             H5Sclose);
      const h5::Handle set(H5Dcreate2(file.get(), s.name.c_str(), H5T_IEEE_F32LE, space.get(),
                                      H5P_DEFAULT, create.get(), H5P_DEFAULT),
                           H5Dclose);
      if (!set.valid())
        throw core::internal_error("cannot create dataset", {.file = path, .tensor = s.name});
      const haddr_t address = H5Dget_offset(set.get());
      if (address == HADDR_UNDEF && numel(s.shape) > 0) {
        throw core::internal_error("dataset storage was not allocated",
                                   {.file = path, .tensor = s.name});
      }
      offsets.push_back(address == HADDR_UNDEF ? 0 : static_cast<std::int64_t>(address));
    }
    for (const auto& [name, value] : attributes.text) h5::write_attribute(file, name, value, path);
    for (const auto& [name, value] : attributes.integers)
      h5::write_attribute(file, name, value, path);
    h5::flush_file(file, path);
  }  // closed: metadata on disk before any rank writes data
  return offsets;
}

namespace {

constexpr std::size_t kDirectAlignment = 4096;                  // block and page size
constexpr std::size_t kStagingBytes = std::size_t{8} << 20U;    // per direct write
constexpr std::size_t kDirectMinimum = std::size_t{64} << 10U;  // smaller writes: buffered

bool direct_io_enabled() {
  const char* value = std::getenv("L3_CHECKPOINT_DIRECT_IO");
  return value == nullptr || std::string_view(value) != "0";
}

}  // namespace

// NOLINTNEXTLINE(cppcoreguidelines-no-malloc,cppcoreguidelines-owning-memory): aligned_alloc's pair
void RawFileWriter::FreeDeleter::operator()(void* p) const noexcept { std::free(p); }

RawFileWriter::RawFileWriter(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd_ < 0) {
    throw core::internal_error(fmt::format("cannot open for writing: {}", core::errno_text(errno)),
                               {.file = path});
  }
  if (direct_io_enabled()) {
    direct_fd_ = ::open(path.c_str(), O_WRONLY | O_CLOEXEC | O_DIRECT);
    if (direct_fd_ >= 0) {
      // Owned by staging_ (freed by FreeDeleter).
      void* staging = std::aligned_alloc(kDirectAlignment, kStagingBytes);  // NOLINT
      staging_.reset(static_cast<char*>(staging));                          // NOLINT
      if (!staging_) {
        ::close(direct_fd_);
        direct_fd_ = -1;
      }
    }
  }
}

RawFileWriter::~RawFileWriter() {
  if (direct_fd_ >= 0) ::close(direct_fd_);
  if (fd_ >= 0) ::close(fd_);
}

void RawFileWriter::write(std::int64_t dataset_offset, std::int64_t first,
                          std::span<const float> values) {
  const auto* bytes = reinterpret_cast<const char*>(values.data());  // NOLINT: raw I/O
  const std::size_t size = values.size_bytes();
  const auto at =
      static_cast<off_t>(dataset_offset + first * static_cast<std::int64_t>(sizeof(float)));
  if (direct_fd_ >= 0 && size >= kDirectMinimum) {
    // [at, begin) and [end, at + size) through the page cache, [begin, end) direct.
    const auto align = static_cast<off_t>(kDirectAlignment);
    const off_t begin = (at + align - 1) / align * align;
    const off_t end = (at + static_cast<off_t>(size)) / align * align;
    const auto head = static_cast<std::size_t>(begin - at);
    const auto middle = static_cast<std::size_t>(end - begin);
    write_direct(bytes + head, middle, begin);
    write_buffered(bytes, head, at);
    write_buffered(bytes + head + middle, size - head - middle, end);
    return;
  }
  write_buffered(bytes, size, at);
}

void RawFileWriter::write_direct(const char* bytes, std::size_t size, off_t at) {
  while (size > 0) {
    const std::size_t piece = std::min(size, kStagingBytes);
    std::memcpy(staging_.get(), bytes, piece);
    std::size_t done = 0;
    while (done < piece) {
      const ssize_t n =
          ::pwrite(direct_fd_, staging_.get() + done, piece - done, at + static_cast<off_t>(done));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && errno == EINVAL) {
        // The file system does not take these direct writes after all: buffered from here
        // on (what was written direct stays written).
        ::close(direct_fd_);
        direct_fd_ = -1;
        write_buffered(bytes + done, size - done, at + static_cast<off_t>(done));
        return;
      }
      if (n <= 0) {
        throw core::internal_error(fmt::format("write failed: {}", core::errno_text(errno)),
                                   {.file = path_});
      }
      done += static_cast<std::size_t>(n);
    }
    bytes += piece;
    at += static_cast<off_t>(piece);
    size -= piece;
  }
}

void RawFileWriter::write_buffered(const char* bytes, std::size_t size, off_t at) {
  std::size_t left = size;
  while (left > 0) {
    const ssize_t n = ::pwrite(fd_, bytes, std::min<std::size_t>(left, 1U << 30U), at);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      throw core::internal_error(fmt::format("write failed: {}", core::errno_text(errno)),
                                 {.file = path_});
    }
    bytes += n;
    left -= static_cast<std::size_t>(n);
    at += n;
  }
}

void RawFileWriter::sync() {
  if (::fsync(fd_) != 0) {
    throw core::internal_error(fmt::format("fsync failed: {}", core::errno_text(errno)),
                               {.file = path_});
  }
  // The data is on disk and nobody reads it soon: its page cache would only crowd out the
  // training's memory (a checkpoint is GBs). Clean pages only; a hint, so errors do not matter.
  (void)::posix_fadvise(fd_, 0, 0, POSIX_FADV_DONTNEED);
}

struct TensorFileReader::Impl {
  h5::Handle file;
  int fd = -1;
  std::map<std::string, Dataset, std::less<>> datasets;
  ~Impl() {
    if (fd >= 0) ::close(fd);
  }
  Impl() = default;
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;
  Impl(Impl&&) = delete;
  Impl& operator=(Impl&&) = delete;
};

TensorFileReader::TensorFileReader(const std::string& path)
    : path_(path), impl_(std::make_unique<Impl>()) {
  impl_->file = h5::open_file_read(path);
  impl_->fd = core::open_regular_file(path, "a checkpoint tensor file");
}

TensorFileReader::~TensorFileReader() = default;

const TensorFileReader::Dataset& TensorFileReader::dataset(const std::string& name) {
  const auto found = impl_->datasets.find(name);
  if (found != impl_->datasets.end()) return found->second;
  Dataset d;
  d.shape = h5::dataset_shape(impl_->file, name, path_);  // bad_input when missing
  const std::scoped_lock guard(h5::library_lock());
  const h5::Handle set(H5Dopen2(impl_->file.get(), name.c_str(), H5P_DEFAULT), H5Dclose);
  const h5::Handle type(H5Dget_type(set.get()), H5Tclose);
  const haddr_t address = H5Dget_offset(set.get());
  if (H5Tequal(type.get(), H5T_IEEE_F32LE) > 0 && address != HADDR_UNDEF)
    d.offset = static_cast<std::int64_t>(address);
  else if (H5Tget_class(type.get()) != H5T_FLOAT)
    throw core::bad_input("not a floating-point tensor", {.file = path_, .tensor = name});
  return impl_->datasets.emplace(name, std::move(d)).first->second;
}

void TensorFileReader::read(const std::string& name, std::span<const std::int64_t> shape,
                            std::int64_t first, std::span<float> out) {
  const Dataset& d = dataset(name);
  if (!std::equal(d.shape.begin(), d.shape.end(), shape.begin(), shape.end())) {
    throw core::bad_input(fmt::format("shape [{}] where [{}] is expected", fmt::join(d.shape, ", "),
                                      fmt::join(shape, ", ")),
                          {.file = path_, .tensor = name});
  }
  const std::int64_t total = numel(shape);
  if (first < 0 || first + static_cast<std::int64_t>(out.size()) > total) {
    throw core::internal_error(fmt::format("elements {}..{} of a tensor of {}", first,
                                           first + static_cast<std::int64_t>(out.size()), total),
                               {.file = path_, .tensor = name});
  }
  if (out.empty()) return;
  if (d.offset >= 0) {
    auto* bytes = reinterpret_cast<char*>(out.data());  // NOLINT: raw I/O
    std::size_t left = out.size_bytes();
    auto at = static_cast<off_t>(d.offset + first * static_cast<std::int64_t>(sizeof(float)));
    while (left > 0) {
      const ssize_t n = ::pread(impl_->fd, bytes, std::min<std::size_t>(left, 1U << 30U), at);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        throw core::bad_input(n == 0 ? "file ends inside the tensor (truncated?)"
                                     : fmt::format("read failed: {}", core::errno_text(errno)),
                              {.file = path_, .tensor = name});
      }
      bytes += n;
      left -= static_cast<std::size_t>(n);
      at += n;
    }
    return;
  }
  // Not contiguous fp32 (chunked, compressed, another float type): the whole tensor via HDF5.
  std::vector<float> whole(static_cast<std::size_t>(total));
  h5::read_tensor(impl_->file, name, shape, whole, path_);
  std::copy_n(whole.begin() + first, out.size(), out.begin());
}

std::string TensorFileReader::text_attribute(const std::string& name) const {
  return h5::read_string_attribute(impl_->file, name, path_);
}

std::int64_t TensorFileReader::integer_attribute(const std::string& name) const {
  return h5::read_int_attribute(impl_->file, name, path_);
}

}  // namespace l3::ckpt
