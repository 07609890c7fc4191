// SGD and AdamW with the update rules of torch.optim (1.13, single-tensor path), so a run here
// and a run in PyTorch stay within f32 rounding of each other step after step.
#include <cmath>

#include "corelm/autograd.h"
#include "corelm/error.h"
#include "corelm/optim.h"
#include "ops/vector_math.h"

namespace corelm::optim {
namespace {

// The parameter's own f32 elements; updates must land in its storage, so views that are not
// contiguous (none of our parameters are) are refused rather than silently copied.
float* param_data(const Tensor& p, const char* who) {
  CORELM_CHECK(p.dtype() == DType::F32, DTypeError, who, ": parameters must be f32, got ",
               dtype_name(p.dtype()), " ", shape_str(p.shape()));
  CORELM_CHECK(p.is_contiguous(), ValueError, who, ": parameter ", shape_str(p.shape()),
               " is not contiguous; optimizers update parameters in place");
  CORELM_CHECK(p.device().is_cpu(), DeviceError, who, ": only CPU parameters are supported");
  return p.data<float>();
}

// The gradient as contiguous f32 of the parameter's shape.
Tensor grad_of(const Tensor& p, const char* who) {
  Tensor g = p.grad();
  CORELM_CHECK(g.shape() == p.shape(), ShapeError, who, ": gradient ", shape_str(g.shape()),
               " does not match parameter ", shape_str(p.shape()));
  return g.to(DType::F32).contiguous();
}

void check_params(const std::vector<Tensor>& params, const char* who) {
  for (size_t i = 0; i < params.size(); ++i) {
    CORELM_CHECK(params[i].defined(), ValueError, who, ": parameter ", i, " is undefined");
    param_data(params[i], who);
  }
}

}  // namespace

void Optimizer::zero_grad() {
  for (Tensor& p : params_) p.zero_grad();
}

// ---------------------------------------------------------------------------------------------
// SGD: d = g + wd * p; buf = momentum * buf + (1 - dampening) * d (buf = d on the first step);
// d = nesterov ? d + momentum * buf : buf; p -= lr * d.

SGD::SGD(std::vector<Tensor> params, SGDOptions options)
    : Optimizer(std::move(params)), opt_(options), momentum_(params_.size()) {
  check_params(params_, "SGD");
  CORELM_CHECK(options.lr >= 0.0f, ValueError, "SGD: lr must be >= 0, got ", options.lr);
  CORELM_CHECK(options.momentum >= 0.0f, ValueError, "SGD: momentum must be >= 0, got ",
               options.momentum);
  CORELM_CHECK(options.weight_decay >= 0.0f, ValueError, "SGD: weight_decay must be >= 0, got ",
               options.weight_decay);
  CORELM_CHECK(!options.nesterov || (options.momentum > 0.0f && options.dampening == 0.0f),
               ValueError, "SGD: nesterov needs momentum > 0 and dampening == 0");
  lr_ = options.lr;
}

void SGD::step() {
  autograd::NoGradGuard no_grad;
  const float lr = lr_, wd = opt_.weight_decay, mu = opt_.momentum;
  const float keep = 1.0f - opt_.dampening;
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    if (!p.grad().defined()) continue;
    float* w = param_data(p, "SGD");
    const Tensor g = grad_of(p, "SGD");
    const float* gd = g.data<float>();
    const int64_t n = p.numel();

    float* buf = nullptr;
    bool first = false;
    if (mu != 0.0f) {
      first = !momentum_[i].defined();
      if (first) momentum_[i] = Tensor::zeros(p.shape());
      buf = momentum_[i].data<float>();
    }
    for (int64_t j = 0; j < n; ++j) {
      float d = gd[j];
      if (wd != 0.0f) d += wd * w[j];
      if (buf) {
        buf[j] = first ? d : buf[j] * mu + keep * d;
        d = opt_.nesterov ? d + mu * buf[j] : buf[j];
      }
      w[j] -= lr * d;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// AdamW: p *= 1 - lr * wd; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
// p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps).
// One step counter for all parameters (torch keeps one per parameter; they differ only for a
// parameter that was skipped on some steps).

AdamW::AdamW(std::vector<Tensor> params, AdamWOptions options)
    : Optimizer(std::move(params)), opt_(options), weight_decay_(params_.size(), options.weight_decay) {
  check_params(params_, "AdamW");
  CORELM_CHECK(options.lr >= 0.0f, ValueError, "AdamW: lr must be >= 0, got ", options.lr);
  CORELM_CHECK(options.beta1 >= 0.0f && options.beta1 < 1.0f, ValueError,
               "AdamW: beta1 must be in [0, 1), got ", options.beta1);
  CORELM_CHECK(options.beta2 >= 0.0f && options.beta2 < 1.0f, ValueError,
               "AdamW: beta2 must be in [0, 1), got ", options.beta2);
  CORELM_CHECK(options.eps >= 0.0f, ValueError, "AdamW: eps must be >= 0, got ", options.eps);
  CORELM_CHECK(options.weight_decay >= 0.0f, ValueError, "AdamW: weight_decay must be >= 0, got ",
               options.weight_decay);
  lr_ = options.lr;
  m_.reserve(params_.size());
  v_.reserve(params_.size());
  for (const Tensor& p : params_) {
    m_.push_back(Tensor::zeros(p.shape()));
    v_.push_back(Tensor::zeros(p.shape()));
  }
}

void AdamW::set_weight_decay(size_t param_index, float wd) {
  CORELM_CHECK(param_index < params_.size(), IndexError, "AdamW::set_weight_decay: index ",
               param_index, " out of range for ", params_.size(), " parameters");
  CORELM_CHECK(wd >= 0.0f, ValueError, "AdamW::set_weight_decay: weight decay must be >= 0, got ", wd);
  weight_decay_[param_index] = wd;
}

void AdamW::step() {
  autograd::NoGradGuard no_grad;
  ++step_;
  // The scalar factors are computed in double and rounded once, as PyTorch does with Python floats.
  const double t = static_cast<double>(step_);
  const double b1 = opt_.beta1, b2 = opt_.beta2, lr = lr_;
  const float step_size = static_cast<float>(lr / (1.0 - std::pow(b1, t)));
  const float bc2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(b2, t)));
  const float beta1 = opt_.beta1, beta2 = opt_.beta2, eps = opt_.eps;
  const float one_minus_b1 = static_cast<float>(1.0 - b1), one_minus_b2 = static_cast<float>(1.0 - b2);

  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    if (!p.grad().defined()) continue;
    float* w = param_data(p, "AdamW");
    const Tensor g = grad_of(p, "AdamW");
    const float* gd = g.data<float>();
    float* m = m_[i].data<float>();
    float* v = v_[i].data<float>();
    ops::AdamWScalars s;
    s.decay = static_cast<float>(1.0 - lr * static_cast<double>(weight_decay_[i]));
    s.beta1 = beta1;
    s.one_minus_b1 = one_minus_b1;
    s.beta2 = beta2;
    s.one_minus_b2 = one_minus_b2;
    s.bc2_sqrt = bc2_sqrt;
    s.eps = eps;
    s.step_size = step_size;
    ops::adamw_update(w, gd, m, v, p.numel(), s);
  }
}

}  // namespace corelm::optim
