#include "kernels/cpu/cross_entropy.hpp"

#include <barrier>
#include <thread>

#include "catch.hpp"
#include "kernels/ops.hpp"
#include "numeric_support.hpp"
#include "reference_ops.hpp"

namespace ref = l3::test::reference;
using l3::test::rel_error;

namespace {

// The counted positions of a mask and the targets they predict, as the model lists them.
struct Counted {
  std::vector<std::int32_t> rows;
  std::vector<std::int32_t> targets;
};
Counted counted(const std::vector<std::int32_t>& targets, const std::vector<std::uint8_t>& mask) {
  Counted c;
  for (std::size_t t = 0; t < mask.size(); ++t) {
    if (mask[t] == 0) continue;
    c.rows.push_back(static_cast<std::int32_t>(t));
    c.targets.push_back(targets[t]);
  }
  return c;
}

}  // namespace

TEST_CASE("fused lm_head + masked cross-entropy: loss, gradients, blocking",
          "[kernels][cross_entropy]") {
  INFO("seed " << l3::test::test_seed());
  const std::int64_t n = 9;
  const std::int64_t vocab = 23;
  const std::int64_t hidden = 7;
  l3::test::Random rnd(12);
  const auto h = rnd.normal(n * hidden);
  const auto w = rnd.normal(vocab * hidden, 0.5F);
  const auto targets = rnd.integers(n, vocab);
  const std::vector<std::uint8_t> mask = {1, 0, 1, 1, 0, 0, 1, 1, 1};
  const float scale = 1.0F / 6.0F;  // 1 / counted tokens
  const Counted c = counted(targets, mask);

  std::vector<float> dh(n * hidden, NAN);  // poisoned: every row must be written (0 if masked)
  std::vector<float> dw(vocab * hidden, 0.0F);
  const auto sum = l3::kernels::cpu::lm_head_cross_entropy(dh, dw, h, w, c.rows, c.targets, vocab,
                                                           hidden, scale);
  const auto hd = l3::test::to_double(h);
  const auto wd = l3::test::to_double(w);
  CHECK(sum.tokens == 6);
  CHECK(sum.loss == Approx(ref::cross_entropy(hd, wd, targets, mask, vocab, hidden)).epsilon(1e-6));

  const auto fd_h = l3::test::finite_differences(
      [&](const std::vector<double>& x) {
        return scale * ref::cross_entropy(x, wd, targets, mask, vocab, hidden);
      },
      hd);
  const auto fd_w = l3::test::finite_differences(
      [&](const std::vector<double>& x) {
        return scale * ref::cross_entropy(hd, x, targets, mask, vocab, hidden);
      },
      wd);
  CHECK(rel_error(dh, fd_h) < 1e-4);
  CHECK(rel_error(dw, fd_w) < 1e-4);
  for (std::int64_t i = 0; i < hidden; ++i) CHECK(dh[1 * hidden + i] == 0.0F);  // masked row

  // Blocks of one token (logit memory of a single row) give the same result.
  std::vector<float> dh1(dh.size());
  std::vector<float> dw1(dw.size(), 0.0F);
  const auto one = l3::kernels::cpu::lm_head_cross_entropy(dh1, dw1, h, w, c.rows, c.targets, vocab,
                                                           hidden, scale, {}, vocab * 4);
  CHECK(one.loss == Approx(sum.loss).epsilon(1e-12));
  CHECK(rel_error(dh1, dh) < 1e-6);
  CHECK(rel_error(dw1, dw) < 1e-6);

  // Logits divided by a sampling temperature (GRPO's, TRL's): z = logit_scale * h w^T, the loss
  // and both gradients those of the scaled logits.
  const float t_scale = l3::kernels::logit_scale(0.7);
  std::vector<float> dht(dh.size(), NAN);
  std::vector<float> dwt(dw.size(), 0.0F);
  const auto tempered = l3::kernels::cpu::lm_head_cross_entropy(
      dht, dwt, h, w, c.rows, c.targets, vocab, hidden, scale, {.logit_scale = t_scale});
  CHECK(tempered.loss ==
        Approx(ref::cross_entropy(hd, wd, targets, mask, vocab, hidden, t_scale)).epsilon(1e-6));
  CHECK(std::abs(tempered.loss - sum.loss) > 1e-3);  // the scale is applied
  const auto fd_ht = l3::test::finite_differences(
      [&](const std::vector<double>& x) {
        return scale * ref::cross_entropy(x, wd, targets, mask, vocab, hidden, t_scale);
      },
      hd);
  const auto fd_wt = l3::test::finite_differences(
      [&](const std::vector<double>& x) {
        return scale * ref::cross_entropy(hd, x, targets, mask, vocab, hidden, t_scale);
      },
      wd);
  CHECK(rel_error(dht, fd_ht) < 1e-4);
  CHECK(rel_error(dwt, fd_wt) < 1e-4);

  // Forward only, and nothing counted.
  const auto fwd =
      l3::kernels::cpu::lm_head_cross_entropy({}, {}, h, w, c.rows, c.targets, vocab, hidden, 1.0F);
  CHECK(fwd.loss == Approx(sum.loss).epsilon(1e-12));
  CHECK(l3::kernels::cpu::lm_head_cross_entropy({}, {}, h, w, {}, {}, vocab, hidden, 1.0F).tokens ==
        0);

  auto bad = c.targets;
  bad[0] = static_cast<std::int32_t>(vocab);
  CHECK_THROWS(
      l3::kernels::cpu::lm_head_cross_entropy({}, {}, h, w, c.rows, bad, vocab, hidden, 1.0F));
  auto outside = c.rows;
  outside.back() = static_cast<std::int32_t>(n);
  CHECK_THROWS(l3::kernels::cpu::lm_head_cross_entropy({}, {}, h, w, outside, c.targets, vocab,
                                                       hidden, 1.0F));
}

