#include "cli/stop_signals.hpp"

#include <csignal>

namespace l3::cli {

namespace {

// A signal handler reaches only process-wide state: the flag and the first signal's number.
// NOLINTBEGIN(cppcoreguidelines-avoid-non-const-global-variables)
std::atomic<bool> g_stop{false};
std::atomic<int> g_signal{0};
// NOLINTEND(cppcoreguidelines-avoid-non-const-global-variables)

extern "C" void on_stop_signal(int signal) {
  if (signal == SIGINT && g_signal.load() == SIGINT) {
    // Ctrl-C pressed again: the user does not want to wait for the clean stop.
    std::signal(SIGINT, SIG_DFL);
    std::raise(SIGINT);
    return;
  }
  int none = 0;
  g_signal.compare_exchange_strong(none, signal);
  g_stop.store(true);
}

}  // namespace

void install_stop_signals() {
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  for (const int signal : {SIGTERM, SIGUSR1, SIGINT}) sigaction(signal, &action, nullptr);
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  sigaction(SIGXFSZ, &ignore, nullptr);
}

void restore_default_signals() {
  for (const int signal : {SIGTERM, SIGUSR1, SIGINT, SIGXFSZ}) std::signal(signal, SIG_DFL);
  if (const int first = g_signal.load(); first != 0) std::raise(first);
}

const std::atomic<bool>& stop_flag() noexcept { return g_stop; }

std::string_view stop_signal_name() noexcept {
  switch (g_signal.load()) {
    case SIGTERM:
      return "SIGTERM";
    case SIGUSR1:
      return "SIGUSR1";
    case SIGINT:
      return "SIGINT";
    default:
      return "";
  }
}

}  // namespace l3::cli
