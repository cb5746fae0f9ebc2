// Where a model reads its weights when it does not hold them all (parameter sharding, ZeRO-3):
// before reading the weights of a gradient group (ParameterLayout::gradient_groups: the
// embedding, each block, the head) the model acquires the group, reads its tensors through
// parameters(), and releases it when the pass is done with it. The window's owner gathers the
// group's weights from the ranks that hold them, and may gather the next group ahead: the one
// after it in a forward pass, the one before it in a backward pass.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/tensor.hpp"

namespace l3::model {

enum class Pass : std::uint8_t { forward, backward };

class ParameterWindow {
 public:
  ParameterWindow() = default;
  virtual ~ParameterWindow() = default;
  ParameterWindow(const ParameterWindow&) = delete;
  ParameterWindow& operator=(const ParameterWindow&) = delete;
  ParameterWindow(ParameterWindow&&) = delete;
  ParameterWindow& operator=(ParameterWindow&&) = delete;

  // The weights of `group` are about to be read in `pass`; parameters() serves them until the
  // matching release(). A group may be acquired again while held (the tied embedding: by the
  // embedding and by the lm_head), each acquire matched by a release.
  virtual void acquire(std::size_t group, Pass pass) = 0;
  // The weights of layout positions [offset, offset + numel), all within one held group.
  [[nodiscard]] virtual kernels::ConstTensorView parameters(std::int64_t offset,
                                                            std::int64_t numel) = 0;
  // The pass is done with the group's weights (called from destructors: must not throw).
  virtual void release(std::size_t group) noexcept = 0;
};

// A group held for a scope; nothing without a window.
class HeldGroup {
 public:
  HeldGroup(ParameterWindow* window, std::size_t group, Pass pass)
      : window_(window), group_(group) {
    if (window_ != nullptr) window_->acquire(group_, pass);
  }
  ~HeldGroup() {
    if (window_ != nullptr) window_->release(group_);
  }
  HeldGroup(const HeldGroup&) = delete;
  HeldGroup& operator=(const HeldGroup&) = delete;
  HeldGroup(HeldGroup&&) = delete;
  HeldGroup& operator=(HeldGroup&&) = delete;

 private:
  ParameterWindow* window_;
  std::size_t group_;
};

}  // namespace l3::model
