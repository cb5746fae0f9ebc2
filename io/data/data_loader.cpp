#include "io/data/data_loader.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <mutex>
#include <optional>
#include <set>

#include "core/error.hpp"
#include "core/timer.hpp"
#include "dist/communicator.hpp"
#include "io/data/context_share.hpp"
#include "io/data/prefetcher.hpp"

namespace l3::data {

struct DataLoader::Impl {
  Impl(const dist::World& w, const DatasetIndex& i, LoaderConfig c)
      : world(w), index(i), config(c), reader(w, i, config.reader) {}

  // The producer's plan (only the producer thread touches it).
  const EpochPlan& plan_for(std::int64_t epoch) {
    if (!producer_plan || producer_plan->epoch() != epoch) {
      producer_plan = std::make_unique<EpochPlan>(EpochPlan::build(index, config.plan, epoch));
      if (producer_plan->steps() == 0) {
        throw core::bad_input(
            fmt::format("no sample fits in a row of {} tokens", config.plan.seq_len),
            {.file = index.directory});
      }
    }
    return *producer_plan;
  }

  // Sample tokens as ids, checked against the model's vocabulary.
  [[nodiscard]] std::vector<std::int32_t> ids(const std::vector<std::uint32_t>& raw,
                                              std::int64_t sample) const {
    std::vector<std::int32_t> out(raw.size());
    for (std::size_t t = 0; t < raw.size(); ++t) {
      if (raw[t] >= static_cast<std::uint64_t>(config.model_vocab)) {
        const ShardEntry& shard =
            index.shards[static_cast<std::size_t>(index.shard[static_cast<std::size_t>(sample)])];
        throw core::bad_input(
            fmt::format("token id {} is not below the model's vocabulary size {}", raw[t],
                        config.model_vocab),
            {.file = shard.path,
             .record = fmt::format("sample {} of the shard", sample - shard.first_sample)});
      }
      out[t] = static_cast<std::int32_t>(raw[t]);
    }
    return out;
  }

  // The plan's rank: a context-parallel group's, whose ranks read the same samples.
  [[nodiscard]] int data_rank() const { return world.rank() / config.context_ranks; }

