// What a repeated call on CPU torch tensors asks per call, in C++: its signature
// (below) and its tensors' NumPy views (numpy_views, at the end).
//
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
#include <torch/csrc/utils/tensor_numpy.h>

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

// Whether Python's path decides for ``t``: torch.func's wrappers, as
// is_functorch_wrapped_tensor tests them (grad and vmap wrappers, functionalize's
// functional tensors, whose own storage is not their values), and tensors a Python
// dispatch mode or subclass handles.
bool wrapped(const at::Tensor &t) {
  c10::DispatchKeySet keys = t.key_set();
  return keys.has(c10::DispatchKey::FuncTorchGradWrapper) ||
         keys.has(c10::DispatchKey::FuncTorchBatched) ||
         keys.has(c10::DispatchKey::Functionalize) || keys.has(c10::DispatchKey::Python) ||
         t.unsafeGetTensorImpl()->is_python_dispatch();
}

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
    if (wrapped(t)) return false;
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

// numpy_views(values, names): {name: the NumPy view of values[name]} for the tensors
// ``names`` (a tuple) of the dict ``values``, as runtime/torch_autograd.numpy_views
// makes them (tensor.detach().numpy(): an array sharing the tensor's memory, the
// detached tensor its base); None where one is not a plain strided CPU tensor of its
// own values (a lazily negated or conjugated view, a subclass): Python resolves it.
// (Per tensor about 0.2 us, against 1.4 us for detach() and numpy() from Python.)
PyObject *numpy_views(PyObject *, PyObject *const *args, Py_ssize_t count) {
  if (count != 2 || !PyDict_CheckExact(args[0]) || !PyTuple_CheckExact(args[1]))
    Py_RETURN_NONE;
  PyObject *values = args[0], *names = args[1];
  Py_ssize_t n = PyTuple_GET_SIZE(names);
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject *value = PyDict_GetItemWithError(values, PyTuple_GET_ITEM(names, i));
    if (value == nullptr) {
      if (PyErr_Occurred()) PyErr_Clear();
      Py_RETURN_NONE;
    }
    PyObject *type = reinterpret_cast<PyObject *>(Py_TYPE(value));
    if (tensor_type == nullptr || (type != tensor_type && type != parameter_type))
      Py_RETURN_NONE;
    const at::Tensor &t = THPVariable_Unpack(value);
    if (t.layout() != at::kStrided || t.device().type() != at::kCPU || t.is_neg() ||
        t.is_conj() || wrapped(t))
      Py_RETURN_NONE;
  }
  PyObject *found = PyDict_New();
  if (found == nullptr) return nullptr;
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject *name = PyTuple_GET_ITEM(names, i);
    const at::Tensor &t = THPVariable_Unpack(PyDict_GetItem(values, name));
    PyObject *view = nullptr;
    try {
      // (force: detached first, as the Python path detaches; its other steps -- to
      // the CPU, resolving a lazy negation or conjugation -- were ruled out above)
      view = torch::utils::tensor_to_numpy(t, true);
    } catch (const std::exception &) {
      view = nullptr;
    }
    if (view == nullptr || PyDict_SetItem(found, name, view) != 0) {
      Py_XDECREF(view);
      Py_DECREF(found);
      PyErr_Clear();
      Py_RETURN_NONE;
    }
    Py_DECREF(view);
  }
  return found;
}

PyMethodDef numpy_views_method = {
    "numpy_views", reinterpret_cast<PyCFunction>(
        reinterpret_cast<void (*)(void)>(&numpy_views)),
    METH_FASTCALL, "the NumPy views of the named CPU tensors, or None"};

}  // namespace

void define_signature(py::module_ &m) {
  m.add_object("remembered_signature", py::reinterpret_steal<py::object>(
                                           PyCFunction_New(&remembered_signature_method, nullptr)));
  m.def("remember_signature", &remember_signature);
  m.def("signature_types", &signature_types);
  m.def("signatures_remembered", &signatures_remembered);
  m.add_object("numpy_views", py::reinterpret_steal<py::object>(
                                  PyCFunction_New(&numpy_views_method, nullptr)));
}

}  // namespace einfuse_node
