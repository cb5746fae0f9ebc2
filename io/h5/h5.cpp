#include "io/h5/h5.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "core/error.hpp"
#include "core/hdf5_lock.hpp"
#include "core/input_file.hpp"

namespace l3::h5 {

namespace {

template <typename T>
hid_t memory_type();
template <>
hid_t memory_type<std::uint32_t>() {
  return H5T_NATIVE_UINT32;
}
template <>
hid_t memory_type<std::int32_t>() {
  return H5T_NATIVE_INT32;
}
template <>
hid_t memory_type<std::uint8_t>() {
  return H5T_NATIVE_UINT8;
}
template <>
hid_t memory_type<std::int64_t>() {
  return H5T_NATIVE_INT64;
}
template <>
hid_t memory_type<float>() {
  return H5T_NATIVE_FLOAT;
}
template <>
hid_t memory_type<double>() {
  return H5T_NATIVE_DOUBLE;
}

// The standard (file) type written for each element type: explicit little-endian, so shards
// are the same bytes everywhere.
template <typename T>
hid_t file_type();
template <>
hid_t file_type<std::uint32_t>() {
  return H5T_STD_U32LE;
}
template <>
hid_t file_type<std::int32_t>() {
  return H5T_STD_I32LE;
}
template <>
hid_t file_type<std::uint8_t>() {
  return H5T_STD_U8LE;
}
template <>
hid_t file_type<std::int64_t>() {
  return H5T_STD_I64LE;
}
template <>
hid_t file_type<float>() {
  return H5T_IEEE_F32LE;
}
template <>
hid_t file_type<double>() {
  return H5T_IEEE_F64LE;
}

core::Error failure(const std::string& what, const std::string& file,
                    const std::string& object = {}) {
  return core::bad_input(what, {.file = file, .tensor = object});
}

}  // namespace

std::recursive_mutex& library_lock() { return core::hdf5_library_lock(); }

void quiet_errors() {
  const std::scoped_lock guard(library_lock());
  H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
}

void Handle::reset() noexcept {
  if (id_ >= 0 && closer_ != nullptr) {
    const std::scoped_lock guard(library_lock());
    closer_(id_);
  }
  id_ = H5I_INVALID_HID;
}

namespace {
Handle create(const std::string& path, unsigned flags) {
  quiet_errors();
  const std::scoped_lock guard(library_lock());
  const hid_t id = H5Fcreate(path.c_str(), flags, H5P_DEFAULT, H5P_DEFAULT);
  if (id < 0) throw core::internal_error("cannot create HDF5 file", {.file = path});
  return {id, H5Fclose};
}
}  // namespace

Handle create_file(const std::string& path) { return create(path, H5F_ACC_TRUNC); }
Handle create_new_file(const std::string& path) {
  // H5F_ACC_EXCL opens with O_CREAT | O_EXCL: an existing entry, a link included, is an error.
  return create(path, H5F_ACC_EXCL);
}

Handle open_file_read(const std::string& path) {
  core::require_regular_file(path, "an HDF5 file");
  quiet_errors();
  const std::scoped_lock guard(library_lock());
  const hid_t id = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (id < 0) throw failure("cannot open as HDF5 (missing, truncated or not HDF5)", path);
  return {id, H5Fclose};
}

void flush_file(const Handle& file, const std::string& path) {
  const std::scoped_lock guard(library_lock());
  if (H5Fflush(file.get(), H5F_SCOPE_GLOBAL) < 0)
    throw core::internal_error("cannot flush", {.file = path});
}

Handle create_group(const Handle& parent, const std::string& name, const std::string& file) {
  const std::scoped_lock guard(library_lock());
  const hid_t id = H5Gcreate2(parent.get(), name.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  if (id < 0) throw core::internal_error("cannot create group", {.file = file, .tensor = name});
  return {id, H5Gclose};
}

bool exists(const Handle& parent, const std::string& name) {
  const std::scoped_lock guard(library_lock());
  return H5Lexists(parent.get(), name.c_str(), H5P_DEFAULT) > 0;
}

template <typename T>
void write_dataset(const Handle& parent, const std::string& name, std::span<const T> values,
                   const std::string& file) {
  const std::scoped_lock guard(library_lock());
  const hsize_t dims[1] = {values.size()};
  const Handle space(H5Screate_simple(1, dims, nullptr), H5Sclose);
  const Handle set(H5Dcreate2(parent.get(), name.c_str(), file_type<T>(), space.get(), H5P_DEFAULT,
                              H5P_DEFAULT, H5P_DEFAULT),
                   H5Dclose);
  if (!set.valid())
    throw core::internal_error("cannot create dataset", {.file = file, .tensor = name});
  if (!values.empty() &&
      H5Dwrite(set.get(), memory_type<T>(), H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()) < 0) {
    throw core::internal_error("cannot write dataset", {.file = file, .tensor = name});
  }
}

std::int64_t dataset_length(const Handle& parent, const std::string& name,
                            const std::string& file) {
  const std::scoped_lock guard(library_lock());
  const Handle set(H5Dopen2(parent.get(), name.c_str(), H5P_DEFAULT), H5Dclose);
  if (!set.valid()) throw failure("missing dataset", file, name);
  const Handle space(H5Dget_space(set.get()), H5Sclose);
  if (H5Sget_simple_extent_ndims(space.get()) != 1)
    throw failure("dataset is not one-dimensional", file, name);
  hsize_t dims[1] = {0};
  H5Sget_simple_extent_dims(space.get(), dims, nullptr);
  // A dataspace can declare any length while the file stores nothing (HDF5 fills unwritten
  // elements): the length is believed only as far as the bytes stored, so that a damaged or
  // crafted shard cannot make a reader allocate terabytes.
  const Handle type(H5Dget_type(set.get()), H5Tclose);
  const auto element = static_cast<hsize_t>(H5Tget_size(type.get()));
  const hsize_t stored = H5Dget_storage_size(set.get());
  if (element == 0 || dims[0] > stored / element) {
    throw failure(
        fmt::format("declares {} elements but stores {} bytes (a damaged file)", dims[0], stored),
        file, name);
  }
  return static_cast<std::int64_t>(dims[0]);
}

template <typename T>
std::vector<T> read_dataset(const Handle& parent, const std::string& name,
                            const std::string& file) {
  const std::scoped_lock guard(library_lock());
  const std::int64_t length = dataset_length(parent, name, file);
  const Handle set(H5Dopen2(parent.get(), name.c_str(), H5P_DEFAULT), H5Dclose);
  const Handle type(H5Dget_type(set.get()), H5Tclose);
  const Handle native(H5Tget_native_type(type.get(), H5T_DIR_ASCEND), H5Tclose);
  if (H5Tequal(native.get(), memory_type<T>()) <= 0) {
    throw failure(fmt::format("wrong element type (expected {} bytes per element, {})", sizeof(T),
                              H5Tget_class(type.get()) == H5T_INTEGER ? "integer" : "other class"),
                  file, name);
  }
  std::vector<T> values(static_cast<std::size_t>(length));
  if (length > 0 &&
      H5Dread(set.get(), memory_type<T>(), H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()) < 0) {
    throw failure("cannot read dataset (truncated file?)", file, name);
  }
  return values;
}

#define L3_H5_INSTANTIATE(T)                                                            \
  template void write_dataset<T>(const Handle&, const std::string&, std::span<const T>, \
                                 const std::string&);                                   \
  template std::vector<T> read_dataset<T>(const Handle&, const std::string&, const std::string&);
L3_H5_INSTANTIATE(std::uint32_t)
L3_H5_INSTANTIATE(std::int32_t)
L3_H5_INSTANTIATE(std::uint8_t)
L3_H5_INSTANTIATE(std::int64_t)
L3_H5_INSTANTIATE(float)
L3_H5_INSTANTIATE(double)
#undef L3_H5_INSTANTIATE

void write_tensor(const Handle& parent, const std::string& name, std::span<const float> values,
                  std::span<const std::int64_t> shape, const std::string& file) {
  const std::scoped_lock guard(library_lock());
  std::vector<hsize_t> dims(shape.begin(), shape.end());
  std::int64_t numel = 1;
  for (const std::int64_t d : shape) numel *= d;
  if (numel != static_cast<std::int64_t>(values.size())) {
    throw core::internal_error(
        fmt::format("tensor of {} values written with a shape of {}", values.size(), numel),
        {.file = file, .tensor = name});
  }
  const Handle space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr),
                     H5Sclose);
  const Handle set(H5Dcreate2(parent.get(), name.c_str(), H5T_IEEE_F32LE, space.get(), H5P_DEFAULT,
                              H5P_DEFAULT, H5P_DEFAULT),
                   H5Dclose);
  if (!set.valid())
    throw core::internal_error("cannot create dataset", {.file = file, .tensor = name});
  if (!values.empty() &&
      H5Dwrite(set.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()) < 0) {
    throw core::internal_error("cannot write dataset", {.file = file, .tensor = name});
  }
}

