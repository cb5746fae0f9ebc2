#include "core/error.hpp"

#include <array>
#include <boost/program_options/errors.hpp>
#include <cstring>
#include <filesystem>
#include <new>
#include <system_error>

#include "l3/l3.hpp"

namespace l3::core {

Error::Error(ErrorKind kind, std::string message, ErrorContext context)
    : std::runtime_error(message),
      kind_(kind),
      message_(std::move(message)),
      context_(std::move(context)) {
  render();
}

int Error::exit_code() const noexcept {
  switch (kind_) {
    case ErrorKind::internal:
      return kExitInternal;
    case ErrorKind::stopped:
      return kExitCheckpointed;
    case ErrorKind::usage:
    case ErrorKind::bad_input:
      break;
  }
  return kExitBadInput;
}

Error& Error::add_context(const ErrorContext& outer) {
  if (context_.file.empty()) context_.file = outer.file;
  if (context_.tensor.empty()) context_.tensor = outer.tensor;
  if (context_.record.empty()) context_.record = outer.record;
  if (context_.line == 0) context_.line = outer.line;
  render();
  return *this;
}

void Error::render() {
  std::string text;
  if (!context_.file.empty()) {
    text += context_.line > 0 ? context_.file + ":" + std::to_string(context_.line) + ": "
                              : context_.file + ": ";
  }
  if (!context_.tensor.empty()) text += "tensor '" + context_.tensor + "': ";
  if (!context_.record.empty()) text += "record " + context_.record + ": ";
  text += message_;
  text_ = one_line(text);
}

Error usage_error(std::string message) { return {ErrorKind::usage, std::move(message)}; }

Error bad_input(std::string message, ErrorContext context) {
  return {ErrorKind::bad_input, std::move(message), std::move(context)};
}

Error internal_error(std::string message, ErrorContext context) {
  return {ErrorKind::internal, std::move(message), std::move(context)};
}

Error stopped_before_start(std::string message) { return {ErrorKind::stopped, std::move(message)}; }

std::string one_line(std::string_view text) {
  // A run of control characters (the newlines of a multi-line library message), together with
  // the blanks around it, becomes one space; other spaces are kept as they are.
  std::string out;
  out.reserve(text.size());
  bool pending_space = false;
  for (const char c : text) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      while (!out.empty() && out.back() == ' ') out.pop_back();
      pending_space = true;
      continue;
    }
    if (pending_space) {
      if (c == ' ') continue;
      if (!out.empty()) out += ' ';
      pending_space = false;
    }
    out += c;
  }
  const auto first = out.find_first_not_of(' ');
  if (first == std::string::npos) return {};
  return out.substr(first, out.find_last_not_of(' ') - first + 1);
}

namespace {

// A file system call that failed on a path the user gave: a link loop, a name too long, a
// missing or unreadable entry, a file where a directory should be, are the input's problems
// (exit 2) and are said so, naming the path; anything else (an I/O error, a full disk) is not.
ErrorSummary filesystem_summary(const std::filesystem::filesystem_error& e) {
  const std::error_code code = e.code();
  std::string_view why;
  if (code == std::errc::too_many_symbolic_link_levels) {
    why = "too many levels of symbolic links (a link loop?)";
  } else if (code == std::errc::filename_too_long) {
    why = "the name is too long for the file system";
  } else if (code == std::errc::not_a_directory) {
    why = "a part of the path is not a directory";
  } else if (code == std::errc::no_such_file_or_directory) {
    why = "no such file or directory";
  } else if (code == std::errc::permission_denied || code == std::errc::operation_not_permitted) {
    why = "permission denied";
  } else if (code == std::errc::read_only_file_system) {
    why = "read-only file system";
  } else if (code == std::errc::is_a_directory) {
    why = "is a directory";
  }
  const std::string path = e.path1().string();
  if (why.empty()) return {kExitInternal, one_line(e.what())};
  return {kExitBadInput,
          one_line(path.empty() ? std::string(why) : path + ": " + std::string(why))};
}

}  // namespace

ErrorSummary summarize(const std::exception_ptr& error) noexcept {
  try {
    try {
      std::rethrow_exception(error);
    } catch (const Error& e) {
      return {e.exit_code(), e.what()};
    } catch (const PeerFailure& e) {
      return {e.exit_code(), ""};
    } catch (const l3::Error& e) {  // from the public API (the CLI's training commands use it)
      return {e.exit_code(), e.from_another_rank() ? std::string() : one_line(e.what())};
    } catch (const boost::program_options::error& e) {
      return {kExitBadInput, one_line(e.what())};
    } catch (const std::bad_alloc&) {
      return {kExitInternal, "out of memory"};
    } catch (const std::filesystem::filesystem_error& e) {
      return filesystem_summary(e);
    } catch (const std::system_error& e) {
      return {kExitInternal, one_line(e.what())};
    } catch (const std::exception& e) {
      return {kExitInternal, one_line(e.what())};
    } catch (...) {
      return {kExitInternal, "unknown exception"};
    }
  } catch (...) {
    return {kExitInternal, "unknown exception (and describing it failed)"};
  }
}

std::string errno_text(int error) {
  std::array<char, 256> buffer{};
  // The GNU strerror_r returns the text (maybe not in `buffer`).
  return ::strerror_r(error, buffer.data(), buffer.size());
}

}  // namespace l3::core
