// The one process-wide lock around every HDF5 call. Debian's (and most sites') parallel HDF5 is
// not thread-safe: even a query such as H5get_libversion pushes an API context allocated from
// the library's free lists, and two threads in the library at once corrupt them (a double free
// or a crash at a random later point). io/h5/h5.hpp's library_lock() is this lock; code
// outside io/ that calls HDF5 (the version report) takes it here.
#pragma once

#include <mutex>

namespace l3::core {

[[nodiscard]] std::recursive_mutex& hdf5_library_lock();

}  // namespace l3::core
