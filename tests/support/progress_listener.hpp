// A Catch2 listener that writes each test case's start, failed assertions and end to the file
// named by L3_TEST_PROGRESS_FILE (nothing without it), a flushed line at a time. Why: Catch2's
// JUnit report is written only when the whole run ends, so a suite killed by a time limit (a
// hang on a GPU node, where every minute is budgeted) leaves no report at all; this file still
// says which tests passed, which failed and where, and which one was running when it stopped.
// On a signal it handles (SIGTERM from `timeout`, SIGSEGV, ...) Catch2 fails and ends the running
// test, so its last lines are the signal as a failure and its end; on SIGKILL its start is last.
// Lines, tab-separated:
//   start <name>
//   fail  <file:line> <expression or message>
//   end   <name> passed|failed <seconds>
// Include once, from a main compiled with CATCH_CONFIG_EXTERNAL_INTERFACES (v2) or against v3.
#pragma once

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>

#include "catch.hpp"

#if L3_CATCH2_MAJOR >= 3
#include <catch2/reporters/catch_reporter_event_listener.hpp>
#include <catch2/reporters/catch_reporter_registrars.hpp>
#endif

namespace l3::test {

class ProgressLog {
 public:
  ProgressLog() {
    if (const char* path = std::getenv("L3_TEST_PROGRESS_FILE"); path != nullptr && *path != '\0') {
      file_.reset(std::fopen(path, "a"));
    }
  }

  // One line: the fields joined by tabs, with tabs and newlines inside a field made spaces so
  // that a line is always one record.
  template <typename... Fields>
  void line(const Fields&... fields) {
    if (!file_) return;
    std::string text;
    bool first = true;
    auto append = [&](std::string_view field) {
      if (!first) text += '\t';
      first = false;
      for (const char c : field) text += (c == '\t' || c == '\n' || c == '\r') ? ' ' : c;
    };
    (append(std::string_view(fields)), ...);
    text += '\n';
    std::fputs(text.c_str(), file_.get());
    std::fflush(file_.get());  // the point of the file: it survives a kill
  }

 private:
  struct Close {
    void operator()(std::FILE* file) const { std::fclose(file); }
  };
  std::unique_ptr<std::FILE, Close> file_;
};

#if L3_CATCH2_MAJOR >= 3
using ListenerBase = Catch::EventListenerBase;
#else
using ListenerBase = Catch::TestEventListenerBase;
#endif

class ProgressListener : public ListenerBase {
 public:
  using ListenerBase::ListenerBase;

  void testCaseStarting(Catch::TestCaseInfo const& info) override {
    started_ = std::chrono::steady_clock::now();
    log_.line("start", std::string(info.name));
  }

#if L3_CATCH2_MAJOR >= 3
  void assertionEnded(Catch::AssertionStats const& stats) override { record(stats); }
#else
  bool assertionEnded(Catch::AssertionStats const& stats) override {
    record(stats);
    return true;
  }
#endif

  void testCaseEnded(Catch::TestCaseStats const& stats) override {
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
    char text[32];
    std::snprintf(text, sizeof text, "%.3f", seconds);
#if L3_CATCH2_MAJOR >= 3
    const std::string name(stats.testInfo->name);
#else
    const std::string name(stats.testInfo.name);
#endif
    log_.line("end", name, stats.totals.assertions.failed > 0 ? "failed" : "passed", text);
  }

 private:
  void record(Catch::AssertionStats const& stats) {
    const Catch::AssertionResult& result = stats.assertionResult;
    if (result.isOk()) return;
    const Catch::SourceLineInfo where = result.getSourceInfo();
    std::string what = result.hasExpression() ? result.getExpandedExpression() : std::string();
    const std::string message = result.hasMessage() ? std::string(result.getMessage()) : "";
    if (!message.empty()) what += (what.empty() ? "" : ": ") + message;
    for (const Catch::MessageInfo& info : stats.infoMessages) {
      if (info.message != message) what += " | " + info.message;  // INFO/CAPTURE context
    }
    log_.line("fail", std::string(where.file) + ":" + std::to_string(where.line), what);
  }

  ProgressLog log_;
  std::chrono::steady_clock::time_point started_{};
};

}  // namespace l3::test

// Catch2 v2's macro pastes the name into an identifier: it must be unqualified.
using l3::test::ProgressListener;
CATCH_REGISTER_LISTENER(ProgressListener)
