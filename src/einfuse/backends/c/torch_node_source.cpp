// A program's recorded call on CPU torch tensors as one C++ autograd node
// (backends/c/torch_node.py builds it, runtime/torch_node.py hands it its plans).
//
// A plan is a list of operations on numbered slots, each slot one tensor of a call:
// the passed tensors first, then every array the prepared forward and backward make.
// An operation allocates a slot, calls a compiled kernel (the same function pointer,
// runtime ints and doubles the Python runner calls) on slots, or adds up a column
// member's per-thread accumulators as backends/c/fused.py's column_total does, or
// multiplies views of slots on torch's BLAS as the Python path's runner of a product
// statement does (at::matmul, at::addmm: the functions its torch.matmul and
// torch.addmm are, on views of the same layouts: runtime/torch_node_products.py).  The
// forward runs its plan when apply() is called; the backward's plan runs inside the
// autograd engine, with no Python, except a backward that must itself be
// differentiable (create_graph=True): it calls back the Python path under the GIL.
//
// torch_node_compiled.cpp: the plan's two halves run apart, under torch.compile;
// torch_node.h: the plan itself, which both files read.
#include <torch/extension.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>

#include <ATen/EmptyTensor.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "torch_node.h"

using torch::autograd::Node;
using torch::autograd::SavedVariable;
using torch::autograd::variable_list;

