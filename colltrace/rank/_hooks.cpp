// colltrace's c10d hooks registered from C++ (torch >= 2.14), and its readers of a group's collective
// counter and of a plain tensor (every torch), built against the installed torch by `colltrace
// build-hooks` (colltrace/rank/hookbuild.py).
//
// Why: c10d calls a hook registered from Python by taking the GIL and building a PreHookArgs
// object on every collective (~6,000 instructions), even where colltrace's wrapper is already
// recording the call and the hook returns at once. Registered here, the hook first reads
// _fastpath's thread-local depth without the GIL (~650 instructions in all); only a collective
// no wrapper records (DDP's reducer, pg.allreduce, compiled code) takes the GIL and is handed to
// the same gate (_fastpath.Gate) the Python route registers, with the same argument object.
//
// The counter: every traced collective reads its group's (the number it records), and through
// pybind that costs ~1,300 instructions (casting the argument, releasing and re-taking the GIL,
// torch's warning handler): a fifth of a traced call. Read here it is a virtual call. The GIL stays
// held: the counter's lock is only ever held briefly by threads that never wait for the GIL.
// Likewise the tensor: its shape and dtype through torch's Python getters cost ~800 (a torch.Size
// made per call, torch's error and warning guards), to learn that it is the last call's again.
// Both readers take only the classes they know and leave every other object to Python.
//
// What a hook here must never do: raise into c10d (everything is caught and said once through
// on_error), or touch Python once the interpreter is going away (the held objects are leaked then).
#include <torch/extension.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <atomic>
#include <memory>
#if defined(__GLIBCXX__)
#include <cxxabi.h>
#endif

namespace py = pybind11;

namespace {

// c10d's ProcessGroup class as pybind registered it: the one class whose counter is read here
PyTypeObject* pg_type = nullptr;
const py::detail::type_info* pg_info = nullptr;

// 1: *out is the group's counter, as ProcessGroup._get_sequence_number_for_group says it; 0: this
// object is not read here (another class, a group that raised): the caller asks Python. No error set.
int read_seq(PyObject* obj, long long* out) noexcept {
  if (pg_type == nullptr || Py_TYPE(obj) != pg_type) {
    return 0;
  }
  try {
    auto* inst = reinterpret_cast<py::detail::instance*>(obj);
    auto* pg = static_cast<c10d::ProcessGroup*>(inst->get_value_and_holder(pg_info, false).value_ptr());
    if (pg == nullptr) {
      return 0;
    }
    *out = static_cast<long long>(pg->getSequenceNumberForGroup());
    return 1;
  } catch (...) {
    return 0;
  }
}

// A plain torch.Tensor (not a subclass, which may answer .shape its own way) as _fastpath keys it
// (TKEY_LEN there): dims, dtype, device type, up to 8 sizes. 1: key set; 0: not read here (a
// subclass, symbolic or nested sizes, more dims): the caller asks Python. No error set.
constexpr int kTensorKey = 11;
int read_tensor(PyObject* obj, long long* key) noexcept {
  if (THPVariableClass == nullptr || Py_TYPE(obj) != reinterpret_cast<PyTypeObject*>(THPVariableClass)) {
    return 0;
  }
  try {
    const at::Tensor& t = THPVariable_Unpack(obj);
    if (!t.defined() || t.is_nested() || t.unsafeGetTensorImpl()->has_symbolic_sizes_strides()) {
      return 0;
    }
    auto sizes = t.sizes();
    if (sizes.size() > kTensorKey - 3) {
      return 0;
    }
    std::fill(key, key + kTensorKey, 0);
    key[0] = static_cast<long long>(sizes.size());
    key[1] = static_cast<long long>(t.scalar_type());
    key[2] = static_cast<long long>(t.device().type());
    for (size_t i = 0; i < sizes.size(); i++) {
      key[3 + i] = static_cast<long long>(sizes[i]);
    }
    return 1;
  } catch (...) {
    return 0;
  }
}

#ifdef COLLTRACE_C10D_HOOKS
using DepthFn = long (*)(void);
DepthFn depth_now = nullptr;   // _fastpath's, from its capsule: >0 while a wrapper records on this thread

bool python_gone() {
#if PY_VERSION_HEX >= 0x030D0000
  return !Py_IsInitialized() || Py_IsFinalizing();
#else
  return !Py_IsInitialized() || _Py_IsFinalizing();
#endif
}

// The Python objects one hook holds. c10d destroys hooks from wherever a group goes (unregister,
// destroy_process_group, a group freed at exit): the references are dropped under the GIL, or
// leaked once Python is finalizing, when taking the GIL could hang or crash.
struct Held {
  PyObject* gate;
  PyObject* on_error;
  std::atomic<bool> reported{false};

