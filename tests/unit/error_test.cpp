#include "core/error.hpp"

#include <boost/program_options/errors.hpp>
#include <new>
#include <stdexcept>
#include <system_error>

#include "catch.hpp"

using l3::core::Error;
using l3::core::ErrorKind;

namespace {
l3::core::ErrorSummary summary_of(const std::exception_ptr& e) { return l3::core::summarize(e); }
}  // namespace

TEST_CASE("Error renders its context in front of the message", "[error]") {
  const Error e(ErrorKind::bad_input, "offsets are not monotonic",
                {.file = "data/shard-0.h5", .tensor = "/doc_offsets", .record = "12"});
  CHECK(std::string(e.what()) ==
        "data/shard-0.h5: tensor '/doc_offsets': record 12: offsets are not monotonic");
  CHECK(e.message() == "offsets are not monotonic");
  CHECK(e.exit_code() == l3::core::kExitBadInput);

  const Error bare(ErrorKind::internal, "boom");
  CHECK(std::string(bare.what()) == "boom");
  CHECK(bare.exit_code() == l3::core::kExitInternal);
}

TEST_CASE("a line of a text file renders as file:line", "[error]") {
  const Error e(ErrorKind::bad_input, "missing \"messages\"", {.file = "train.jsonl", .line = 17});
  CHECK(std::string(e.what()) == "train.jsonl:17: missing \"messages\"");
  Error inner = l3::core::bad_input("invalid UTF-8 at byte 3");
  inner.add_context({.file = "a.jsonl", .line = 2});
  CHECK(std::string(inner.what()) == "a.jsonl:2: invalid UTF-8 at byte 3");
}

TEST_CASE("add_context fills only what the thrower did not know", "[error]") {
  Error e = l3::core::bad_input("shape mismatch", {.tensor = "model.norm.weight"});
  e.add_context({.file = "ckpt/model.h5", .tensor = "ignored"});
  CHECK(std::string(e.what()) == "ckpt/model.h5: tensor 'model.norm.weight': shape mismatch");
  CHECK(e.context().tensor == "model.norm.weight");
}

TEST_CASE("messages stay on one line", "[error]") {
  const Error e = l3::core::usage_error("first line\nsecond\tline\r\n");
  CHECK(std::string(e.what()) == "first line second line");
  CHECK(l3::core::one_line("  a \n\n b  ") == "a b");
  CHECK(l3::core::one_line("keep  double  spaces") == "keep  double  spaces");
  CHECK(l3::core::one_line("\n\n").empty());
}

TEST_CASE("summarize maps every exception to an exit code and one line", "[error]") {
  auto usage = summary_of(std::make_exception_ptr(l3::core::usage_error("bad flag")));
  CHECK(usage.exit_code == 2);
  CHECK(usage.text == "bad flag");

  auto input = summary_of(std::make_exception_ptr(l3::core::bad_input("x", {.file = "f"})));
  CHECK(input.exit_code == 2);
  CHECK(input.text == "f: x");

  auto internal = summary_of(std::make_exception_ptr(l3::core::internal_error("mpi died")));
  CHECK(internal.exit_code == 1);

  auto po_error =
      summary_of(std::make_exception_ptr(boost::program_options::unknown_option("--nope")));
  CHECK(po_error.exit_code == 2);
  CHECK(po_error.text.find("--nope") != std::string::npos);

  auto oom = summary_of(std::make_exception_ptr(std::bad_alloc()));
  CHECK(oom.exit_code == 1);
  CHECK(oom.text == "out of memory");

  auto system = summary_of(std::make_exception_ptr(
      std::system_error(std::make_error_code(std::errc::no_space_on_device), "write ckpt")));
  CHECK(system.exit_code == 1);
  CHECK(system.text.find("write ckpt") != std::string::npos);

  auto plain = summary_of(std::make_exception_ptr(std::runtime_error("a\nb")));
  CHECK(plain.exit_code == 1);
  CHECK(plain.text == "a b");

  auto peer = summary_of(std::make_exception_ptr(l3::core::PeerFailure(2)));
  CHECK(peer.exit_code == 2);
  CHECK(peer.text.empty());  // the failing rank reports, its peers stay quiet

  auto unknown = summary_of(std::make_exception_ptr(42));
  CHECK(unknown.exit_code == 1);
  CHECK(unknown.text == "unknown exception");
}
