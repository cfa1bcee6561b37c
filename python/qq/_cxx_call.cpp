// _cxx_call.cpp - part of the extension qq._qq (whose Cython code compiles as C).
//
// The extension calls one C++ function of torch directly: THPVariable_Wrap (python/qq/_call.pxi,
// _wrap_handle). A C++ exception it throws (a c10::Error, std::bad_alloc) must not unwind
// through C frames - that ends the process (std::terminate) - so the call goes through this
// C++ frame, which turns any exception into a Python RuntimeError and a NULL result; the
// caller then takes torch's Python path.
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

// For tests/test_interop.py (qq._qq._cxx_call_selftest): a function that throws, as
// THPVariable_Wrap might.
extern "C" QQ_HIDDEN PyObject* qq_throwing_for_test(void*) {
  throw std::runtime_error("qq_throwing_for_test");
}
