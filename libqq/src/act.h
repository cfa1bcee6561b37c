// act.h - the SwiGLU formula (qqSwiglu), one home for the CPU and the GPU.
//
// silu(g) * u = g / (1 + exp(-g)) * u in float32, rounded to the output dtype
// by the caller (once). Unlike codec.h's rules this one calls exp: the CPU's
// expf and CUDA's (within 2 ulp) differ, so the two backends agree to a few
// ulp of float32 (5 seen on an H100) and to one ulp of a 16-bit dtype, not bit
// for bit (docs/api.md, swiglu). -Inf in g gives -Inf / Inf = NaN, as torch's silu.
#ifndef QQ_ACT_H_
#define QQ_ACT_H_

#include <math.h>

#include "codec.h"  // QQ_HD

namespace qq {

QQ_HD float swiglu_f32(float g, float u) { return g / (1.0f + expf(-g)) * u; }

}  // namespace qq

#endif  // QQ_ACT_H_
