// Call signatures remembered by the layout of a call's arguments (runtime/signatures.py):
// every repeated call on torch tensors builds its signature -- names, shapes, dtypes,
// strides, requires_grad -- as a tuple of tuples, about 0.7 us a tensor in Python and
// several objects for the garbage collector to count.  Here the same facts are read
// from the tensors in C++ into a byte key, and a key seen before gives back the very
// tuple Python built for it then (so it is equal to, and hashes as, what Python would
// build now).  Anything Python's rules treat specially -- a NumPy array, a subclass,
// a torch.func wrapper, a forward-mode tangent, a tensor off the CPU or not strided --
// gives no key: Python builds the signature as before.
#include "torch_node.h"

#include <torch/csrc/autograd/python_variable.h>

#include <string>
#include <unordered_map>

namespace einfuse_node __attribute__((visibility("hidden"))) {

namespace {

struct Remembered {
  py::object signature;
  // the argument names the key holds by address, kept alive while it is remembered
  // (so no other string can take the address)
  std::vector<py::object> names;
};

// (never destroyed: its Python objects must not be released after the interpreter
// has finalized, as a static's destructor at exit would)
std::unordered_map<std::string, Remembered> &remembered =
    *new std::unordered_map<std::string, Remembered>();
// (past this many layouts the oldest are not worth finding: all are forgotten)
constexpr size_t kept = 4096;
PyObject *tensor_type = nullptr, *parameter_type = nullptr;

void put(std::string &key, int64_t value) {
  key.append(reinterpret_cast<const char *>(&value), sizeof value);
}

// The key of ``kwargs`` (a dict) for a caller that is (``views``) or is not on views of
// a torch caller's tensors; false where Python must build the signature itself.
bool key_of(PyObject *kwargs, bool views, std::string &key,
            std::vector<py::object> *names) {
  key.clear();
  put(key, views ? 1 : 0);
  Py_ssize_t position = 0;
  PyObject *name, *value;
  while (PyDict_Next(kwargs, &position, &name, &value)) {
    put(key, static_cast<int64_t>(reinterpret_cast<uintptr_t>(name)));
    if (names != nullptr) names->push_back(py::reinterpret_borrow<py::object>(name));
    PyObject *type = reinterpret_cast<PyObject *>(Py_TYPE(value));
    if (type == reinterpret_cast<PyObject *>(&PyFloat_Type)) {
      put(key, -1);
      continue;
    }
    if (tensor_type == nullptr || (type != tensor_type && type != parameter_type))
      return false;
    const at::Tensor &t = THPVariable_Unpack(value);
    if (t.layout() != at::kStrided || t.is_nested() || t.device().type() != at::kCPU)
      return false;
    c10::DispatchKeySet keys = t.key_set();
    // (torch.func's wrappers: what is_functorch_wrapped_tensor tests)
    if (keys.has(c10::DispatchKey::FuncTorchGradWrapper) ||
        keys.has(c10::DispatchKey::FuncTorchBatched))
      return false;
    if (t._fw_grad(0).defined()) return false;    // (forward mode: one level, 0)
    put(key, type == tensor_type ? -2 : -3);
    put(key, static_cast<int64_t>(t.scalar_type()));
    put(key, t.requires_grad() ? 1 : 0);
    put(key, t.dim());
    for (int64_t s : t.sizes()) put(key, s);
    for (int64_t s : t.strides()) put(key, s);
  }
  return true;
}

std::string &scratch_key() {
  static std::string key;     // (the GIL is held throughout: one caller at a time)
  return key;
}

// remembered_signature(kwargs, views): the signature remembered for this layout, or
// None.  A plain CPython function, not pybind11's: every repeated call asks it, and a
// NumPy caller's (which it declines at the first array) should cost next to nothing.
PyObject *remembered_signature(PyObject *, PyObject *const *args, Py_ssize_t count) {
  if (count != 2 || !PyDict_CheckExact(args[0])) Py_RETURN_NONE;
  std::string &key = scratch_key();
  if (!key_of(args[0], args[1] == Py_True, key, nullptr)) Py_RETURN_NONE;
  auto found = remembered.find(key);
  if (found == remembered.end()) Py_RETURN_NONE;
  return found->second.signature.inc_ref().ptr();
}

PyMethodDef remembered_signature_method = {
    "remembered_signature", reinterpret_cast<PyCFunction>(
        reinterpret_cast<void (*)(void)>(&remembered_signature)),
    METH_FASTCALL, "the call signature remembered for this layout, or None"};

void remember_signature(py::handle kwargs, bool views, py::object signature) {
  std::string key;
  std::vector<py::object> names;
  if (!PyDict_CheckExact(kwargs.ptr()) || !key_of(kwargs.ptr(), views, key, &names))
    return;
  if (remembered.size() >= kept) remembered.clear();
  remembered[key] = Remembered{std::move(signature), std::move(names)};
}

void signature_types(py::object tensor, py::object parameter) {
  // (held for the process's life: the classes outlive every call)
  tensor_type = tensor.release().ptr();
  parameter_type = parameter.release().ptr();
}

size_t signatures_remembered() { return remembered.size(); }

}  // namespace

void define_signature(py::module_ &m) {
  m.add_object("remembered_signature", py::reinterpret_steal<py::object>(
                                           PyCFunction_New(&remembered_signature_method, nullptr)));
  m.def("remember_signature", &remember_signature);
  m.def("signature_types", &signature_types);
  m.def("signatures_remembered", &signatures_remembered);
}

}  // namespace einfuse_node
