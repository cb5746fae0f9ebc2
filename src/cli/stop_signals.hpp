// SIGTERM, SIGUSR1 and SIGINT for the training commands, from the program's first instruction
// to its last (installed before MPI starts): each asks the run to stop cleanly. Before the first
// step (loading the model, verifying the checkpoint to resume, DPO's reference) the run stops
// at its next safe point with nothing to save; during training it checkpoints at the next step
// boundary; either way the program exits 75, which the job scripts requeue. A second SIGINT
// (Ctrl-C pressed again) ends the process at once. docs/CLI.md, "Signals".
#pragma once

#include <atomic>
#include <string_view>

namespace l3::cli {

// Installs the handlers, process-wide (also SIGXFSZ ignored: past RLIMIT_FSIZE a write fails
// with EFBIG, reported, instead of killing the process).
void install_stop_signals();

// A command that stops cleanly only in some of its forms (`generate --input`, not the
// interactive `generate --prompt`): the default actions back for SIGTERM, SIGUSR1, SIGINT and
// SIGXFSZ; a signal that came before is delivered again, with its default action.
void restore_default_signals();

// The flag the handlers set, for l3::Session.
[[nodiscard]] const std::atomic<bool>& stop_flag() noexcept;

// The first signal received ("SIGTERM", "SIGUSR1", "SIGINT"), or "" when none was.
[[nodiscard]] std::string_view stop_signal_name() noexcept;

}  // namespace l3::cli
