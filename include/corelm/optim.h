// Optimizers over a list of parameter tensors (f32 leaves). State is f32. step() reads each
// parameter's .grad() (parameters without a gradient are skipped) and updates in place under
// no-grad. Semantics follow torch.optim.SGD and torch.optim.AdamW.
#pragma once
#include <vector>

#include "corelm/tensor.h"

namespace corelm::optim {

class Optimizer {
 public:
  explicit Optimizer(std::vector<Tensor> params) : params_(std::move(params)) {}
  virtual ~Optimizer() = default;
  virtual void step() = 0;
  void zero_grad();
  float lr() const { return lr_; }
  void set_lr(float lr) { lr_ = lr; }
  const std::vector<Tensor>& params() const { return params_; }

 protected:
  std::vector<Tensor> params_;
  float lr_ = 1e-3f;
};

struct SGDOptions {
  float lr = 1e-2f;
  float momentum = 0.0f;
  float dampening = 0.0f;
  float weight_decay = 0.0f;  // L2 added to the gradient, as torch.optim.SGD
  bool nesterov = false;
};

class SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor> params, SGDOptions options);
  void step() override;

 private:
  SGDOptions opt_;
  std::vector<Tensor> momentum_;
};

struct AdamWOptions {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 1e-2f;  // decoupled: p -= lr * wd * p
};

class AdamW : public Optimizer {
 public:
  AdamW(std::vector<Tensor> params, AdamWOptions options);
  void step() override;
  int64_t step_count() const { return step_; }
  // Per-parameter weight decay (e.g. 0 for norms and biases); defaults to options.weight_decay.
  void set_weight_decay(size_t param_index, float wd);
  const std::vector<Tensor>& exp_avg() const { return m_; }
  const std::vector<Tensor>& exp_avg_sq() const { return v_; }
  void set_step_count(int64_t s) { step_ = s; }

 private:
  AdamWOptions opt_;
  std::vector<float> weight_decay_;
  std::vector<Tensor> m_, v_;
  int64_t step_ = 0;
};

}  // namespace corelm::optim
