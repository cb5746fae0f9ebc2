// A thin, safe layer over the HDF5 C API: owning handles, one process-wide lock around every
// call (Debian's and most sites' parallel HDF5 is not thread-safe, and the prefetch and
// asynchronous-checkpoint threads use it), and errors that name the file and the dataset
// instead of HDF5's printed error stack.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <vector>

namespace l3::h5 {

// The lock every HDF5 call of the process holds. Recursive: a helper may call another.
std::recursive_mutex& library_lock();

// Silences HDF5's own error printing (we throw instead); idempotent.
void quiet_errors();

class Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  Handle() noexcept = default;
  Handle(hid_t id, Closer closer) noexcept : id_(id), closer_(closer) {}
  ~Handle() { reset(); }
  Handle(Handle&& other) noexcept : id_(other.id_), closer_(other.closer_) {
    other.id_ = H5I_INVALID_HID;
  }
  Handle& operator=(Handle&& other) noexcept {
    if (this != &other) {
      reset();
      id_ = other.id_;
      closer_ = other.closer_;
      other.id_ = H5I_INVALID_HID;
    }
    return *this;
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  [[nodiscard]] hid_t get() const noexcept { return id_; }
  [[nodiscard]] bool valid() const noexcept { return id_ >= 0; }
  void reset() noexcept;
  // Gives up ownership without closing: the id stays open until the library shuts down.
  void release() noexcept { id_ = H5I_INVALID_HID; }

 private:
  hid_t id_ = H5I_INVALID_HID;
  Closer closer_ = nullptr;
};

// Files, written serially by this process. create_file(): truncates a file of ours that exists
// (a checkpoint file whose room was reserved); create_new_file(): fails when anything is at `path`
// (a file, a directory, a link: nothing is followed), for temporary names.
[[nodiscard]] Handle create_file(const std::string& path);
[[nodiscard]] Handle create_new_file(const std::string& path);
[[nodiscard]] Handle open_file_read(const std::string& path);
void flush_file(const Handle& file, const std::string& path);

[[nodiscard]] Handle create_group(const Handle& parent, const std::string& name,
                                  const std::string& file);
[[nodiscard]] bool exists(const Handle& parent, const std::string& name);

// A contiguous, unfiltered 1-D dataset written in one call.
template <typename T>
void write_dataset(const Handle& parent, const std::string& name, std::span<const T> values,
                   const std::string& file);
// Reads a whole 1-D dataset, checking its element type.
template <typename T>
[[nodiscard]] std::vector<T> read_dataset(const Handle& parent, const std::string& name,
                                          const std::string& file);
// Elements of a 1-D dataset (its dataspace extent).
[[nodiscard]] std::int64_t dataset_length(const Handle& parent, const std::string& name,
                                          const std::string& file);

// An N-dimensional fp32 tensor (row-major, contiguous), written in one call.
void write_tensor(const Handle& parent, const std::string& name, std::span<const float> values,
                  std::span<const std::int64_t> shape, const std::string& file);
// Reads an N-dimensional fp32 tensor whose shape must be `shape` into `out` (its size):
// bad_input Errors name the file and tensor (missing, wrong shape or type, unreadable).
void read_tensor(const Handle& parent, const std::string& name, std::span<const std::int64_t> shape,
                 std::span<float> out, const std::string& file);
// The shape of a dataset.
[[nodiscard]] std::vector<std::int64_t> dataset_shape(const Handle& parent, const std::string& name,
                                                      const std::string& file);

void write_attribute(const Handle& object, const std::string& name, const std::string& value,
                     const std::string& file);
void write_attribute(const Handle& object, const std::string& name, std::int64_t value,
                     const std::string& file);
[[nodiscard]] bool has_attribute(const Handle& object, const std::string& name,
                                 const std::string& file);
[[nodiscard]] std::string read_string_attribute(const Handle& object, const std::string& name,
                                                const std::string& file);
[[nodiscard]] std::int64_t read_int_attribute(const Handle& object, const std::string& name,
                                              const std::string& file);

}  // namespace l3::h5