  void produce(Position position, StepData& out) {
    const core::Stopwatch watch;
    const EpochPlan& plan = plan_for(position.epoch);
    const std::int64_t seq_len = config.plan.seq_len;
    const std::int64_t micro_count = config.plan.accumulation();
    out.position = position;
    out.next = position.step + 1 < plan.steps() ? Position{position.epoch, position.step + 1}
                                                : Position{position.epoch + 1, 0};
    out.samples = 0;

    // What to read: this rank's samples of every micro-batch.
    struct Sample {
      std::int64_t id;
      std::vector<std::uint32_t> tokens;
      std::vector<std::uint8_t> mask;
      std::vector<std::uint32_t> rejected;
      std::vector<std::uint8_t> rejected_mask;
    };
    std::vector<std::vector<std::vector<Sample>>> micro(
        static_cast<std::size_t>(micro_count));  // [micro][row][sample]
    std::vector<ReadRequest> requests;
    for (std::int64_t m = 0; m < micro_count; ++m) {
      for (const auto& unit : plan.micro_batch(position.step, data_rank(), m)) {
        auto& row = micro[static_cast<std::size_t>(m)].emplace_back();
        row.reserve(unit.size());
        for (const std::int64_t id : unit) row.push_back({id, {}, {}, {}, {}});
      }
    }
    for (auto& rows : micro) {
      for (auto& row : rows) {
        for (Sample& s : row) {
          const auto i = static_cast<std::size_t>(s.id);
          const std::int32_t shard = index.shard[i];
          if (index.kind == SampleKind::sft) {
            const std::int64_t n = std::min<std::int64_t>(index.length[i], seq_len);  // truncate
            s.tokens.resize(static_cast<std::size_t>(n));
            s.mask.resize(static_cast<std::size_t>(n));
            requests.push_back({shard, Field::tokens, index.offset[i], n, s.tokens.data()});
            requests.push_back({shard, Field::loss_mask, index.offset[i], n, s.mask.data()});
          } else {
            s.tokens.resize(static_cast<std::size_t>(index.length[i]));
            s.rejected.resize(static_cast<std::size_t>(index.rejected_length[i]));
            requests.push_back(
                {shard, Field::chosen_tokens, index.offset[i], index.length[i], s.tokens.data()});
            requests.push_back({shard, Field::rejected_tokens, index.rejected_offset[i],
                                index.rejected_length[i], s.rejected.data()});
            if (config.reader.response_masks) {
              s.mask.resize(s.tokens.size());
              s.rejected_mask.resize(s.rejected.size());
              requests.push_back(
                  {shard, Field::chosen_mask, index.offset[i], index.length[i], s.mask.data()});
              requests.push_back({shard, Field::rejected_mask, index.rejected_offset[i],
                                  index.rejected_length[i], s.rejected_mask.data()});
            }
          }
          ++out.samples;
        }
      }
    }
    // Collective transfers: the shards any rank reads in this step (the same list everywhere).
    std::vector<std::int32_t> shards;
    if (reader.collective()) {
      std::set<std::int32_t> all;
      for (int r = 0; r < config.plan.world_size; ++r) {
        for (std::int64_t m = 0; m < micro_count; ++m) {
          for (const auto& unit : plan.micro_batch(position.step, r, m)) {
            for (const std::int64_t id : unit)
              all.insert(index.shard[static_cast<std::size_t>(id)]);
          }
        }
      }
      shards.assign(all.begin(), all.end());
    }
    reader.read(std::move(requests), shards);
    // A token is a target or not: a mask byte other than 0 or 1 is a damaged or foreign
    // shard, not a weight to train with.
    auto check_mask = [&](const std::vector<std::uint8_t>& mask, std::int64_t offset,
                          std::int64_t id, const char* dataset) {
      const auto bad = std::find_if(mask.begin(), mask.end(), [](std::uint8_t m) { return m > 1; });
      if (bad == mask.end()) return;
      const auto i = static_cast<std::size_t>(id);
      throw core::bad_input(
          fmt::format("value {} at token {}: a loss mask is 0 or 1", *bad,
                      offset + (bad - mask.begin())),
          {.file = index.shards[static_cast<std::size_t>(index.shard[i])].path, .tensor = dataset});
    };
    for (const auto& rows : micro) {
      for (const auto& row : rows) {
        for (const Sample& s : row) {
          const auto i = static_cast<std::size_t>(s.id);
          if (index.kind == SampleKind::sft) {
            check_mask(s.mask, index.offset[i], s.id, "/loss_mask");
          } else if (config.reader.response_masks) {
            check_mask(s.mask, index.offset[i], s.id, "/chosen/loss_mask");
            check_mask(s.rejected_mask, index.rejected_offset[i], s.id, "/rejected/loss_mask");
          }
        }
      }
    }

    out.micro.clear();
    for (auto& rows : micro) {
      if (index.kind == SampleKind::sft) {
        BatchBuilder builder(config.plan.micro_batch, seq_len, config.pad_id);
        for (auto& row : rows) {
          for (Sample& s : row) {
            if (builder.add(ids(s.tokens, s.id), s.mask) < 0) {
              throw core::internal_error("packing plan and batch builder disagree");
            }
          }
          builder.end_row();
        }
        out.micro.push_back(config.context_ranks > 1
                                ? context_share(builder.finish(),
                                                world.rank() % config.context_ranks,
                                                config.context_ranks)
                                : builder.finish());
        continue;
      }
      // Reward: pairs packed into as many rows as they need, in order.
      std::int64_t rows_needed = 0;
      std::int64_t used = seq_len;
      for (const auto& row : rows) {
        const std::int64_t need = index.sample_tokens(row.front().id);
        if (used + need > seq_len) {
          ++rows_needed;
          used = 0;
        }
        used += need;
      }
      BatchBuilder builder(std::max<std::int64_t>(rows_needed, 1), seq_len, config.pad_id);
      for (auto& row : rows) {
        const Sample& s = row.front();
        const float margin =
            config.margins_from_data ? index.margin[static_cast<std::size_t>(s.id)] : 0.0F;
        if (builder.row_space() < index.sample_tokens(s.id))
          builder.end_row();  // a pair shares a row
        if (!builder.add_pair(ids(s.tokens, s.id), ids(s.rejected, s.id), margin, s.id, s.mask,
                              s.rejected_mask)) {
          throw core::internal_error("reward rows and batch builder disagree");
        }
      }
      out.micro.push_back(config.context_ranks > 1
                              ? context_share(builder.finish(), world.rank() % config.context_ranks,
                                              config.context_ranks)
                              : builder.finish());
    }
    out.assemble_seconds = watch.seconds();
  }

