// colltrace's c10d hooks registered from C++ (torch >= 2.14), built against the installed torch by
// `colltrace build-hooks` (colltrace/rank/hookbuild.py).
//
// Why: c10d calls a hook registered from Python by taking the GIL and building a PreHookArgs
// object on every collective (~6,000 instructions), even where colltrace's wrapper is already
// recording the call and the hook returns at once. Registered here, the hook first reads
// _fastpath's thread-local depth without the GIL (~650 instructions in all); only a collective
// no wrapper records (DDP's reducer, pg.allreduce, compiled code) takes the GIL and is handed to
// the same gate (_fastpath.Gate) the Python route registers, with the same argument object.
//
// What a hook here must never do: raise into c10d (everything is caught and said once through
// on_error), or touch Python once the interpreter is going away (the held objects are leaked then).
#include <torch/extension.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <atomic>
#include <memory>
#if defined(__GLIBCXX__)
#include <cxxabi.h>
#endif

namespace py = pybind11;

namespace {

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

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "colltrace's c10d hooks registered from C++ (see colltrace/rank/hookbuild.py)";
  m.def("attach", &attach, "Register pre(args)/post(args) as group's hooks under hook_id, behind the depth test",
        py::arg("group"), py::arg("hook_id"), py::arg("pre"), py::arg("post"), py::arg("on_error"));
}