namespace einfuse_node __attribute__((visibility("hidden"))) {

namespace {

at::Tensor view_of(const at::Tensor &t, const View &v) {
  if (v.offset == 0 && t.sizes() == c10::IntArrayRef(v.sizes) &&
      t.strides() == c10::IntArrayRef(v.strides))
    return t;
  return t.as_strided(v.sizes, v.strides, t.storage_offset() + v.offset);
}

// An array of a plain CPU tensor, allocated without the dispatcher (a dozen
// allocations a backward cost more than its small kernels through at::empty).
at::Tensor allocate(c10::IntArrayRef sizes, at::ScalarType dtype, bool zero) {
  at::Tensor t = at::detail::empty_cpu(sizes, dtype);
  if (zero && t.numel()) std::memset(t.data_ptr(), 0, t.numel() * t.element_size());
  return t;
}

int threads_for(const Op &op, int free) {
  if (op.adaptive == 0) return op.threads;
  int count = free ? free : op.threads;
  if (op.adaptive == 2 && op.threads) count = std::min(count, op.threads);
  return count;
}

template <typename Sum, typename Out>
void add_columns(const Op &op, const at::Tensor &sums, const at::Tensor &errors,
                 at::Tensor &out) {
  const Sum *s = sums.data_ptr<Sum>();
  const int64_t stride = sums.stride(0), rows = sums.size(0);
  Out *o = out.data_ptr<Out>();
  if (op.compensated) {
    // a finite sum plus its error, the slices added in order (column_total)
    const Sum *e = errors.data_ptr<Sum>();
    for (int64_t i = 0; i < op.size; ++i) {
      Sum v = std::isfinite(s[i]) ? (Sum)(s[i] + e[i]) : s[i];
      for (int64_t r = 1; r < rows; ++r) {
        Sum w = s[r * stride + i];
        v = (Sum)(v + (std::isfinite(w) ? (Sum)(w + e[r * stride + i]) : w));
      }
      o[i] = (Out)v;
    }
  } else {     // wide sums: added up in their own dtype, rounded once
    for (int64_t i = 0; i < op.size; ++i) {
      Sum v = s[i];
      for (int64_t r = 1; r < rows; ++r) v = (Sum)(v + s[r * stride + i]);
      o[i] = (Out)v;
    }
  }
}

// Whether every value of an index array lies in 0..size-1 (a scatter's labels, checked
// before the kernels run as program_scatter.check_labels does).
template <typename Index>
bool labels_in_range(const at::Tensor &labels, int64_t size) {
  at::Tensor plain = labels.contiguous();
  const Index *v = plain.data_ptr<Index>();
  bool inside = true;
  for (int64_t i = 0, n = plain.numel(); i < n; ++i)
    inside &= v[i] >= 0 && (int64_t)v[i] < size;
  return inside;
}

// An index array's values in a kernel's working dtype, as NumPy's astype makes them
// (a fused group that compares an index with a loop counter reads them so).
template <typename Index, typename Value>
void cast_values(const at::Tensor &from, at::Tensor &to) {
  at::Tensor plain = from.contiguous();
  const Index *v = plain.data_ptr<Index>();
  Value *o = to.data_ptr<Value>();
  for (int64_t i = 0, n = plain.numel(); i < n; ++i) o[i] = (Value)v[i];
}

// Runs ``ops`` on ``slots``; false where a kernel raised its error flag or a label
// check failed (an index out of bounds: nothing is to be delivered, the caller's full
// path names it).  ``owned``
// (the plan's arrays by operation, or null): where the arrays of the operations that
// never leave a run are kept from one run to the next, as the Python runners keep theirs.
bool run_ops(const std::vector<Op> &ops, std::vector<at::Tensor> &slots, int free,
             std::vector<at::Tensor> *owned) {
  void *pointers[64];
  for (size_t number = 0; number < ops.size(); ++number) {
    const Op &op = ops[number];
    at::Tensor *kept = owned && op.owned ? &(*owned)[number] : nullptr;
    if (op.kind == CHECK) {
      const at::Tensor &labels = slots[op.slot];
      bool inside = labels.scalar_type() == at::kLong ? labels_in_range<int64_t>(labels, op.size)
                                                      : labels_in_range<int32_t>(labels, op.size);
      if (!inside) return false;
      continue;
    }
    if (kept && kept->defined() && op.kind != CALL && op.kind != TOTAL) {
      if (op.zero) std::memset(kept->data_ptr(), 0, kept->numel() * kept->element_size());
      slots[op.slot] = *kept;
      continue;
    }
    switch (op.kind) {
      case EMPTY:
        slots[op.slot] = allocate(op.sizes, op.dtype, false);
        break;
      case SCRATCH: {
        // rows starting on ``align``-byte boundaries (plan/thread_rows.thread_scratch)
        int64_t item = c10::elementSize(op.dtype), line = std::max<int64_t>(1, op.align / item);
        at::Tensor raw = allocate({op.rows * op.padded + line}, op.dtype, op.zero);
        int64_t address = (int64_t)(uintptr_t)raw.data_ptr();
        int64_t start = ((-address) % op.align + op.align) % op.align / item;
        slots[op.slot] = raw.narrow(0, start, op.rows * op.padded).view({op.rows, op.padded});
        break;
      }
      case CALL: {
        size_t n = op.buffers.size();
        for (size_t i = 0; i < n; ++i) pointers[i] = slots[op.buffers[i]].data_ptr();
        int32_t error = 0;
        op.entry(pointers, op.ints, op.doubles, op.integers, op.fills, threads_for(op, free),
                 &error);
        if (error) return false;
        break;
      }
      case CAST: {
        const at::Tensor &from = slots[op.source];
        at::Tensor out = allocate(op.sizes, op.dtype, false);
        bool wide = from.scalar_type() == at::kLong;
        TORCH_CHECK(wide || from.scalar_type() == at::kInt,
                    "einfuse torch node: a cast from an unplanned dtype");
        if (op.dtype == at::kFloat)
          wide ? cast_values<int64_t, float>(from, out) : cast_values<int32_t, float>(from, out);
        else
          wide ? cast_values<int64_t, double>(from, out) : cast_values<int32_t, double>(from, out);
        slots[op.slot] = out;
        break;
      }
      case PRODUCT: {
        const std::vector<View> &v = op.views;
        slots[op.slot] = op.addmm
            ? at::addmm(view_of(slots[v[0].slot], v[0]), view_of(slots[v[1].slot], v[1]),
                        view_of(slots[v[2].slot], v[2]))
            : at::matmul(view_of(slots[v[0].slot], v[0]), view_of(slots[v[1].slot], v[1]));
        // (the plan lays the result out C-contiguous, as torch.matmul's .numpy() is)
        if (!slots[op.slot].is_contiguous()) slots[op.slot] = slots[op.slot].contiguous();
        break;
      }
      case TOTAL: {
        at::Tensor out = allocate(op.sizes, op.dtype, false);
        const at::Tensor &sums = slots[op.sums], &errors = slots[op.errors];
        at::ScalarType wide = sums.scalar_type();
        if (wide == at::kDouble && op.dtype == at::kDouble)
          add_columns<double, double>(op, sums, errors, out);
        else if (wide == at::kFloat && op.dtype == at::kFloat)
          add_columns<float, float>(op, sums, errors, out);
        else if (wide == at::kDouble && op.dtype == at::kFloat)
          add_columns<double, float>(op, sums, errors, out);
        else
          TORCH_CHECK(false, "einfuse torch node: column sums of an unplanned dtype");
        slots[op.slot] = out;
        break;
      }
    }
    if (kept) *kept = slots[op.slot];
  }
  return true;
}

Op op_of(py::tuple t) {
  Op op;
  op.kind = t[0].cast<int>();
  if (op.kind == EMPTY) {
    op.slot = t[1].cast<int>();
    op.sizes = t[2].cast<std::vector<int64_t>>();
    op.dtype = (at::ScalarType)t[3].cast<int>();
    op.owned = t[4].cast<bool>();
  } else if (op.kind == SCRATCH) {
    op.slot = t[1].cast<int>();
    op.rows = t[2].cast<int64_t>();
    op.padded = t[3].cast<int64_t>();
    op.dtype = (at::ScalarType)t[4].cast<int>();
    op.zero = t[5].cast<bool>();
    op.align = t[6].cast<int64_t>();
    op.owned = t[7].cast<bool>();
  } else if (op.kind == CALL) {
    op.entry = (kernel_fn)(uintptr_t)t[1].cast<uint64_t>();
    op.ints = (const int64_t *)(uintptr_t)t[2].cast<uint64_t>();
    op.doubles = (const double *)(uintptr_t)t[3].cast<uint64_t>();
    op.integers = (const int64_t *)(uintptr_t)t[4].cast<uint64_t>();
    op.fills = (const double *)(uintptr_t)t[5].cast<uint64_t>();
    op.adaptive = t[6].cast<int>();
    op.threads = t[7].cast<int>();
    op.buffers = t[8].cast<std::vector<int>>();
    TORCH_CHECK(op.entry && op.buffers.size() <= 64, "einfuse torch node: a bad kernel call");
  } else if (op.kind == TOTAL) {
    op.slot = t[1].cast<int>();
    op.sums = t[2].cast<int>();
    op.errors = t[3].cast<int>();
    op.size = t[4].cast<int64_t>();
    op.sizes = t[5].cast<std::vector<int64_t>>();
    op.dtype = (at::ScalarType)t[6].cast<int>();
    op.compensated = t[7].cast<bool>();
  } else if (op.kind == CHECK) {
    op.slot = t[1].cast<int>();
    op.size = t[2].cast<int64_t>();
  } else if (op.kind == CAST) {
    op.slot = t[1].cast<int>();
    op.source = t[2].cast<int>();
    op.sizes = t[3].cast<std::vector<int64_t>>();
    op.dtype = (at::ScalarType)t[4].cast<int>();
    TORCH_CHECK(op.dtype == at::kFloat || op.dtype == at::kDouble,
                "einfuse torch node: a cast to an unplanned dtype");
  } else if (op.kind == PRODUCT) {
    op.slot = t[1].cast<int>();
    op.addmm = t[2].cast<bool>();
    for (auto item : t[3].cast<py::list>()) {
      py::tuple u = item.cast<py::tuple>();
      View v;
      v.slot = u[0].cast<int>();
      v.offset = u[1].cast<int64_t>();
      v.sizes = u[2].cast<std::vector<int64_t>>();
      v.strides = u[3].cast<std::vector<int64_t>>();
      op.views.push_back(v);
    }
    TORCH_CHECK(op.views.size() == (op.addmm ? 3u : 2u), "einfuse torch node: a bad product");
  } else {
    TORCH_CHECK(false, "einfuse torch node: an unknown operation");
  }
  return op;
}

std::vector<Op> ops_of(py::list items) {
  std::vector<Op> ops;
  for (auto item : items) ops.push_back(op_of(item.cast<py::tuple>()));
  return ops;
}

}  // namespace

bool Plan::run(bool backward_run, std::vector<at::Tensor> &slots, int free) {
  const std::vector<Op> &ops = backward_run ? backward : forward;
  std::mutex &lock = backward_run ? backward_lock : forward_lock;
  std::unique_lock<std::mutex> held(lock, std::try_to_lock);
  if (!held.owns_lock()) return run_ops(ops, slots, free, nullptr);
  std::vector<at::Tensor> &owned = backward_run ? backward_owned : forward_owned;
  if (owned.size() != ops.size()) owned.resize(ops.size());
  return run_ops(ops, slots, free, &owned);
}

struct ProgramNode : public Node {
  std::shared_ptr<Plan> plan;
  std::vector<SavedVariable> inputs, outputs;
  std::vector<at::Tensor> kept;
  int free = 0;

