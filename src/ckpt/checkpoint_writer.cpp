#include "ckpt/checkpoint_writer.hpp"

#include <fmt/format.h>

#include <exception>
#include <filesystem>

#include "ckpt/checkpoint_paths.hpp"
#include "ckpt/model_file.hpp"
#include "core/durable_file.hpp"
#include "core/error.hpp"
#include "dist/agree.hpp"

namespace l3::ckpt {

namespace fs = std::filesystem;

namespace {

void write_on_root(const std::string& root, const Manifest& manifest,
                   const model::ParameterLayout& layout, std::span<const float> master) {
  const std::string name = step_dir_name(manifest.step);
  const fs::path final_dir = fs::path(root) / name;
  const fs::path partial = fs::path(root) / (name + ".partial");
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) throw core::bad_input(fmt::format("cannot create: {}", ec.message()), {.file = root});
  fs::remove_all(partial, ec);  // the remains of an interrupted write of this same step
  if (!fs::create_directory(partial, ec) || ec) {
    throw core::internal_error(fmt::format("cannot create: {}", ec.message()),
                               {.file = partial.string()});
  }
  const std::string model_path = (partial / kModelFile).string();
  write_model_file(model_path, layout, master);
  core::fsync_path(model_path);
  core::write_file_atomically((partial / kManifestFile).string(),
                              manifest.to_json().dump(2) + "\n");
  core::fsync_path(partial.string());

  // A checkpoint of the same step already there (a rerun): keep it until the new one is in
  // place, so that there is always one complete step-N.
  const fs::path old = fs::path(root) / (name + ".replaced");
  const bool replacing = fs::exists(final_dir);
  if (replacing) {
    fs::remove_all(old, ec);
    core::rename_path(final_dir.string(), old.string());
  }
  core::rename_path(partial.string(), final_dir.string());
  core::fsync_path(root);
  core::write_file_atomically((fs::path(root) / kLatestFile).string(), name + "\n");
  if (replacing) fs::remove_all(old, ec);
}

}  // namespace

std::string commit_checkpoint(const dist::World& world, const std::string& root,
                              const Manifest& manifest, const model::ParameterLayout& layout,
                              std::span<const float> master) {
  std::exception_ptr failure;
  if (world.is_root()) {
    try {
      write_on_root(root, manifest, layout, master);
    } catch (...) {
      failure = std::current_exception();
    }
  }
  dist::agree_on_failure(world, failure);
  return (fs::path(root) / step_dir_name(manifest.step)).string();
}

}  // namespace l3::ckpt
