// cpu/rows.h - row helpers of the CPU backend (cpu/quantize.cpp), shared with
// the CPU matmuls so that they quantize and dequantize with the very same code.
#ifndef QQ_CPU_ROWS_H_
#define QQ_CPU_ROWS_H_

#include <vector>

#include "../internal.h"

namespace qq {
namespace cpu {

// Per-call scratch of n floats: on the stack up to kStack (a row of a few thousand
// elements, what the small calls whose host cost bench_overhead measures need: four heap
// allocations a quantize of [1, 32] were ~5 % of it), else one heap block.
class Scratch {
 public:
  explicit Scratch(size_t n) : p_(n <= kStack ? buf_ : (heap_.resize(n), heap_.data())) {}
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  float* data() { return p_; }

 private:
  static constexpr size_t kStack = 2048;
  float buf_[kStack];
  std::vector<float> heap_;
  float* p_;
};

void load_row(const void* p, DType dt, int64_t n, float* out);
void store_row(const float* in, int64_t n, DType dt, void* p);
float round_to(float v, DType dt);
// The amax of each 32x32 tile of v [R, C] (fp32, row-major; R and C multiples of 32),
// NaN-propagating: tamax [R/32, C/32] - the MXFP8 32x32 scaling's group amax (a row's
// group g of 32 takes tamax[(r / 32) * (C / 32) + g] as quantize_row's gamax).
void tile32_amax(const float* v, int64_t R, int64_t C, float* tamax);
void quantize_row(const float* x, int64_t K, const QSpec& q, float enc, uint8_t* data, uint8_t* sc, float* scf,
                  float* bif, DType sdt, const float* gamax = nullptr);
void dequantize_row(const uint8_t* data, int64_t K, const QSpec& q, const uint8_t* sc, const float* scf,
                    const float* bif, float gdec, float* out);
// Dequantize rows [r0, r0+rows) of batch b of a packed operand into out
// (fp32, K per row, contiguous).
void dequantize_rows(const Mat& data, const Mat& scales, const Mat* biases, bool blocked, const QSpec& q,
                     float gdec, int64_t b, int64_t r0, int64_t rows, int64_t K, float* out);
// The same for columns [c0, c0 + n) of those rows (c0 and n multiples of q.group): out is
// fp32, n per row, contiguous.
void dequantize_block(const Mat& data, const Mat& scales, const Mat* biases, bool blocked, const QSpec& q,
                      float gdec, int64_t b, int64_t r0, int64_t rows, int64_t c0, int64_t n, float* out);

}  // namespace cpu
}  // namespace qq

#endif  // QQ_CPU_ROWS_H_