  variable_list apply(variable_list &&grads) override {
    const Plan &p = *plan;
    auto self = c10::intrusive_ptr<Node>::reclaim_copy(this);
    std::vector<at::Tensor> slots(p.slots);
    variable_list passed;
    for (size_t i = 0; i < inputs.size(); ++i) {
      slots[p.saved_inputs[i]] = inputs[i].unpack(self);     // (torch's version check)
      passed.push_back(slots[p.saved_inputs[i]]);
    }
    std::vector<at::Tensor> results;
    for (size_t i = 0; i < outputs.size(); ++i) results.push_back(outputs[i].unpack(self));
    for (size_t i = 0; i < p.saved_outputs.size(); ++i)
      slots[p.outputs[p.saved_outputs[i]]] = results[i];
    for (size_t i = 0; i < p.kept.size(); ++i) slots[p.kept[i]] = kept[i];
    std::vector<bool> wanted;
    for (int i = 0; i < p.recorded; ++i) wanted.push_back(task_should_compute_output(i));
    for (size_t i = 0; i < grads.size() && i < p.seeds.size(); ++i)
      if (!grads[i].defined())      // (an output the loss does not read: zeros, as torch's)
        grads[i] = at::zeros(p.seeds[i].sizes, at::TensorOptions().dtype(p.seeds[i].dtype));
    // create_graph=True, or a label check or kernel flag below: the Python path, which
    // differentiates or raises the statement's own error
    auto python_path = [&]() {
      py::gil_scoped_acquire held;
      py::list given, seeds, asked;
      for (auto &t : passed) given.append(t);
      for (auto &g : grads) seeds.append(g);
      for (bool w : wanted) asked.append(w);
      py::list found = p.fallback(given, seeds, asked);
      variable_list out;
      for (auto item : found)
        out.push_back(item.is_none() ? at::Tensor() : item.cast<at::Tensor>());
      return out;
    };
    if (at::GradMode::is_enabled()) return python_path();
    for (size_t i = 0; i < p.seeds.size(); ++i) {
      const Layout &seed = p.seeds[i];
      at::Tensor g = grads[i];
      if (g.scalar_type() != seed.dtype || g.sizes() != c10::IntArrayRef(seed.sizes) ||
                 g.strides() != c10::IntArrayRef(seed.strides) || g.storage_offset() != 0 ||
                 g.is_neg() || g.is_conj() || g.layout() != at::kStrided) {
        g = g.to(seed.dtype).contiguous().resolve_neg().resolve_conj();
        if (g.strides() != c10::IntArrayRef(seed.strides)) g = g.clone();
        TORCH_CHECK(g.sizes() == c10::IntArrayRef(seed.sizes) &&
                    g.strides() == c10::IntArrayRef(seed.strides),
                    "einfuse torch node: a gradient of an unexpected shape");
      }
      slots[seed.slot] = g;
    }
    if (!plan->run(true, slots, free)) return python_path();
    variable_list out;
    for (int i = 0; i < p.recorded; ++i)
      out.push_back(wanted[i] && p.gradients[i] >= 0 ? slots[p.gradients[i]] : at::Tensor());
    return out;
  }

