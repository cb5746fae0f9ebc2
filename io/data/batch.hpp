// One micro-batch as the model consumes it (the data loader builds it: it lives with the data,
// below the model, which uses it as model::Batch): `rows` packed rows of `seq_len` tokens,
// flattened to N = rows * seq_len positions.
//
// Targets follow the Hugging Face `labels` convention already shifted: position t predicts
// targets[t] (the next token of its document) and counts in the loss when loss_mask[t] is 1.
// Segments (documents, and the padding at the end of a row) are given by cu_seqlens; no token
// attends across segments and RoPE positions restart at 0 in each.
#pragma once

#include <cstdint>
#include <vector>

namespace l3::data {

struct Batch {
  std::int64_t rows = 0;
  std::int64_t seq_len = 0;
  std::vector<std::int32_t> tokens{};      // (N)
  std::vector<std::int32_t> targets{};     // (N); any valid id where loss_mask is 0
  std::vector<std::uint8_t> loss_mask{};   // (N)
  std::vector<std::int32_t> cu_seqlens{};  // (segments + 1), 0 .. N, boundaries of every row too
  std::vector<std::int32_t> positions{};   // (N), index of the token within its segment
  // Reward batches: per preference pair, the position of the last real token of the chosen
  // and of the rejected sequence (where the score is read), and an optional margin.
  std::vector<std::int32_t> chosen_last{};
  std::vector<std::int32_t> rejected_last{};
  std::vector<float> margins{};
  std::vector<std::int64_t> pair_ids{};  // the pairs' sample numbers in their dataset (or -1)
  // Online RL (GRPO): per position (N), where loss_mask is 1 (0 elsewhere), the advantage of the
  // completion the target belongs to, and the log-probability the generator drew the target
  // with; and the weight of the position's loss within its normalisation (the loss type's).
  std::vector<float> advantages{};
  std::vector<float> sampled_logprobs{};
  std::vector<float> loss_weights{};
  // (N) or empty: the log-probabilities of the policy the completions were drawn from, when it is
  // not the one trained (several updates per generation batch); empty: the trained policy itself,
  // detached (the probability ratio is 1).
  std::vector<float> old_logprobs{};
  // (N) or empty: the log-probabilities of the reference policy (GRPO with beta > 0), computed
  // once per generation batch.
  std::vector<float> ref_logprobs{};
  std::int64_t completions = 0;      // online RL: the completions it holds (masked-out ones too)
  std::int64_t document_tokens = 0;  // tokens of documents (not padding): throughput counts these
  // Context parallelism (data::context_share): this batch is one rank's share of a whole one
  // that its group holds between them. context_rows (N): each token's index in the whole,
  // ascending; cu_seqlens then cuts the whole's tokens (the keys the attention gathers from the
  // group) and positions are the shared tokens'. context_document_tokens: the whole's document
  // tokens (every rank of the group has work when the whole has). Empty: a whole batch.
  // Preference pairs keep the whole's chosen_last and rejected_last (tokens of the whole);
  // context_rank: this share's rank in its group (its rank 0 counts the pairs once).
  std::vector<std::int32_t> context_rows{};
  std::int64_t context_document_tokens = 0;
  std::int32_t context_rank = 0;

  [[nodiscard]] std::int64_t tokens_count() const noexcept { return rows * seq_len; }
  // The tokens the segments cut: the whole batch's (context parallelism), else this one's.
  [[nodiscard]] std::int64_t whole_tokens() const noexcept {
    return context_rows.empty() || cu_seqlens.empty() ? tokens_count() : cu_seqlens.back();
  }
  [[nodiscard]] std::int64_t segments() const noexcept {
    return cu_seqlens.empty() ? 0 : static_cast<std::int64_t>(cu_seqlens.size()) - 1;
  }
  [[nodiscard]] std::int64_t longest_segment() const noexcept;
  [[nodiscard]] std::int64_t counted_tokens() const noexcept;
  [[nodiscard]] std::int64_t pairs() const noexcept {
    return static_cast<std::int64_t>(chosen_last.size());
  }

  // Internal Error when the arrays disagree (sizes, segments crossing rows, positions).
  void validate(std::int64_t vocab_size) const;

  // A batch of no rows: what a rank with no data for a micro-batch that the other ranks run
  // passes through the model (LlamaModel::load_batch).
  [[nodiscard]] static Batch none(std::int64_t seq_len);
};

// A packed row (BatchBuilder::finish_packed) is rounded up to this many tokens: GEMMs of a
// multiple of 16 rows keep the GPU's tensor-core tiles whole, for at most 15 tokens of padding.
inline constexpr std::int64_t kPackedRowAlignment = 16;

// Fills rows of seq_len tokens with whole documents in the order given (a document that does
// not fit in the current row starts the next one), pads the rest of each row, and derives
// targets, masks, segments and positions. loss_mask of a document marks its target tokens
// (token t is predicted from the tokens before it); the first token is never a target.
class BatchBuilder {
 public:
  BatchBuilder(std::int64_t rows, std::int64_t seq_len, std::int32_t pad_id);

  // Adds a document; returns the flat position of its last token, or -1 if it does not fit in
  // the remaining rows. A document longer than seq_len is an internal Error (truncate first).
  std::int64_t add(const std::vector<std::int32_t>& tokens,
                   const std::vector<std::uint8_t>& loss_mask);
  // A preference pair: both sequences are added and their last tokens recorded. The masks
  // (DPO: the responses' tokens) are those of add(); empty: no token counts (reward models).
  bool add_pair(const std::vector<std::int32_t>& chosen, const std::vector<std::int32_t>& rejected,
                float margin = 0.0F, std::int64_t id = -1,
                const std::vector<std::uint8_t>& chosen_mask = {},
                const std::vector<std::uint8_t>& rejected_mask = {});

  // Ends the current row here (the rest is padding); the next document starts a new row.
  void end_row();
  [[nodiscard]] std::int64_t rows_used() const noexcept { return used_ > 0 ? row_ + 1 : row_; }
  // Tokens still free in the current row.
  [[nodiscard]] std::int64_t row_space() const noexcept { return batch_.seq_len - used_; }

  [[nodiscard]] Batch finish();
  // One row of documents end to end (built with rows 1 and seq_len the capacity): the row is cut
  // after its last document, rounded up to a multiple of `align` tokens (the rest one padding
  // segment), so that a pass computes the documents' tokens and not a full row's padding: the
  // batch's seq_len is that length. GRPO's completions travel this way, packed as SFT packs.
  [[nodiscard]] Batch finish_packed(std::int64_t align);

 private:
  void close_row();

  Batch batch_;
  std::int32_t pad_id_;
  std::int64_t row_ = 0;   // current row
  std::int64_t used_ = 0;  // tokens used in the current row
};

}  // namespace l3::data