std::vector<std::int64_t> dataset_shape(const Handle& parent, const std::string& name,
                                        const std::string& file) {
  const std::scoped_lock guard(library_lock());
  if (H5Lexists(parent.get(), name.c_str(), H5P_DEFAULT) <= 0)
    throw failure("missing tensor", file, name);
  const Handle set(H5Dopen2(parent.get(), name.c_str(), H5P_DEFAULT), H5Dclose);
  if (!set.valid()) throw failure("not a dataset", file, name);
  const Handle space(H5Dget_space(set.get()), H5Sclose);
  const int rank = H5Sget_simple_extent_ndims(space.get());
  if (rank < 0) throw failure("unreadable dataspace", file, name);
  std::vector<hsize_t> dims(static_cast<std::size_t>(rank));
  H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr);
  return {dims.begin(), dims.end()};
}

void read_tensor(const Handle& parent, const std::string& name, std::span<const std::int64_t> shape,
                 std::span<float> out, const std::string& file) {
  const std::scoped_lock guard(library_lock());
  const std::vector<std::int64_t> found = dataset_shape(parent, name, file);
  if (!std::equal(found.begin(), found.end(), shape.begin(), shape.end())) {
    throw failure(fmt::format("shape [{}] where the model needs [{}]", fmt::join(found, ", "),
                              fmt::join(shape, ", ")),
                  file, name);
  }
  const Handle set(H5Dopen2(parent.get(), name.c_str(), H5P_DEFAULT), H5Dclose);
  const Handle type(H5Dget_type(set.get()), H5Tclose);
  if (H5Tget_class(type.get()) != H5T_FLOAT)
    throw failure("not a floating-point tensor", file, name);
  if (!out.empty() &&
      H5Dread(set.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, out.data()) < 0) {
    throw failure("cannot read tensor (truncated file?)", file, name);
  }
}

