// group_ends.h - the rules for the int32 group ends of the MoE operations
// (grouped_qqmm, grouped_qqmm_wgrad), one home for the host checks
// (validate.cpp, check_group_ends) and the device ones (cuda/qqmm.cu,
// cuda/grouped_gemm_sm90.cu). No other includes: the CUTLASS file and CPU-only
// builds both take it.
#ifndef QQ_GROUP_ENDS_H_
#define QQ_GROUP_ENDS_H_

#include <stdint.h>

namespace qq {

// Entry e of the E cumulative ends is bad when it is below its predecessor (0
// for the first), above T, or - the last - not T.
#if defined(__CUDACC__)
__host__ __device__
#endif
inline bool group_end_bad(const int32_t* ends, int64_t e, int64_t E, int64_t T) {
  const int32_t start = e ? ends[e - 1] : 0;
  return ends[e] < start || ends[e] > T || (e == E - 1 && ends[e] != T);
}

// grouped_qqmm_wgrad: each expert's n tokens take this many places of the
// padded token axis (a multiple of 32, the largest block along the tokens:
// blocks never straddle experts, and every expert starts on a 64-byte boundary
// of a bf16 row, as TMA wants).
template <typename I>
#if defined(__CUDACC__)
__host__ __device__
#endif
inline I wgrad_span(I n) { return (n + 31) / 32 * 32; }

}  // namespace qq

#endif  // QQ_GROUP_ENDS_H_