  void release_variables() override {
    for (auto &s : inputs) s.reset_data();
    for (auto &s : outputs) s.reset_data();
    kept.clear();
  }

  std::string name() const override { return "EinfuseProgramBackward"; }
};

std::shared_ptr<Plan> make_plan(int slots, int passed, int recorded, py::list inputs,
                                py::list forward, py::list backward, std::vector<int> outputs,
                                std::vector<int> saved_inputs, std::vector<int> saved_outputs,
                                std::vector<int> kept, py::list seeds,
                                std::vector<int> gradients, py::object fallback,
                                py::object keep) {
  auto plan = std::make_shared<Plan>();
  plan->slots = slots;
  plan->passed = passed;
  plan->recorded = recorded;
  auto layouts = [](py::list items) {
    std::vector<Layout> found;
    for (auto item : items) {
      py::tuple t = item.cast<py::tuple>();
      found.push_back({t[0].cast<int>(), t[1].cast<std::vector<int64_t>>(),
                       t[2].cast<std::vector<int64_t>>(), (at::ScalarType)t[3].cast<int>()});
    }
    return found;
  };
  plan->inputs = layouts(inputs);
  plan->forward = ops_of(forward);
  plan->backward = ops_of(backward);
  plan->outputs = outputs;
  plan->saved_inputs = saved_inputs;
  plan->saved_outputs = saved_outputs;
  plan->kept = kept;
  plan->seeds = layouts(seeds);
  plan->gradients = gradients;
  plan->fallback = fallback;
  plan->keep = keep;
  TORCH_CHECK((int)plan->gradients.size() == recorded && (int)plan->seeds.size() ==
              (int)outputs.size(), "einfuse torch node: an inconsistent plan");
  return plan;
}

// (passed_match, forward_of: torch_node.h says what they do; the compiled halves call
// them too)
bool passed_match(const Plan &p, const std::vector<at::Tensor> &tensors) {
  if ((int)tensors.size() != p.passed) return false;
  for (const Layout &l : p.inputs) {
    const at::Tensor &t = tensors[l.slot];
    if (t.scalar_type() != l.dtype || t.sizes() != c10::IntArrayRef(l.sizes) ||
        t.strides() != c10::IntArrayRef(l.strides) || t.device().type() != at::kCPU ||
        t.layout() != at::kStrided || t.is_neg() || t.is_conj())
      return false;
  }
  return true;
}

bool forward_of(const std::shared_ptr<Plan> &plan, const std::vector<at::Tensor> &tensors,
                int free, std::vector<at::Tensor> &slots) {
  slots.assign(plan->slots, at::Tensor());
  for (int i = 0; i < plan->passed; ++i) slots[i] = tensors[i];
  py::gil_scoped_release released;
  at::AutoDispatchBelowADInplaceOrView below;
  return plan->run(false, slots, free);
}

// The outputs of one call (a tuple), recorded as one node where grad mode is on and a
// recorded input requires a gradient; None where a tensor's layout is not the plan's
// or a kernel raised its error flag (nothing delivered: the caller's Python path runs).
py::object apply(std::shared_ptr<Plan> plan, std::vector<at::Tensor> tensors, int free) {
  const Plan &p = *plan;
  if (!passed_match(p, tensors)) return py::none();
  for (const Layout &l : p.inputs) {
    const at::Tensor &t = tensors[l.slot];
    // (an inference tensor cannot be recorded; forward-mode AD: the Python path says
    // what it does)
    if (t.is_inference() || t._fw_grad(0).defined()) return py::none();
  }
  std::vector<at::Tensor> slots;
  if (!forward_of(plan, tensors, free, slots)) return py::none();
  std::vector<at::Tensor> results;
  for (int slot : p.outputs) results.push_back(slots[slot]);
  bool record = at::GradMode::is_enabled();
  if (record) {
    record = false;
    for (int i = 0; i < p.recorded; ++i) record = record || tensors[i].requires_grad();
  }
  if (record) {
    auto node = c10::make_intrusive<ProgramNode>();
    node->plan = plan;
    node->free = free;
    variable_list recorded(tensors.begin(), tensors.begin() + p.recorded);
    node->set_next_edges(torch::autograd::collect_next_edges(recorded));
    for (auto &r : results) torch::autograd::set_history(r, node);
    for (int slot : p.saved_inputs) node->inputs.emplace_back(tensors[slot], false);
    for (int index : p.saved_outputs) node->outputs.emplace_back(results[index], true);
    for (int slot : p.kept) node->kept.push_back(slots[slot]);
  }
  py::tuple found(results.size());
  for (size_t i = 0; i < results.size(); ++i) found[i] = py::cast(results[i]);
  return found;
}

}  // namespace einfuse_node

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  py::class_<einfuse_node::Plan, std::shared_ptr<einfuse_node::Plan>>(m, "Plan");
  m.def("make_plan", &einfuse_node::make_plan);
  m.def("apply", &einfuse_node::apply);
  einfuse_node::define_compiled(m);
  einfuse_node::define_signature(m);
}
