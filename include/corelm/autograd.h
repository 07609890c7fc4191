// Eager reverse-mode autograd. Every differentiable op that sees an input with requires_grad
// records a Node on its output; Tensor::backward() walks those nodes in reverse topological
// order, accumulating gradients into leaves (`.grad()`). Backward formulas run with recording
// off, so there is no higher-order differentiation.
#pragma once
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "corelm/tensor.h"

namespace corelm::autograd {

// A recorded operation: knows its inputs (the graph edges) and how to map the gradient of its
// output to gradients of those inputs (undefined Tensor = no gradient for that input).
struct Node {
  std::string name;
  std::vector<Tensor> inputs;
  virtual ~Node() = default;
  virtual std::vector<Tensor> backward(const Tensor& grad_output) = 0;
};

using BackwardFn = std::function<std::vector<Tensor>(const Tensor& grad_output)>;

// True unless a NoGradGuard is alive on this thread.
bool grad_mode_enabled();

// Disables recording for its lifetime (inference, optimizer updates).
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

// Whether an op with these inputs must record (grad mode on and some input requires grad).
bool needs_grad(std::initializer_list<Tensor> inputs);
bool needs_grad(const std::vector<Tensor>& inputs);

// Attaches a Node named `name` to `output`. Saved tensors must be captured detached (see
// Tensor::detach) so the graph holds no cycles through the output.
void record(Tensor& output, std::string name, std::vector<Tensor> inputs, BackwardFn backward);

// Runs backward from `root` with seed gradient `grad` (ones for a scalar root when undefined).
void backward(const Tensor& root, const Tensor& grad = Tensor());

// Called by backward() on the calling thread right after it wrote a leaf's .grad() for the last
// time in that call (every consumer of the leaf has contributed), so data-parallel training can
// start reducing that gradient while the rest of backward runs. Installed for the lifetime of a
// LeafGradHookScope on this thread (scopes nest; the innermost one is called).
using LeafGradHook = std::function<void(const Tensor& leaf)>;
class LeafGradHookScope {
 public:
  explicit LeafGradHookScope(LeafGradHook hook);
  ~LeafGradHookScope();
  LeafGradHookScope(const LeafGradHookScope&) = delete;
  LeafGradHookScope& operator=(const LeafGradHookScope&) = delete;

 private:
  LeafGradHook hook_;
  const LeafGradHook* previous_;
};

}  // namespace corelm::autograd
