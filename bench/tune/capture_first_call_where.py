"""Where does a first qq call invalidate a torch capture (capture_first_call_probe.py's
first_qqmm_shape and first_packed)? One process per case; each case captures the call in
one capture mode (capture_first_call_probe.py's setup and capture_check); the driver's own
error log (CUDA_LOG_FILE=stdout, CUDA 12.9+) names the failing driver call.
    CUDA_LOG_FILE=stdout python3 bench/tune/capture_first_call_where.py
Run in session ay (logs-2026-12-02ay/capture_first_call_where.txt), then with a profile hook
reading the capture status after every Python-visible call, which saw nothing (the qq calls
are compiled Cython) and is gone since. The driver's log named cuMemPoolCreate, refused in
the global and thread-local modes: the default handle was made inside the capture. Fixed in
runtime.cu (the handle made in relaxed mode).
"""
from capture_first_call_probe import capture_check, setup
from capture_gc_probe import each_case

CASES = [f"{c}:{m}" for c in ("first_qqmm_shape", "first_packed", "second_qqmm_shape")
         for m in ("global", "thread_local", "relaxed")]


def run(case):
    name, mode = case.split(":")
    capture_check(case, setup(name), mode)


if __name__ == "__main__":
    each_case(__file__, CASES, run, 120)