  Held(PyObject* g, PyObject* e) : gate(g), on_error(e) {
    Py_INCREF(gate);
    Py_INCREF(on_error);
  }
  Held(const Held&) = delete;
  Held& operator=(const Held&) = delete;
  ~Held() {
    if (python_gone()) {
      return;
    }
    PyGILState_STATE st = PyGILState_Ensure();
    Py_DECREF(gate);
    Py_DECREF(on_error);
    PyGILState_Release(st);
  }
};

// With the GIL held and a Python error set: hand it to on_error the first time, clear it always.
void report(Held& h) {
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  PyErr_NormalizeException(&type, &value, &tb);
  if (value != nullptr && !h.reported.exchange(true)) {
    PyObject* r = PyObject_CallOneArg(h.on_error, value);
    if (r == nullptr) {
      PyErr_Clear();
    }
    Py_XDECREF(r);
  }
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(tb);
}

// Not noexcept: CPython ends a thread that waits for the GIL while the interpreter finalizes by
// unwinding it (pthread_exit), and that unwind must pass through, not std::terminate here.
template <typename Args>
void fire(Held& h, const Args& args) {
  if (depth_now() != 0 || python_gone()) {
    return;   // a part of a wrapper's call (the common case): no GIL, no Python
  }
  PyGILState_STATE st = PyGILState_Ensure();
  try {
    // a copy, as c10d's Python binding gives its hooks: the gate may keep it past this call
    py::object a = py::cast(args, py::return_value_policy::copy);
    PyObject* r = PyObject_CallOneArg(h.gate, a.ptr());
    if (r == nullptr) {
      report(h);
    }
    Py_XDECREF(r);
#if defined(__GLIBCXX__)
  } catch (abi::__forced_unwind&) {
    throw;   // the thread is being ended (see above): let it go
#endif
  } catch (py::error_already_set& e) {
    e.restore();
    report(h);
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    report(h);
  } catch (...) {
    PyErr_SetString(PyExc_RuntimeError, "an unknown C++ exception in colltrace's c10d hook");
    report(h);
  }
  PyGILState_Release(st);
}

void attach(const c10::intrusive_ptr<c10d::ProcessGroup>& pg, int64_t hook_id, py::object pre, py::object post,
            py::object on_error) {
  if (depth_now == nullptr) {
    auto fn = reinterpret_cast<DepthFn>(PyCapsule_Import("colltrace.rank._fastpath._depth", 0));
    if (fn == nullptr) {
      throw py::error_already_set();
    }
    depth_now = fn;
  }
  auto held_pre = std::make_shared<Held>(pre.ptr(), on_error.ptr());
  auto held_post = std::make_shared<Held>(post.ptr(), on_error.ptr());
  pg->registerPreHook(hook_id, [held_pre](const c10d::PreHookArgs& a) { fire(*held_pre, a); });
  pg->registerPostHook(hook_id, [held_post](const c10d::PostHookArgs& a) { fire(*held_post, a); });
}

#endif  // COLLTRACE_C10D_HOOKS

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "colltrace's c10d hooks registered from C++ (see colltrace/rank/hookbuild.py)";
#ifdef COLLTRACE_C10D_HOOKS
  m.def("attach", &attach, "Register pre(args)/post(args) as group's hooks under hook_id, behind the depth test",
        py::arg("group"), py::arg("hook_id"), py::arg("pre"), py::arg("post"), py::arg("on_error"));
#endif
  if (const auto* info = py::detail::get_type_info(typeid(c10d::ProcessGroup))) {
    pg_info = info;
    pg_type = info->type;
  }
  // _fastpath reads the counter through this (fastpath.use_seq_reader)
  m.attr("seq_reader") = py::capsule(reinterpret_cast<void*>(&read_seq), "colltrace_hooks.seq_reader");
  m.attr("tensor_reader") = py::capsule(reinterpret_cast<void*>(&read_tensor), "colltrace_hooks.tensor_reader");
  m.def("read_tensor", [](py::handle tensor) -> py::object {
    long long key[kTensorKey];
    if (read_tensor(tensor.ptr(), key) != 1) {
      return py::none();
    }
    py::list out;
    for (long long v : key) {
      out.append(v);
    }
    return std::move(out);
  }, "A plain tensor's key as _fastpath compares it, or None where it is not read here");
  m.def("read_seq", [](py::handle group) -> py::object {
    long long n;
    return read_seq(group.ptr(), &n) == 1 ? py::object(py::int_(n)) : py::object(py::none());
  }, "The group's counter as read from C++, or None where it is not read here (checked against Python's)");
}
