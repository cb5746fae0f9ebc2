// TensorBoard's event files: the CRC-32C and record framing against known answers, a reader
// that tells a record cut short from a damaged one, the writer's records decoded, and the trim
// a resumed run makes (steps after its checkpoint dropped, a torn tail cut, nothing else
// touched). The files read back by an independent decoder: tests/fault/tensorboard_test.sh.
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "catch.hpp"
#include "core/log.hpp"
#include "temp_dir.hpp"
#include "train/tensorboard/event.pb.h"
#include "train/tensorboard/event_file.hpp"
#include "train/tensorboard/record_framing.hpp"
#include "train/tensorboard/tensorboard_writer.hpp"

namespace {

namespace tb = l3::train::tensorboard;
using l3::tensorboard_events::Event;
using Result = tb::RecordReader::Result;

std::vector<Event> read_events(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  tb::RecordReader reader(in);
  std::vector<Event> events;
  std::string data;
  while (reader.next(data) == Result::record) {
    Event e;
    REQUIRE(e.ParseFromString(data));
    events.push_back(e);
  }
  return events;
}

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

nlohmann::json train_record(std::int64_t step, double loss) {
  return {{"kind", "train"},  {"step", step},   {"loss", loss},
          {"skipped", false}, {"mfu", nullptr}, {"lr", 1e-4}};
}

}  // namespace

TEST_CASE("CRC-32C and its mask: the known answers", "[tensorboard]") {
  CHECK(tb::crc32c("") == 0U);
  CHECK(tb::crc32c("123456789") == 0xE3069283U);            // the check value of CRC-32C (RFC 3720)
  CHECK(tb::crc32c(std::string(32, '\0')) == 0x8A9136AAU);  // RFC 3720's 32 zero bytes
  const std::uint32_t crc = tb::crc32c("123456789");
  CHECK(tb::masked_crc32c("123456789") == ((crc >> 15U) | (crc << 17U)) + 0xa282ead8U);
}

TEST_CASE("records: framed, read back, cut short or damaged told apart", "[tensorboard]") {
  const std::string first = tb::frame_record("hello");
  CHECK(first.size() == 8 + 4 + 5 + 4);
  CHECK(first.substr(0, 8) == std::string("\x05\0\0\0\0\0\0\0", 8));
  const std::string both = first + tb::frame_record(std::string(3000, 'x'));
  std::string data;
  {
    std::istringstream in(both);
    tb::RecordReader reader(in);
    REQUIRE(reader.next(data) == Result::record);
    CHECK(data == "hello");
    REQUIRE(reader.next(data) == Result::record);
    CHECK(reader.offset() == first.size());
    CHECK(data == std::string(3000, 'x'));
    CHECK(reader.next(data) == Result::end);
  }
  for (const std::size_t cut : {first.size() + 3, first.size() + 12 + 100, both.size() - 1}) {
    std::istringstream in(both.substr(0, cut));
    tb::RecordReader reader(in);
    REQUIRE(reader.next(data) == Result::record);
    CHECK(reader.next(data) == Result::cut_short);
  }
  std::string damaged = both;
  damaged[first.size() + 12 + 7] ^= 1;  // a bit of the second record's data
  std::istringstream in(damaged);
  tb::RecordReader reader(in);
  REQUIRE(reader.next(data) == Result::record);
  CHECK(reader.next(data) == Result::damaged);
  std::string bad_length = both;
  bad_length[0] ^= 1;
  std::istringstream in2(bad_length);
  tb::RecordReader reader2(in2);
  CHECK(reader2.next(data) == Result::damaged);
}

TEST_CASE("the writer: a version record, then every number as a scalar at its step",
          "[tensorboard]") {
  const l3::test::TempDir dir;
  const l3::core::Logger log;
  std::string path;
  {
    tb::TensorBoardWriter writer(dir.path() / "tb", l3::Phase::sft, "run-a", std::nullopt, log);
    path = writer.path();
    writer.write(train_record(1, 2.5));
    writer.write({{"kind", "eval"}, {"step", 1}, {"loss", 0.0}, {"rewards/accuracies", 0.75}});
    writer.write({{"kind", "run"}, {"step", 0}, {"ranks", 2}});  // not a metric: not written
    writer.sync();
  }
  CHECK(std::filesystem::path(path).filename().string().ends_with(".llama3-hpc-sft"));
  const std::vector<Event> events = read_events(path);
  REQUIRE(events.size() == 3);
  CHECK(events[0].file_version() == "brain.Event:2");
  CHECK(events[0].source_metadata().writer() == "llama3-hpc");
  CHECK(events[0].source_metadata().llama3_hpc_run() == "run-a");
  CHECK(events[1].step() == 1);
  CHECK(events[1].wall_time() > 1.6e9);
  std::vector<std::pair<std::string, float>> values;
  for (const auto& v : events[1].summary().value()) values.emplace_back(v.tag(), v.simple_value());
  // Tags in the record's key order (nlohmann sorts them); the null MFU is left out.
  CHECK(values == std::vector<std::pair<std::string, float>>{
                      {"train/loss", 2.5F}, {"train/lr", 1e-4F}, {"train/skipped", 0.0F}});
  REQUIRE(events[2].summary().value_size() == 2);
  CHECK(events[2].summary().value(0).tag() == "eval/loss");
  CHECK(events[2].summary().value(0).has_simple_value());  // a 0 is written, not left out
  CHECK(events[2].summary().value(1).tag() == "eval/rewards/accuracies");
}

