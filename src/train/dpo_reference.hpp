// DPO's reference log-probabilities. With LoRA none are kept: the model without its adapters is
// the reference, computed in each pass (train::DpoLoss). With full fine-tuning the
// reference is the initial model, and each pair's (chosen, rejected) log-probabilities under it
// are computed once, before the first step, by forward passes over one epoch of the dataset
// with the training's own micro-batches (so that at step 0 the policy's equal them bit for bit),
// then stored in a file of their own (docs/FORMAT.md, "Reference log-probabilities") and
// reused on resume, checked against the data and the model they came from.
#pragma once

#include <atomic>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/log.hpp"
#include "dist/world.hpp"
#include "io/data/data_loader.hpp"
#include "io/data/dataset_index.hpp"
#include "model/llama_model.hpp"

namespace l3::train {

// What a table was computed from: it is reused only where all of it matches.
struct ReferenceKey {
  std::string data_xxh64;   // data_digest() of the dataset
  std::string model_xxh64;  // the reference model's weights (base_digest)
  bool mean = false;        // per-token means (IPO) rather than sums
  [[nodiscard]] nlohmann::json to_json() const;
  bool operator==(const ReferenceKey&) const = default;
};

// The dataset's identity for the table: the content of its shards (tokens, masks, offsets,
// margins: data::content_digest), its pairs' places and lengths, and its tokenizer; not its
// file names or directory. Collective (an earlier prep's shards are read to digest them).
[[nodiscard]] std::string data_digest(const dist::World& world, const data::DatasetIndex& index);

class ReferenceTable {
 public:
  ReferenceTable() = default;
  ReferenceTable(ReferenceKey key, std::vector<double> chosen, std::vector<double> rejected);

  [[nodiscard]] bool empty() const noexcept { return chosen_.empty(); }
  [[nodiscard]] const ReferenceKey& key() const noexcept { return key_; }
  // A batch's 2P values, the chosen sequences' then the rejected ones' (LlamaModel's order).
  [[nodiscard]] std::vector<double> of(const model::Batch& batch) const;
  [[nodiscard]] std::span<const double> chosen() const noexcept { return chosen_; }
  [[nodiscard]] std::span<const double> rejected() const noexcept { return rejected_; }

 private:
  ReferenceKey key_;
  std::vector<double> chosen_, rejected_;  // per pair of the dataset
};

// Collective: every pair's log-probabilities under `model` as it is, by forward passes over
// epoch 0 of `loader` (its plan: the training's, or evaluation's), split over the ranks as
// that plan splits them; every rank gets the whole table. `stop`: a host's stop flag, agreed
// after every step of the pass (train/stop_policy.hpp: stop_if_requested).
[[nodiscard]] ReferenceTable compute_reference(const dist::World& world, model::LlamaModel& model,
                                               const data::DatasetIndex& index,
                                               const data::LoaderConfig& loader, ReferenceKey key,
                                               const std::atomic<bool>* stop = nullptr);

// The file: rank 0 writes it (under a temporary name, renamed) and reads it; read_reference
// returns nothing when the file is missing, was computed from something else, or its values do
// not match their checksum or are not log-probabilities (`why` says which), and throws
// bad_input for a file that is not a table at all. Collective.
void write_reference(const dist::World& world, const std::string& path, const ReferenceTable& t);
[[nodiscard]] std::optional<ReferenceTable> read_reference(const dist::World& world,
                                                           const std::string& path,
                                                           const ReferenceKey& key,
                                                           std::int64_t pairs, std::string& why);

// Before anything is computed: the directory the tables go to (`option` names where it came
// from, "--reference-dir" or "--ckpt-dir") is a real directory or nothing yet, never a link
// or a file, and the tables in it are regular files. bad_input Error naming it. Collective.
void check_reference_directory(const dist::World& world, const std::string& directory,
                               std::string_view option);

}  // namespace l3::train