namespace {

// T "ranks" as threads: each posts its values and reads everyone's, in rank order.
class ThreadGather {
 public:
  explicit ThreadGather(int ranks) : sync_(ranks), posted_(static_cast<std::size_t>(ranks)) {}
  void gather(int rank, std::span<const double> mine, std::span<double> all) {
    posted_[static_cast<std::size_t>(rank)].assign(mine.begin(), mine.end());
    sync_.arrive_and_wait();
    for (std::size_t r = 0; r < posted_.size(); ++r)
      std::copy(posted_[r].begin(), posted_[r].end(), all.begin() + r * mine.size());
    sync_.arrive_and_wait();
  }

 private:
  std::barrier<> sync_;
  std::vector<std::vector<double>> posted_;
};

}  // namespace

TEST_CASE("vocabulary-parallel lm_head + cross-entropy gives the whole softmax over the slices",
          "[kernels][cross_entropy][tensor]") {
  const std::int64_t n = 7;
  const std::int64_t vocab = 24;
  const std::int64_t hidden = 6;
  const int ranks = 3;
  const std::int64_t rows = vocab / ranks;
  l3::test::Random rnd(21);
  const auto h = rnd.normal(n * hidden);
  const auto w = rnd.normal(vocab * hidden, 0.7F);
  const auto targets = rnd.integers(n, vocab);
  const Counted c = counted(targets, {1, 1, 0, 1, 1, 1, 1});
  const auto scales = rnd.uniform(c.rows.size());
  const float logit_scale = 0.8F;
  // The whole vocabulary on one rank: row losses, entropies, dh and dw.
  struct Out {
    std::vector<float> loss, entropy, dh, dw;
    double sum = 0;
  };
  const auto outputs = [&](std::int64_t v) {
    Out o;
    o.loss.resize(c.rows.size());
    o.entropy.resize(c.rows.size());
    o.dh.resize(n * hidden);
    o.dw.assign(v * hidden, 0.0F);
    return o;
  };
  Out whole = outputs(vocab);
  whole.sum = l3::kernels::cpu::lm_head_cross_entropy(whole.dh, whole.dw, h, w, c.rows, c.targets,
                                                      vocab, hidden, 0.5F,
                                                      {.loss = whole.loss,
                                                       .scale = scales,
                                                       .entropy = whole.entropy,
                                                       .logit_scale = logit_scale})
                  .loss;

  ThreadGather gather(ranks);
  std::vector<Out> slices(ranks);
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    slices[static_cast<std::size_t>(r)] = outputs(rows);
    threads.emplace_back([&, r] {
      Out& o = slices[static_cast<std::size_t>(r)];
      const l3::kernels::VocabShare share{
          .slice = {.begin = r * rows, .whole = vocab},
          .ranks = ranks,
          .all_gather = [&](std::span<const double> mine, std::span<double> all) {
            gather.gather(r, mine, all);
          }};
      // Blocks of 2 rows: several gathers, the last one short.
      o.sum =
          l3::kernels::cpu::lm_head_cross_entropy(
              o.dh, o.dw, h, std::span<const float>(w).subspan(r * rows * hidden, rows * hidden),
              c.rows, c.targets, rows, hidden, 0.5F,
              {.loss = o.loss, .scale = scales, .entropy = o.entropy, .logit_scale = logit_scale},
              2 * rows * static_cast<std::int64_t>(sizeof(float)), &share)
              .loss;
    });
  }
  for (std::thread& t : threads) t.join();

  std::vector<double> dh_sum(whole.dh.size(), 0.0);
  for (int r = 0; r < ranks; ++r) {
    const Out& o = slices[static_cast<std::size_t>(r)];
    INFO("rank " << r);
    CHECK(std::abs(o.sum - whole.sum) <= 1e-6 * std::abs(whole.sum));
    CHECK(rel_error(o.loss, std::vector<double>(whole.loss.begin(), whole.loss.end())) < 1e-6);
    CHECK(rel_error(o.entropy, std::vector<double>(whole.entropy.begin(), whole.entropy.end())) <
          1e-5);
    CHECK(o.loss == slices[0].loss);  // the same bits on every rank
    const std::vector<double> dw_rows(whole.dw.begin() + r * rows * hidden,
                                      whole.dw.begin() + (r + 1) * rows * hidden);
    CHECK(rel_error(o.dw, dw_rows) < 1e-5);
    for (std::size_t i = 0; i < dh_sum.size(); ++i) dh_sum[i] += o.dh[i];
  }
  CHECK(rel_error(whole.dh, dh_sum) < 1e-5);
}
