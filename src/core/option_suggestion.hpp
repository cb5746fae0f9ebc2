// "Did you mean --warmup?": the options a mistyped one was probably meant to be, for the one-line
// error an unknown option gets.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace l3::core {

// The long names among `known` (without dashes) that `given` (as typed: "--warm", "warm_up",
// "learning-rate") most likely means, best first, at most three; none when nothing is close.
// In order: the same name with '_' for '-' or other case; the name other trainers give the
// option (Hugging Face's and TRL's: learning_rate is --lr, max_steps --steps, ...); names that
// `given` begins (a name cut short: --warm); names within a small edit distance (a typo).
[[nodiscard]] std::vector<std::string> likely_options(std::string_view given,
                                                      std::span<const std::string> known);

// A name the user typed, as a message shows it: whole when short, else its first 64 bytes and
// how long it is ("aaaa... (8388608 bytes)"): an 8 MB option name is not echoed back whole.
[[nodiscard]] std::string shown_name(std::string_view given);

// " (did you mean --warmup?)"-style text for a message, "" when nothing is close. `dashes`:
// "--" on the command line, "" in a config file.
[[nodiscard]] std::string did_you_mean(std::string_view given, std::span<const std::string> known,
                                       std::string_view dashes);

}  // namespace l3::core
