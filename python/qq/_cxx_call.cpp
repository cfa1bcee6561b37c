// _cxx_call.cpp - part of the extension qq._qq (whose Cython code compiles as C).
//
// The extension calls two C++ functions of torch directly, each through a frame here:
// - THPVariable_Wrap (python/qq/_call.pxi, _wrap_handle). A C++ exception it throws (a
//   c10::Error, std::bad_alloc) must not unwind through C frames - that ends the process
//   (std::terminate) - so this C++ frame turns any exception into a Python RuntimeError and a
//   NULL result; the caller then takes torch's Python path.
// - at::native::is_neg(const at::Tensor&) (python/qq/_dlpack.pxi, _torch_neg): it returns a
//   C++ bool, which C code cannot declare portably, and takes a reference to an at::Tensor,
//   which is one TensorImpl pointer.
#include <Python.h>

#include <exception>
#include <stdexcept>

#define QQ_HIDDEN __attribute__((visibility("hidden")))  // (the module exports PyInit__qq only)

extern "C" QQ_HIDDEN PyObject* qq_call_wrap(PyObject* (*fn)(void*), void* arg) noexcept {
  try {
    return fn(arg);
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  } catch (...) {
    PyErr_SetString(PyExc_RuntimeError, "a C++ exception from torch's THPVariable_Wrap");
  }
  return nullptr;
}

// fn is at::native::is_neg; impl a TensorImpl* (the at::Tensor a torch.Tensor holds). 1 or 0,
// or -1 where it threw (it reads a bit of the tensor's dispatch key set: it does not).
extern "C" QQ_HIDDEN int qq_call_is_neg(void* fn, void* impl) noexcept {
  try {
    return reinterpret_cast<bool (*)(void* const*)>(fn)(&impl) ? 1 : 0;
  } catch (...) {
    return -1;
  }
}

// For tests/test_interop.py (qq._qq._cxx_call_selftest): a function that throws, as
// THPVariable_Wrap might.
extern "C" QQ_HIDDEN PyObject* qq_throwing_for_test(void*) {
  throw std::runtime_error("qq_throwing_for_test");
}