void write_attribute(const Handle& object, const std::string& name, const std::string& value,
                     const std::string& file) {
  const std::scoped_lock guard(library_lock());
  const Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(type.get(), value.empty() ? 1 : value.size());
  H5Tset_strpad(type.get(), H5T_STR_NULLPAD);
  const Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  const Handle attr(
      H5Acreate2(object.get(), name.c_str(), type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT),
      H5Aclose);
  if (!attr.valid() || H5Awrite(attr.get(), type.get(), value.empty() ? "" : value.data()) < 0) {
    throw core::internal_error("cannot write attribute", {.file = file, .tensor = name});
  }
}

void write_attribute(const Handle& object, const std::string& name, std::int64_t value,
                     const std::string& file) {
  const std::scoped_lock guard(library_lock());
  const Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  const Handle attr(
      H5Acreate2(object.get(), name.c_str(), H5T_STD_I64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT),
      H5Aclose);
  if (!attr.valid() || H5Awrite(attr.get(), H5T_NATIVE_INT64, &value) < 0) {
    throw core::internal_error("cannot write attribute", {.file = file, .tensor = name});
  }
}

bool has_attribute(const Handle& object, const std::string& name, const std::string& file) {
  const std::scoped_lock guard(library_lock());
  const htri_t exists = H5Aexists(object.get(), name.c_str());
  if (exists < 0) throw failure("cannot look for attribute '" + name + "'", file);
  return exists > 0;
}

std::string read_string_attribute(const Handle& object, const std::string& name,
                                  const std::string& file) {
  const std::scoped_lock guard(library_lock());
  if (H5Aexists(object.get(), name.c_str()) <= 0)
    throw failure("missing attribute '" + name + "'", file);
  const Handle attr(H5Aopen(object.get(), name.c_str(), H5P_DEFAULT), H5Aclose);
  const Handle type(H5Aget_type(attr.get()), H5Tclose);
  if (H5Tget_class(type.get()) != H5T_STRING)
    throw failure("attribute '" + name + "' is not a string", file);
  if (H5Tis_variable_str(type.get()) > 0) {
    char* text = nullptr;
    const Handle mem(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(mem.get(), H5T_VARIABLE);
    if (H5Aread(attr.get(), mem.get(), &text) < 0)
      throw failure("cannot read attribute '" + name + "'", file);
    std::string value = text == nullptr ? "" : text;
    H5free_memory(text);
    return value;
  }
  const std::size_t size = H5Tget_size(type.get());
  std::string value(size, '\0');
  if (H5Aread(attr.get(), type.get(), value.data()) < 0)
    throw failure("cannot read attribute '" + name + "'", file);
  value.resize(value.find('\0') == std::string::npos ? size : value.find('\0'));
  return value;
}

std::int64_t read_int_attribute(const Handle& object, const std::string& name,
                                const std::string& file) {
  const std::scoped_lock guard(library_lock());
  if (H5Aexists(object.get(), name.c_str()) <= 0)
    throw failure("missing attribute '" + name + "'", file);
  const Handle attr(H5Aopen(object.get(), name.c_str(), H5P_DEFAULT), H5Aclose);
  std::int64_t value = 0;
  if (H5Aread(attr.get(), H5T_NATIVE_INT64, &value) < 0)
    throw failure("cannot read attribute '" + name + "'", file);
  return value;
}

}  // namespace l3::h5
