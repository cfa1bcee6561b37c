# qmv.cu -> host C++ for the emulator: CUDA headers out, emu_cuda.h in, the
# inline PTX load and the <<<>>> launches replaced.
import re, sys
src = open(sys.argv[1]).read()
src = src.replace('#include <cuda_fp16.h>', '#include "emu_cuda.h"').replace('#include <cuda_runtime.h>', '')
src, n = re.subn(r'asm volatile\(.*?"l"\(p\)\);', 'r = emu_ld_stream(p);', src, flags=re.S)
assert n == 1, n
src, n = re.subn(r'(qmv_\w_kernel<[^;]*?>)<<<grid, kThreads, 0, st>>>\(a, L\);',
                 r'emu_launch(grid, kThreads, [&] { \1(a, L); });', src)
assert n == 2, n
open(sys.argv[2], 'w').write(src)