  std::int64_t steps_in_epoch(std::int64_t epoch) {
    // Pairs are never packed: which ones are left out (too long) does not depend on the
    // order, so every epoch has the same steps; counted once, not once per epoch.
    if (index.kind == SampleKind::preference) {
      const std::scoped_lock lock(main_plan_mutex);
      if (!preference_steps) preference_steps = EpochPlan::build(index, config.plan, epoch).steps();
      return *preference_steps;
    }
    return main_plan_of(epoch).steps();
  }

  const EpochPlan& main_plan_of(std::int64_t epoch) {
    const std::scoped_lock lock(main_plan_mutex);
    if (!main_plan || main_plan->epoch() != epoch) {
      main_plan = std::make_unique<EpochPlan>(EpochPlan::build(index, config.plan, epoch));
    }
    return *main_plan;
  }

  const dist::World& world;
  const DatasetIndex& index;
  LoaderConfig config;
  ShardReader reader;
  std::unique_ptr<EpochPlan> producer_plan;
  Position cursor;  // the producer's next position
  std::mutex main_plan_mutex;
  std::unique_ptr<EpochPlan> main_plan;
  std::optional<std::int64_t> preference_steps;
  dist::UniqueComm producers;  // collective transfers: the producers' own agreement channel
  std::unique_ptr<Prefetcher<StepData>> prefetcher;
};

DataLoader::DataLoader(const dist::World& world, const DatasetIndex& index, LoaderConfig config,
                       Position start)
    : impl_(std::make_unique<Impl>(world, index, config)) {
  if (config.context_ranks < 1 || world.size() % config.context_ranks != 0) {
    throw core::internal_error(fmt::format("data loader: context groups of {} over {} ranks",
                                           config.context_ranks, world.size()));
  }
  impl_->config.plan.world_size = world.size() / config.context_ranks;
  impl_->config.plan.validate();
  if (impl_->config.model_vocab <= 0) impl_->config.model_vocab = index.vocab_size;
  impl_->cursor = start;
  Impl* impl = impl_.get();
  Prefetcher<StepData>::Gate gate;
  if (impl_->reader.collective()) {
    // Collective reads need every rank's producer at the same item: they agree before each one
    // whether any rank is stopping, so that all stop together.
    impl_->producers = world.duplicate_comm();
    gate = [impl](bool stopping) {
      int mine = stopping ? 1 : 0;
      int any = 0;
      dist::check_mpi(MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, impl->producers.get()),
                      "MPI_Allreduce(prefetch gate)");
      return any == 0;
    };
  }
  impl_->prefetcher = std::make_unique<Prefetcher<StepData>>(
      impl_->config.depth, 0,
      [impl](std::int64_t /*index*/, StepData& slot) {
        impl->produce(impl->cursor, slot);
        impl->cursor = slot.next;
      },
      std::move(gate));
}

DataLoader::~DataLoader() { impl_->prefetcher.reset(); }

const StepData& DataLoader::next() { return impl_->prefetcher->next(); }

double DataLoader::last_wait_ms() const noexcept {
  return impl_->prefetcher->last_wait_seconds() * 1e3;
}

std::int64_t DataLoader::skipped_in_epoch(std::int64_t epoch) const {
  return impl_->main_plan_of(epoch).skipped_samples();
}

std::int64_t DataLoader::steps_in_epoch(std::int64_t epoch) const {
  return impl_->steps_in_epoch(epoch);
}

}  // namespace l3::data
