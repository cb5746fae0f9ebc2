#include "core/hdf5_lock.hpp"

namespace l3::core {

std::recursive_mutex& hdf5_library_lock() {
  static std::recursive_mutex lock;  // HDF5 itself is process-global state
  return lock;
}

}  // namespace l3::core
