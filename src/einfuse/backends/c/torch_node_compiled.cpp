// Under torch.compile (program/torch_compiled_fused.py) a call is two custom operators,
// so the plan's two halves run apart, recording nothing: forward_slots runs the forward
// and returns the slots ``returned`` (the outputs, then what the backward reads), which
// the compiled graph keeps; backward_slots runs the backward on the slots ``given`` set
// again from them.  Either is None where apply() would decline the call or a kernel
// raised its flag (the operator's Python path runs, and raises the statement's error).
// (Built into the same extension as torch_node_source.cpp, which runs the plan.)
#include "torch_node.h"

namespace einfuse_node __attribute__((visibility("hidden"))) {

namespace {

py::object forward_slots(std::shared_ptr<Plan> plan, std::vector<at::Tensor> tensors,
                         int free, std::vector<int> returned) {
  const Plan &p = *plan;
  if (!passed_match(p, tensors)) return py::none();
  std::vector<at::Tensor> slots;
  if (!forward_of(plan, tensors, free, slots)) return py::none();
  py::tuple found(returned.size());
  for (size_t i = 0; i < returned.size(); ++i) {
    TORCH_CHECK(returned[i] >= 0 && returned[i] < p.slots && slots[returned[i]].defined(),
                "einfuse torch node: a slot the forward does not make");
    found[i] = py::cast(slots[returned[i]]);
  }
  return found;
}

// ``given``: the passed tensors (checked as the forward's), then the forward's returned
// slots, each contiguous, of dtype ``dtypes[i]`` and ``numels[i]`` elements (else None).
py::object backward_slots(std::shared_ptr<Plan> plan, std::vector<int> at_slots,
                          std::vector<at::Tensor> given, py::list grads, int free,
                          std::vector<int> dtypes, std::vector<int64_t> numels) {
  const Plan &p = *plan;
  TORCH_CHECK(at_slots.size() == given.size() && (int)grads.size() == (int)p.seeds.size() &&
              (int)given.size() >= p.passed && dtypes.size() == given.size() - p.passed &&
              numels.size() == dtypes.size(),
              "einfuse torch node: an inconsistent backward call");
  std::vector<at::Tensor> passed(given.begin(), given.begin() + p.passed);
  if (!passed_match(p, passed)) return py::none();
  for (size_t i = p.passed; i < given.size(); ++i) {
    const at::Tensor &t = given[i];
    if (t.scalar_type() != (at::ScalarType)dtypes[i - p.passed] ||
        t.numel() != numels[i - p.passed] || !t.is_contiguous() ||
        t.device().type() != at::kCPU || t.layout() != at::kStrided || t.is_neg() ||
        t.is_conj())
      return py::none();
  }
  std::vector<at::Tensor> slots(p.slots);
  for (size_t i = 0; i < at_slots.size(); ++i) {
    TORCH_CHECK(at_slots[i] >= 0 && at_slots[i] < p.slots,
                "einfuse torch node: a slot out of range");
    slots[at_slots[i]] = given[i];
  }
  for (size_t i = 0; i < p.seeds.size(); ++i) {
    const Layout &seed = p.seeds[i];
    at::Tensor g;
    if (grads[i].is_none()) {     // (an output the loss does not read: zeros)
      g = at::zeros(seed.sizes, at::TensorOptions().dtype(seed.dtype));
    } else {
      g = grads[i].cast<at::Tensor>();
      if (g.scalar_type() != seed.dtype || g.sizes() != c10::IntArrayRef(seed.sizes) ||
          g.strides() != c10::IntArrayRef(seed.strides) || g.storage_offset() != 0 ||
          g.is_neg() || g.is_conj() || g.layout() != at::kStrided ||
          g.device().type() != at::kCPU) {
        if (g.sizes() != c10::IntArrayRef(seed.sizes) || g.device().type() != at::kCPU)
          return py::none();
        g = g.to(seed.dtype).contiguous().resolve_neg().resolve_conj();
        if (g.strides() != c10::IntArrayRef(seed.strides)) g = g.clone();
        if (g.strides() != c10::IntArrayRef(seed.strides)) return py::none();
      }
    }
    slots[seed.slot] = g;
  }
  bool done;
  {
    py::gil_scoped_release released;
    at::AutoDispatchBelowADInplaceOrView below;
    at::NoGradGuard no_grad;
    done = plan->run(true, slots, free);
  }
  if (!done) return py::none();
  // an operator's results alias none of its arguments nor each other (torch.compile
  // reuses and frees buffers by that contract): a gradient that is a given tensor or
  // a seed (dX = dy) or another gradient's memory is copied
  std::vector<at::Tensor> taken(given.begin(), given.end());
  for (size_t i = 0; i < p.seeds.size(); ++i) taken.push_back(slots[p.seeds[i].slot]);
  py::list found;
  for (int i = 0; i < p.recorded; ++i) {
    if (p.gradients[i] < 0) {
      found.append(py::none());
      continue;
    }
    at::Tensor g = slots[p.gradients[i]];
    for (const at::Tensor &other : taken) {
      if (other.defined() && g.is_alias_of(other)) {
        g = g.clone();
        break;
      }
    }
    taken.push_back(g);
    found.append(py::cast(g));
  }
  return found;
}

}  // namespace

void define_compiled(py::module_ &m) {
  m.def("forward_slots", &forward_slots);
  m.def("backward_slots", &backward_slots);
}

}  // namespace einfuse_node
