# cython: language_level=3, embedsignature=True
"""qq._qq - the Cython layer between Python arrays and libqq's C ABI (qq/qq.h).

Nothing is computed here. Every public function
  1. maps its string parameters to the C enums (qqQuantParamsInit fills the defaults),
  2. opens a DLTensor *view* of every array argument (the DLPack section below),
  3. allocates the outputs in the caller's framework (the _Call section),
  4. calls libqq with the GIL released (kept for small calls), and maps a failing
     qqStatus_t to an exception carrying qqGetLastErrorMessage(),
  5. releases every view exactly once, whatever happened.
The small CPU calls of quantize, quantized_matmul and qqmm do 2-4 without the per-call
objects (_fast.pxi), the general path standing behind them.

One extension module, one file per job (Cython include files, so that calls between them
stay plain C calls): _errors.pxi (status -> exception, library info), _params.pxi (string
parameters -> C enums, validated once and cached), _dlpack.pxi (DLPack import: _View;
export: _DeviceBuffer), _streams.pxi, _call.pxi (per-call state: framework, device,
stream, views, results), _types.pxi (QuantizedArray, PreparedWeight), _fast.pxi (the
small CPU calls), the thin op wrappers in _ops_quantize.pxi, _ops_matmul.pxi and
_ops_layout.pxi, and _jax_shapes.pxi (parameters and result shapes for the JAX custom
calls of qq/_jax_ffi.py). The Python API is specified in docs/api.md.
"""

from cpython.exc cimport PyErr_Clear
from cpython.long cimport PyLong_FromLongLong
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from cpython.object cimport PyObject
from cpython.ref cimport Py_DECREF, Py_INCREF
from cpython.tuple cimport PyTuple_New, PyTuple_SET_ITEM
from cpython.pycapsule cimport (PyCapsule_GetName, PyCapsule_GetPointer, PyCapsule_IsValid,
                                PyCapsule_New, PyCapsule_SetName)
from libc.stdint cimport int64_t, intptr_t, uint64_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy, memset

from ._dlpack cimport (DLDataType, DLDeviceType, DLManagedTensor, DLManagedTensorVersioned, DLTensor,
                       DLPackExchangeAPI,
                       DLPACK_FLAG_BITMASK_READ_ONLY, QQ_DLPACK_MAJOR, QQ_DLPACK_MINOR,
                       kDLBfloat, kDLBool, kDLComplex, kDLCPU, kDLCUDA, kDLCUDAHost,
                       kDLCUDAManaged, kDLFloat, kDLFloat8_e3m4, kDLFloat8_e4m3,
                       kDLFloat8_e4m3b11fnuz, kDLFloat8_e4m3fn, kDLFloat8_e4m3fnuz,
                       kDLFloat8_e5m2, kDLFloat8_e5m2fnuz, kDLFloat8_e8m0fnu, kDLInt,
                       kDLFloat4_e2m1fn, kDLUInt)
from ._cqq cimport *


cdef extern from "structmember.h":
    ctypedef struct PyMemberDef:
        int type
        Py_ssize_t offset
    enum: T_OBJECT_EX


cdef extern from "Python.h":
    ctypedef struct PyThreadState
    PyThreadState* PyEval_SaveThread() nogil
    void PyEval_RestoreThread(PyThreadState*) nogil
    ctypedef struct PyMemberDescrObject:      # a __slots__ entry's descriptor
        PyMemberDef* d_member
    object PyType_GenericAlloc(type t, Py_ssize_t nitems)

cimport cython

import math
import numbers
import operator
import sys

import numpy as np

cimport numpy as cnp

cnp.import_array()

include "_errors.pxi"
include "_params.pxi"
include "_dlpack.pxi"
include "_streams.pxi"
include "_call.pxi"
include "_types.pxi"
include "_fast.pxi"
include "_ops_quantize.pxi"
include "_ops_matmul.pxi"
include "_ops_layout.pxi"
include "_jax_shapes.pxi"
