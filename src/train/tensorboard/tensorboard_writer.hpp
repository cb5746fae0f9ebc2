// --tensorboard DIR: rank 0 writes TensorBoard event files. Every number of a "train" or "eval"
// record becomes a scalar (a `simple_value`, which every TensorBoard version and the tools that
// import its files read) tagged "train/<name>" or "eval/<name>" with the metrics file's own
// names (TRL's where it uses them: "train/rewards/accuracies"), against the record's step, with
// the wall time it was written at; a boolean ("skipped") as 0 or 1; a null (a skipped step's
// loss) is left out.
//
// Each run writes a new file in the directory; a resumed run first drops the steps after its
// checkpoint from the files of the run it continues (event_file.hpp), so that TensorBoard
// draws one continuous curve with every step once.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>

#include "core/log.hpp"
#include "core/phase.hpp"
#include "train/metrics_sink.hpp"

namespace l3::train::tensorboard {

class TensorBoardWriter final : public MetricsSink {
 public:
  // Creates `directory` if needed and a new event file in it, its first event carrying
  // `run_id` (the run's own identity, train/run_identity.hpp). `resumed_at`: the step a resumed
  // run continues from (later steps of the earlier files of this phase that this run wrote are
  // dropped first; other runs' files are never touched). bad_input naming the directory when it
  // cannot be created or written.
  TensorBoardWriter(const std::string& directory, Phase phase, const std::string& run_id,
                    std::optional<std::int64_t> resumed_at, const core::Logger& log);

  void write(const nlohmann::json& record) override;
  void sync() override;

  [[nodiscard]] const std::string& path() const noexcept { return path_; }

 private:
  struct Close {
    void operator()(std::FILE* file) const noexcept { (void)std::fclose(file); }
  };
  void append(const std::string& event);

  std::string path_;
  std::unique_ptr<std::FILE, Close> file_;
};

}  // namespace l3::train::tensorboard
