// Where a backward pass writes its gradients when the model holds no flat gradient buffer of its
// own (ModelOptions::own_gradients false, ZeRO-2): the owner of the window hands out storage for
// the tensors the backward is computing and takes it back once they are complete, so that only a
// few layers' gradients exist at any time.
#pragma once

#include <cstdint>

#include "kernels/tensor.hpp"

namespace l3::model {

class GradientWindow {
 public:
  GradientWindow() = default;
  virtual ~GradientWindow() = default;
  GradientWindow(const GradientWindow&) = delete;
  GradientWindow& operator=(const GradientWindow&) = delete;
  GradientWindow(GradientWindow&&) = delete;
  GradientWindow& operator=(GradientWindow&&) = delete;

  // The gradients of layout positions [offset, offset + numel) for the backward to add into:
  // zero when first handed out in a micro-batch (their ParameterLayout::gradient_group).
  virtual kernels::TensorView gradients(std::int64_t offset, std::int64_t numel) = 0;
  // This micro-batch's gradients of [offset, total) are complete (the same calls, at the same
  // points, as LlamaModel::GradientReadyHook).
  virtual void ready(std::int64_t offset) = 0;
};

}  // namespace l3::model
