#!/bin/sh
# Host emulation of cuda/qmv.cu (no GPU): transforms qmv.cu (scripts/emu/transform.py),
# runs its kernels with one thread per CUDA thread (scripts/emu/emu_cuda.h) and
# compares every mode / orientation / M / dtype with a plain reference.
#   sh scripts/emulate_qmv.sh [quick]      -> "cases N failed 0 refused 0"
set -e
ROOT=$(cd "$(dirname "$0")/.." && pwd)
T=$(mktemp -d)
mkdir -p "$T/cuda"
cp "$ROOT/scripts/emu/common.cuh" "$ROOT/scripts/emu/ops.cuh" "$T/cuda/"
python3 "$ROOT/scripts/emu/transform.py" "${QMV_SRC:-$ROOT/libqq/src/cuda/qmv.cu}" "$T/cuda/qmv.cpp"
ln -s "$ROOT/libqq/src/codec.h" "$ROOT/libqq/src/internal.h" "$T/"
CXX=${CXX:-g++}
FLAGS="-O1 -g -std=c++20 -pthread -I$ROOT/scripts/emu -I$T -I$ROOT/libqq/src -I$ROOT/libqq/include ${EMU_FLAGS:-}"
$CXX $FLAGS -c "$T/cuda/qmv.cpp" -o "$T/qmv.o"
$CXX $FLAGS -c "$ROOT/libqq/src/cpu/quantize.cpp" -o "$T/quantize.o"
$CXX $FLAGS "$ROOT/scripts/emu/emulate_qmv.cpp" "$T/qmv.o" "$T/quantize.o" -o "$T/emulate_qmv"
"$T/emulate_qmv" "$@"
