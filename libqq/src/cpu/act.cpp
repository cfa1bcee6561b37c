// cpu/act.cpp - qqSwiglu on the CPU: each row's gate and up halves read as
// float32 (cpu/rows.h), act.h's formula, one rounding to the output dtype.
#include <vector>

#include "../act.h"
#include "rows.h"

namespace qq {
namespace cpu {
namespace {
struct SwigluJob {
  const Mat* x;
  const Mat* out;
};
void swiglu_range(void* ctx, int64_t begin, int64_t end) {
  const SwigluJob& j = *(const SwigluJob*)ctx;
  const Mat &x = *j.x, &o = *j.out;
  const int64_t F = o.cols, es = dtype_size(x.dt);
  std::vector<float> g(F), u(F);
  for (int64_t i = begin; i < end; ++i) {
    const int64_t b = i / x.rows, r = i % x.rows;
    const char* row = (const char*)x.ptr + (x.offset(b) + r * x.ld) * es;
    load_row(row, x.dt, F, g.data());
    load_row(row + F * es, x.dt, F, u.data());
    for (int64_t k = 0; k < F; ++k) g[k] = swiglu_f32(g[k], u[k]);
    store_row(g.data(), F, o.dt, (char*)o.ptr + (o.offset(b) + r * o.ld) * es);
  }
}
}  // namespace

qqStatus_t swiglu(const Mat& x, const Mat& out) {
  SwigluJob j{&x, &out};
  parallel_for(x.batch() * x.rows, out.cols * 8, swiglu_range, &j);
  return QQ_STATUS_SUCCESS;
}

}  // namespace cpu
}  // namespace qq
