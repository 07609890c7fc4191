#include <unordered_map>
#include <unordered_set>

#include "../core/tensor_impl.h"
#include "corelm/autograd.h"

namespace corelm {

void Tensor::backward(const Tensor& grad) const { autograd::backward(*this, grad); }

namespace autograd {

namespace {
thread_local bool g_grad_mode = true;
thread_local const LeafGradHook* g_leaf_hook = nullptr;

// The running gradient a plus b, in a fresh tensor (a or b may be shared with other slots). One
// pass writing a + b, rather than a clone of a and a second pass adding b: on the training profile
// the copy was ~1% of a step.
Tensor accumulate(const Tensor& a, const Tensor& b) {
  if (!a.defined()) return b;
  const Tensor aa = a.contiguous().to(DType::F32);
  const Tensor bb = b.contiguous().to(DType::F32);
  Tensor out = Tensor::empty(aa.shape());
  float* po = out.data<float>();
  const float* pa = aa.data<float>();
  const float* pb = bb.data<float>();
  for (int64_t i = 0, n = out.numel(); i < n; ++i) po[i] = pa[i] + pb[i];
  return out;
}

struct LambdaNode : Node {
  BackwardFn fn;
  std::vector<Tensor> backward(const Tensor& g) override { return fn(g); }
};
}  // namespace

bool grad_mode_enabled() { return g_grad_mode; }

LeafGradHookScope::LeafGradHookScope(LeafGradHook hook) : hook_(std::move(hook)), previous_(g_leaf_hook) {
  g_leaf_hook = &hook_;
}
LeafGradHookScope::~LeafGradHookScope() { g_leaf_hook = previous_; }

NoGradGuard::NoGradGuard() : previous_(g_grad_mode) { g_grad_mode = false; }
NoGradGuard::~NoGradGuard() { g_grad_mode = previous_; }

bool needs_grad(const std::vector<Tensor>& inputs) {
  if (!g_grad_mode) return false;
  for (const Tensor& t : inputs)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

bool needs_grad(std::initializer_list<Tensor> inputs) { return needs_grad(std::vector<Tensor>(inputs)); }

void record(Tensor& output, std::string name, std::vector<Tensor> inputs, BackwardFn backward) {
  auto node = std::make_shared<LambdaNode>();
  node->name = std::move(name);
  node->inputs = std::move(inputs);
  node->fn = std::move(backward);
  output.set_grad_fn(std::move(node));
}

void backward(const Tensor& root, const Tensor& grad) {
  CORELM_CHECK(root.defined(), AutogradError, "backward() on an undefined tensor");
  CORELM_CHECK(root.requires_grad(), AutogradError, "backward(): tensor ", shape_str(root.shape()),
               " does not require grad (no input had requires_grad, or it was computed under no-grad)");
  Tensor seed = grad;
  if (!seed.defined()) {
    CORELM_CHECK(root.numel() == 1, AutogradError, "backward(): implicit gradient only for scalar outputs; got ",
                 shape_str(root.shape()), " — pass a gradient tensor");
    seed = Tensor::ones(root.shape());
  }
  CORELM_CHECK(seed.shape() == root.shape(), ShapeError, "backward(): gradient ", shape_str(seed.shape()),
               " does not match output ", shape_str(root.shape()));

  // Order the graph so each tensor is processed after every consumer has contributed its
  // gradient: iterative DFS post-order, then reverse.
  std::vector<Tensor> order;
  std::unordered_set<const void*> visited;
  std::vector<std::pair<Tensor, size_t>> stack{{root, 0}};
  visited.insert(root.id());
  while (!stack.empty()) {
    auto& [t, next] = stack.back();
    const auto& fn = t.grad_fn();
    if (fn && next < fn->inputs.size()) {
      const Tensor& in = fn->inputs[next++];
      if (in.defined() && in.requires_grad() && visited.insert(in.id()).second) stack.push_back({in, 0});
      continue;
    }
    order.push_back(t);
    stack.pop_back();
  }

  NoGradGuard no_grad;
  std::unordered_map<const void*, Tensor> grads;
  grads[root.id()] = seed;
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const Tensor& t = *it;
    auto found = grads.find(t.id());
    if (found == grads.end()) continue;
    Tensor g = found->second;
    grads.erase(found);
    const auto& fn = t.grad_fn();
    if (!fn) {  // a leaf: accumulate into .grad like PyTorch
      Tensor prev = t.grad();
      Tensor& leaf = const_cast<Tensor&>(t);
      // Cloned so that no two leaves (or a leaf and a later step) ever share gradient memory.
      leaf.set_grad(prev.defined() ? accumulate(prev, g) : g.contiguous().to(DType::F32).clone());
      if (g_leaf_hook) (*g_leaf_hook)(t);
      continue;
    }
    std::vector<Tensor> in_grads = fn->backward(g);
    CORELM_CHECK(in_grads.size() == fn->inputs.size(), AutogradError, "backward of '", fn->name, "' returned ",
                 in_grads.size(), " gradients for ", fn->inputs.size(), " inputs");
    for (size_t i = 0; i < in_grads.size(); ++i) {
      const Tensor& in = fn->inputs[i];
      if (!in.defined() || !in.requires_grad() || !in_grads[i].defined()) continue;
      CORELM_CHECK(in_grads[i].shape() == in.shape(), AutogradError, "backward of '", fn->name, "': gradient ",
                   shape_str(in_grads[i].shape()), " for input ", i, " of shape ", shape_str(in.shape()));
      Tensor& slot = grads[in.id()];
      slot = accumulate(slot, in_grads[i]);
    }
  }
}

}  // namespace autograd
}  // namespace corelm
