// What the two halves of the C++ autograd node's extension share (one extension,
// built by backends/c/torch_node.py from both): the plan's operations and the plan
// itself.  torch_node_source.cpp runs a plan (its operations, the autograd node,
// apply()); torch_node_compiled.cpp runs its forward and backward apart, as
// torch.compile's two custom operators do.  (In a named namespace: each file's view
// of Plan must be one type.)
#pragma once

// (not torch/extension.h, which torch_node_source.cpp includes for the autograd node:
// these declarations need only ATen and torch's pybind11 casters, and
// torch_node_compiled.cpp compiles in about 60% of the CPU time without the rest)
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/utils/pybind.h>

#include <cstdint>
#include <mutex>
#include <vector>

namespace py = pybind11;

typedef void (*kernel_fn)(void **, const int64_t *, const double *, const int64_t *,
                          const double *, int, int32_t *);

// (hidden, as pybind11's own types are: the extension exports only its module)
namespace einfuse_node __attribute__((visibility("hidden"))) {

enum OpKind { EMPTY = 0, SCRATCH = 1, CALL = 2, TOTAL = 3, CHECK = 4, CAST = 5, PRODUCT = 6 };

// PRODUCT: an operand, a view of one slot's tensor
struct View {
  int slot = -1;
  int64_t offset = 0;                  // elements past the tensor's own first
  std::vector<int64_t> sizes, strides;
};

struct Op {
  int kind = EMPTY;
  int slot = -1;                       // EMPTY, SCRATCH, TOTAL: the slot written
  std::vector<int64_t> sizes;          // EMPTY: the shape; TOTAL: the output shape
  at::ScalarType dtype = at::kFloat;
  int64_t rows = 0, padded = 0;        // SCRATCH: rows of ``padded`` elements, aligned
  bool zero = false;                   // SCRATCH: zeroed (column accumulators)
  int64_t align = 128;
  kernel_fn entry = nullptr;           // CALL
  const int64_t *ints = nullptr;
  const double *doubles = nullptr;
  const int64_t *integers = nullptr;
  const double *fills = nullptr;
  int threads = 0;                     // CALL: the prepared count
  int adaptive = 0;                    // 0 fixed, 1 a row kernel's rule, 2 a fused group's
  std::vector<int> buffers;            // CALL: the slots passed, in the kernel's order
  int sums = -1, errors = -1;          // TOTAL: the accumulators' slots
  int source = -1;                     // CAST: the index array's slot
  int64_t size = 0;                    // TOTAL: elements of the output; CHECK: the bound
  bool compensated = true;             // TOTAL: sums in the working dtype, errors beside
  bool owned = false;                  // EMPTY, SCRATCH: never leaves the run: the plan's own
  bool addmm = false;                  // PRODUCT: at::addmm(views[0], views[1], views[2])
  std::vector<View> views;             // PRODUCT: else at::matmul(views[0], views[1])
};

struct Layout {
  int slot;
  std::vector<int64_t> sizes, strides;
  at::ScalarType dtype;
};

// One signature's plan: what the Python objects it was made from keep alive (the
// kernels' ints and doubles), held with the GIL.
struct Plan {
  int slots = 0, passed = 0, recorded = 0;
  std::vector<Layout> inputs;          // the passed tensors' expected layouts
  std::vector<Op> forward, backward;
  std::vector<int> outputs;            // the forward's result slots
  std::vector<int> saved_inputs;       // passed slots the backward reads (version checked)
  std::vector<int> saved_outputs;      // indexes into outputs the backward reads
  std::vector<int> kept;               // other slots the backward reads
  std::vector<Layout> seeds;           // per output: the slot of its gradient, its layout
  std::vector<int> gradients;          // per recorded input: its gradient's slot
  py::object fallback;                 // (tensors, grads, wanted) -> gradients
  py::object keep;
  // the arrays of the operations that never leave a run, per direction, for the one
  // run at a time that holds the lock (another at the same time allocates its own)
  std::mutex forward_lock, backward_lock;
  std::vector<at::Tensor> forward_owned, backward_owned;

  // runs the forward's or the backward's operations (torch_node_source.cpp)
  bool run(bool backward_run, std::vector<at::Tensor> &slots, int free);

  ~Plan() {
    if (Py_IsInitialized()) {
      py::gil_scoped_acquire held;
      fallback = py::object();
      keep = py::object();
    } else {
      fallback.release();
      keep.release();
    }
  }
};

// the passed tensors are laid out as the plan was translated for (dtype, sizes, strides,
// a CPU strided tensor with no negation or conjugation flag)
bool passed_match(const Plan &p, const std::vector<at::Tensor> &tensors);

// The plan's forward on the passed tensors (checked by passed_match) into ``slots``, the
// GIL released; false where a kernel raised its error flag.
bool forward_of(const std::shared_ptr<Plan> &plan, const std::vector<at::Tensor> &tensors,
                int free, std::vector<at::Tensor> &slots);

// forward_slots and backward_slots, defined on the module (torch_node_compiled.cpp)
void define_compiled(py::module_ &m);

// the call signatures remembered by layout (torch_node_calls.cpp)
void define_signature(py::module_ &m);

}  // namespace einfuse_node
