#include "train/run_identity.hpp"

#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "ckpt/checkpoint_paths.hpp"
#include "ckpt/checksum.hpp"
#include "core/bounded_read.hpp"
#include "core/path_safety.hpp"
#include "dist/collectives.hpp"

namespace l3::train {

namespace fs = std::filesystem;

std::string model_identity(const std::string& init) {
  if (init.empty()) return {};
  std::error_code ec;
  if (ckpt::is_checkpoint(init)) {
    const fs::path step = fs::weakly_canonical(ckpt::resolve_checkpoint(init), ec);
    const std::string manifest =
        core::read_text_file((step / ckpt::kManifestFile).string(), "a checkpoint manifest");
    return fmt::format("checkpoint {} {}", step.string(),
                       ckpt::to_hex(ckpt::xxh64(std::as_bytes(std::span(manifest)))));
  }
  const fs::path dir = fs::weakly_canonical(init, ec);
  std::vector<std::string> files;
  for (fs::directory_iterator it(dir, ec); !ec && it != fs::directory_iterator();
       it.increment(ec)) {
    struct stat info {};
    if (::stat(it->path().c_str(), &info) != 0 || !S_ISREG(info.st_mode)) continue;
    files.push_back(fmt::format("{} {} {}.{:09}", it->path().filename().string(), info.st_size,
                                info.st_mtim.tv_sec, info.st_mtim.tv_nsec));
  }
  std::sort(files.begin(), files.end());
  std::string text = "directory " + dir.string();
  for (const std::string& f : files) text += "\n" + f;
  return text;
}

std::string run_key(const dist::World& world, const TrainConfig& config) {
  std::string key;
  std::exception_ptr failure;
  if (world.is_root()) {
    try {
      const nlohmann::json parts = {{"phase", phase_name(config.phase)},
                                    {"model", config.model},
                                    {"init", model_identity(config.init)},
                                    {"seed", config.seed},
                                    {"data", config.data},
                                    {"lora_rank", config.lora.rank},
                                    {"lora_targets", config.lora.targets_text()},
                                    {"init_adapter", config.init_adapter}};
      const std::string text = parts.dump();
      key = ckpt::to_hex(ckpt::xxh64(std::as_bytes(std::span(text))));
    } catch (...) {
      failure = std::current_exception();
    }
  }
  dist::agree_on_failure(world, failure);
  return dist::broadcast_string(world.comm(), key);
}

std::string new_run_id(const dist::World& world) {
  std::string id;
  if (world.is_root()) {
    std::random_device entropy;
    const std::string seed =
        fmt::format("{} {} {} {} {}", std::chrono::system_clock::now().time_since_epoch().count(),
                    core::host_name(), ::getpid(), entropy(), entropy());
    id = ckpt::to_hex(ckpt::xxh64(std::as_bytes(std::span(seed))));
  }
  return dist::broadcast_string(world.comm(), id);
}

}  // namespace l3::train
