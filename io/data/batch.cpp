#include "io/data/batch.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.hpp"

namespace l3::data {

std::int64_t Batch::longest_segment() const noexcept {
  std::int64_t longest = 0;
  for (std::size_t s = 1; s < cu_seqlens.size(); ++s) {
    longest = std::max<std::int64_t>(longest, cu_seqlens[s] - cu_seqlens[s - 1]);
  }
  return longest;
}

std::int64_t Batch::counted_tokens() const noexcept {
  return std::count_if(loss_mask.begin(), loss_mask.end(), [](std::uint8_t m) { return m != 0; });
}

Batch Batch::none(std::int64_t seq_len) {
  Batch batch;
  batch.seq_len = seq_len;
  batch.cu_seqlens = {0};
  return batch;
}

void Batch::validate(std::int64_t vocab_size) const {
  const auto fail = [](const std::string& what) { throw core::internal_error("batch: " + what); };
  const std::int64_t n = tokens_count();
  const auto un = static_cast<std::size_t>(n);
  if (tokens.size() != un || targets.size() != un || loss_mask.size() != un ||
      positions.size() != un) {
    fail(fmt::format("arrays of {} tokens expected", n));
  }
  const bool share = !context_rows.empty();
  const std::int64_t whole = whole_tokens();
  if (cu_seqlens.empty() || cu_seqlens.front() != 0 || cu_seqlens.back() != whole ||
      (share && (context_rows.size() != un || whole % n != 0))) {
    fail("cu_seqlens must run from 0 to the number of tokens");
  }
  const std::int64_t row_tokens = rows > 0 ? whole / rows : seq_len;  // the whole's rows
  // Each token's index in the segmented sequence: itself, or in a share its context row.
  const auto token_at = [&](std::size_t i) -> std::int64_t {
    return share ? context_rows[i] : static_cast<std::int64_t>(i);
  };
  std::size_t i = 0;  // the next of this batch's tokens
  for (std::size_t s = 1; s < cu_seqlens.size(); ++s) {
    const std::int64_t begin = cu_seqlens[s - 1];
    const std::int64_t end = cu_seqlens[s];
    if (end <= begin) fail(fmt::format("segment {} is empty or reversed", s - 1));
    if (begin / row_tokens != (end - 1) / row_tokens)
      fail(fmt::format("segment {} crosses a row", s - 1));
    for (; i < un && token_at(i) < end; ++i) {
      const std::int64_t t = token_at(i);
      if (t < begin || (i > 0 && t <= token_at(i - 1)))
        fail(fmt::format("context row {} of token {} does not ascend", t, i));
      if (positions[i] != t - begin) {
        fail(fmt::format("position of token {} is not its index in its segment", t));
      }
    }
  }
  for (std::size_t t = 0; t < un; ++t) {
    if (tokens[t] < 0 || tokens[t] >= vocab_size) {
      throw core::bad_input(
          fmt::format("token id {} at position {} is not below the vocabulary size {}", tokens[t],
                      t, vocab_size));
    }
    // A counted target indexes the logits (the GPU's loss kernel reads that column unchecked).
    if (loss_mask[t] != 0 && (targets[t] < 0 || targets[t] >= vocab_size)) {
      throw core::bad_input(
          fmt::format("target id {} at position {} is not below the vocabulary size {}", targets[t],
                      t, vocab_size));
    }
  }
  if (rejected_last.size() != chosen_last.size() ||
      (!margins.empty() && margins.size() != chosen_last.size())) {
    fail("preference arrays differ in length");
  }
  for (const std::vector<float>* rl :
       {&advantages, &sampled_logprobs, &loss_weights, &old_logprobs, &ref_logprobs}) {
    if (!rl->empty() && rl->size() != un) fail(fmt::format("RL arrays of {} tokens expected", n));
  }
}

BatchBuilder::BatchBuilder(std::int64_t rows, std::int64_t seq_len, std::int32_t pad_id)
    : pad_id_(pad_id) {
  batch_.rows = rows;
  batch_.seq_len = seq_len;
  const auto n = static_cast<std::size_t>(rows * seq_len);
  batch_.tokens.reserve(n);
  batch_.targets.reserve(n);
  batch_.loss_mask.reserve(n);
  batch_.positions.reserve(n);
  batch_.cu_seqlens.push_back(0);
}

void BatchBuilder::close_row() {
  // Pad the rest of the row as one segment that attends only to itself and counts nothing.
  const std::int64_t pad = batch_.seq_len - used_;
  for (std::int64_t i = 0; i < pad; ++i) {
    batch_.tokens.push_back(pad_id_);
    batch_.targets.push_back(pad_id_);
    batch_.loss_mask.push_back(0);
    batch_.positions.push_back(static_cast<std::int32_t>(i));
  }
  if (pad > 0) batch_.cu_seqlens.push_back(static_cast<std::int32_t>(batch_.tokens.size()));
  ++row_;
  used_ = 0;
}

std::int64_t BatchBuilder::add(const std::vector<std::int32_t>& tokens,
                               const std::vector<std::uint8_t>& loss_mask) {
  const auto length = static_cast<std::int64_t>(tokens.size());
  if (length == 0 || length > batch_.seq_len || loss_mask.size() != tokens.size()) {
    throw core::internal_error(
        fmt::format("BatchBuilder: document of {} tokens (mask {}) for "
                    "rows of {}",
                    length, loss_mask.size(), batch_.seq_len));
  }
  if (used_ + length > batch_.seq_len) {
    // No row after this one: the document does not fit, and the row stays open (finish_packed
    // may still cut it).
    if (row_ + 1 >= batch_.rows) return -1;
    close_row();
  }
  if (row_ >= batch_.rows) return -1;
  for (std::int64_t i = 0; i < length; ++i) {
    const auto u = static_cast<std::size_t>(i);
    batch_.tokens.push_back(tokens[u]);
    const bool has_next = i + 1 < length;
    batch_.targets.push_back(has_next ? tokens[u + 1] : pad_id_);
    batch_.loss_mask.push_back(has_next ? loss_mask[u + 1] : 0);
    batch_.positions.push_back(static_cast<std::int32_t>(i));
  }
  used_ += length;
  batch_.document_tokens += length;
  batch_.cu_seqlens.push_back(static_cast<std::int32_t>(batch_.tokens.size()));
  return static_cast<std::int64_t>(batch_.tokens.size()) - 1;
}

bool BatchBuilder::add_pair(const std::vector<std::int32_t>& chosen,
                            const std::vector<std::int32_t>& rejected, float margin,
                            std::int64_t id, const std::vector<std::uint8_t>& chosen_mask,
                            const std::vector<std::uint8_t>& rejected_mask) {
  const std::int64_t c =
      add(chosen, chosen_mask.empty() ? std::vector<std::uint8_t>(chosen.size(), 0) : chosen_mask);
  if (c < 0) return false;
  const std::int64_t r =
      add(rejected,
          rejected_mask.empty() ? std::vector<std::uint8_t>(rejected.size(), 0) : rejected_mask);
  if (r < 0)
    throw core::internal_error("BatchBuilder: the rejected sequence of a pair did not fit");
  batch_.chosen_last.push_back(static_cast<std::int32_t>(c));
  batch_.rejected_last.push_back(static_cast<std::int32_t>(r));
  batch_.margins.push_back(margin);
  batch_.pair_ids.push_back(id);
  return true;
}

void BatchBuilder::end_row() {
  if (row_ < batch_.rows) close_row();
}

Batch BatchBuilder::finish() {
  while (row_ < batch_.rows) close_row();
  Batch out = std::move(batch_);
  batch_ = Batch{};
  return out;
}

Batch BatchBuilder::finish_packed(std::int64_t align) {
  if (batch_.rows != 1 || row_ != 0 || align < 1)
    throw core::internal_error("BatchBuilder::finish_packed: one row, not yet closed, align >= 1");
  // (used rounded up to align, at most the capacity; a row of nothing keeps one token of padding)
  const std::int64_t length =
      std::min(batch_.seq_len, std::max<std::int64_t>((used_ + align - 1) / align * align, 1));
  batch_.seq_len = length;
  close_row();
  Batch out = std::move(batch_);
  batch_ = Batch{};
  return out;
}

}  // namespace l3::data
