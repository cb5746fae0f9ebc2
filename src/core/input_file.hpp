// Inputs are regular files. Anything else named where a file is expected is refused at once,
// naming it: opening a FIFO for reading blocks until some other process opens it for writing
// (forever, in a batch job), a device such as /dev/zero never ends, a socket cannot be opened,
// a directory holds no data. Symbolic links are followed: a link to a regular file is that file.
// (Standard input, where a command documents it, is read as a stream, not through these.)
#pragma once

#include <string>
#include <string_view>

namespace l3::core {

// bad_input Error naming `path` when what is there is not a regular file ("is a named pipe
// (FIFO), not a checkpoint manifest; inputs must be regular files"; `what` says what it should
// have been). Nothing there, or nothing that can be looked at: no error (the open that follows
// says why).
void require_regular_file(const std::string& path, std::string_view what);

// Opens `path` for reading and returns the descriptor (the caller closes it), without blocking
// on a FIFO: opened non-blocking, checked with fstat, then set back to blocking. bad_input Error
// naming the path when it cannot be opened or is not a regular file.
[[nodiscard]] int open_regular_file(const std::string& path, std::string_view what);

}  // namespace l3::core