TEST_CASE("a resumed run: later steps dropped, a torn tail cut, the new file sorts last",
          "[tensorboard]") {
  const l3::test::TempDir dir;
  const std::string tb_dir = (dir.path() / "tb").string();
  const l3::core::Logger log;
  std::string killed;
  {
    tb::TensorBoardWriter writer(tb_dir, l3::Phase::sft, "run-a", std::nullopt, log);
    killed = writer.path();
    for (int step = 1; step <= 5; ++step) writer.write(train_record(step, 1.0 / step));
  }
  std::filesystem::resize_file(killed, std::filesystem::file_size(killed) - 3);
  // Another phase's file and another program's file in the same directory are not touched.
  std::string other_phase;
  {
    tb::TensorBoardWriter writer(tb_dir, l3::Phase::dpo, "run-a", std::nullopt, log);
    other_phase = writer.path();
    writer.write(train_record(9, 1.0));
  }
  const std::string foreign = tb_dir + "/events.out.tfevents.1.host.1";
  std::ofstream(foreign) << "not ours";
  const std::string other_bytes = file_bytes(other_phase);

  std::string resumed;
  {
    tb::TensorBoardWriter writer(tb_dir, l3::Phase::sft, "run-a", std::int64_t{3}, log);
    resumed = writer.path();
    writer.write(train_record(4, 0.2));
  }
  CHECK(resumed > killed);  // TensorBoard reads the files in name order
  std::vector<std::int64_t> steps;
  for (const Event& e : read_events(killed)) {
    if (e.has_summary()) steps.push_back(e.step());
  }
  CHECK(steps == std::vector<std::int64_t>{1, 2, 3});
  REQUIRE(read_events(resumed).size() == 2);
  CHECK(file_bytes(other_phase) == other_bytes);
  CHECK(file_bytes(foreign) == "not ours");

  // Nothing after the step: the files stay as they are, byte for byte.
  const std::string before = file_bytes(killed);
  const tb::TrimReport again = tb::drop_steps_after(tb_dir, l3::Phase::sft, "run-a", 4);
  CHECK(again.files_rewritten == 0);
  CHECK(again.events_dropped == 0);
  CHECK(file_bytes(killed) == before);

  // Resumed from before every step of a file: the file goes, its successors' steps too.
  const tb::TrimReport all = tb::drop_steps_after(tb_dir, l3::Phase::sft, "run-a", 0);
  CHECK(all.files_removed == 2);
  CHECK(tb::event_files(tb_dir, l3::Phase::sft).empty());
}

TEST_CASE("a resumed run trims only the event files it wrote, identified by their first event",
          "[tensorboard]") {
  const l3::test::TempDir dir;
  const std::string tb_dir = (dir.path() / "tb").string();
  const l3::core::Logger log;
  // Another run of the same phase in the same directory (another id), steps 1 to 4.
  std::string other_run;
  {
    tb::TensorBoardWriter writer(tb_dir, l3::Phase::sft, "run-b", std::nullopt, log);
    other_run = writer.path();
    for (int step = 1; step <= 4; ++step) writer.write(train_record(step, 1.0));
  }
  // Files named as ours that no run of ours can be told from: not TFRecords, one cut inside its
  // first record, one of an earlier version (no run id).
  const std::string not_records = tb_dir + "/events.out.tfevents.5.h.1.llama3-hpc-sft";
  std::ofstream(not_records) << "notes, not records";
  std::string cut_first;
  {
    tb::TensorBoardWriter writer(tb_dir, l3::Phase::sft, "run-a", std::nullopt, log);
    cut_first = writer.path();
  }
  std::filesystem::resize_file(cut_first, std::filesystem::file_size(cut_first) - 2);
  std::string ours;
  {
    tb::TensorBoardWriter writer(tb_dir, l3::Phase::sft, "run-a", std::nullopt, log);
    ours = writer.path();
    for (int step = 1; step <= 4; ++step) writer.write(train_record(step, 1.0));
  }
  CHECK(tb::event_file_run(ours) == "run-a");
  CHECK(tb::event_file_run(other_run) == "run-b");
  CHECK(tb::event_file_run(not_records).empty());
  CHECK(tb::event_file_run(cut_first).empty());
  const std::string other_bytes = file_bytes(other_run);
  const std::string cut_bytes = file_bytes(cut_first);

  const tb::TrimReport trim = tb::drop_steps_after(tb_dir, l3::Phase::sft, "run-a", 2);
  CHECK(trim.events_dropped == 2);  // this run's steps 3 and 4 only
  CHECK(trim.files_rewritten == 1);
  CHECK(trim.files_removed == 0);
  CHECK(file_bytes(other_run) == other_bytes);
  CHECK(file_bytes(cut_first) == cut_bytes);
  CHECK(file_bytes(not_records) == "notes, not records");
  std::vector<std::int64_t> steps;
  for (const Event& e : read_events(ours)) {
    if (e.has_summary()) steps.push_back(e.step());
  }
  CHECK(steps == std::vector<std::int64_t>{1, 2});

  // Resumed from before all its steps: only this run's file goes.
  const tb::TrimReport all = tb::drop_steps_after(tb_dir, l3::Phase::sft, "run-a", 0);
  CHECK(all.files_removed == 1);
  CHECK_FALSE(std::filesystem::exists(ours));
  CHECK(std::filesystem::exists(other_run));
  CHECK(std::filesystem::exists(cut_first));
  CHECK(std::filesystem::exists(not_records));
  // Without an id (a checkpoint of an earlier version) nothing is touched.
  CHECK(tb::drop_steps_after(tb_dir, l3::Phase::sft, "", 0).events_dropped == 0);
  CHECK(file_bytes(other_run) == other_bytes);
}
