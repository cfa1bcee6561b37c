// emulate_qmv.cpp - runs cuda/qmv.cu's kernels on the host (emu_cuda.h) and
// compares them with a plain reference (cpu/quantize.cpp's dequantize_rows
// and a double-precision dot product). Built and run by scripts/emulate_qmv.sh.
#include <cstring>
#include <ucontext.h>
#include <memory>
#include <random>
#include <string>

#include "emu_cuda.h"
#include "internal.h"
#include "cpu/rows.h"

namespace emu {
thread_local dim3 tIdx, bIdx;
dim3 gDim;
float shfl_slot[1024];
struct Range { const char* p; size_t n; };
std::vector<Range> ranges;
bool readable(const void* p, size_t n) {
  const char* c = (const char*)p;
  for (auto& r : ranges)
    if (c >= r.p && c + n <= r.p + r.n) return true;
  return false;
}
// fibers
constexpr int kMaxThreads = 256;
constexpr size_t kStack = 256 << 10;
ucontext_t sched_ctx, fib_ctx[kMaxThreads];
std::vector<char> stacks[kMaxThreads];
bool finished[kMaxThreads];
int cur = 0;
const std::function<void()>* cur_body;
void sync_point() { swapcontext(&fib_ctx[cur], &sched_ctx); }
void fiber_main() {
  (*cur_body)();
  finished[cur] = true;  // returns to sched_ctx (uc_link)
}
}  // namespace emu

size_t g_blocks = 0;
void emu_launch(dim3 grid, int threads, const std::function<void()>& body) {
  using namespace emu;
  assert(threads <= kMaxThreads);
  gDim = grid;
  cur_body = &body;
  for (unsigned by = 0; by < grid.y; ++by)
    for (unsigned bx = 0; bx < grid.x; ++bx) {
      ++g_blocks;
      bIdx = dim3(bx, by);
      for (int t = 0; t < threads; ++t) {
        if (stacks[t].empty()) stacks[t].resize(kStack);
        getcontext(&fib_ctx[t]);
        fib_ctx[t].uc_stack.ss_sp = stacks[t].data();
        fib_ctx[t].uc_stack.ss_size = kStack;
        fib_ctx[t].uc_link = &sched_ctx;
        makecontext(&fib_ctx[t], fiber_main, 0);
        finished[t] = false;
      }
      for (;;) {  // one round: every fiber to its next sync point (or its end)
        int done = 0;
        for (int t = 0; t < threads; ++t) {
          cur = t;
          tIdx = dim3(t);
          swapcontext(&sched_ctx, &fib_ctx[t]);
          done += finished[t];
        }
        if (done == threads) break;
        if (done) { fprintf(stderr, "sync point missed by %d threads of %d\n", done, threads); abort(); }
      }
    }
}

namespace qq { namespace cuda { qqStatus_t qmv(const MatmulArgs& a, cudaStream_t stream); } }
namespace qq { qqStatus_t set_error(qqStatus_t st, const char*, ...) { return st; } }

using namespace qq;

struct Buf {
  std::vector<uint8_t> v;
  uint8_t* p(size_t off = 0) { return v.data() + off; }
};

std::mt19937_64 rng(1234);
float urand() { return std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng); }

void store(DType dt, void* p, int64_t i, float f) {
  if (dt == DType::F32) ((float*)p)[i] = f;
  else if (dt == DType::BF16) ((uint16_t*)p)[i] = f_to_bf16(f);
  else ((uint16_t*)p)[i] = f_to_fp16(f);
}
float load(DType dt, const void* p, int64_t i) {
  if (dt == DType::F32) return ((const float*)p)[i];
  if (dt == DType::BF16) return bf16_to_f(((const uint16_t*)p)[i]);
  return fp16_to_f(((const uint16_t*)p)[i]);
}
const char* dts(DType d) { return d == DType::F32 ? "f32" : d == DType::BF16 ? "bf16" : "f16"; }

struct Case {
  int mode = QQ_MODE_AFFINE, bits = 4, group = 32, elem = 0;
  bool gs = false;
  DType sdt = DType::F32;  // affine scale / bias dtype
  bool transpose = true;
  int64_t M = 1, N = 64, K = 64;
  DType xdt = DType::F32, odt = DType::F32;
  int xpad = 0;            // extra x row elements (unaligned rows when odd) and start offset
  int batch = 1;           // x batch entries
  bool wbatch = false;     // w has its own batch (else broadcast, stride 0)
  bool bias = false;
  int wpad = 0;            // extra bytes per w row (unaligned rows: the narrow / byte-wise paths)
  int known = 0;           // 1: the known-answer data of test_qmm_known_answer
};

std::string name(const Case& c) {
  char b[256];
  const char* m = c.mode == QQ_MODE_AFFINE ? "affine" : c.mode == QQ_MODE_NVFP4 ? "nvfp4" : c.mode == QQ_MODE_MXFP4 ? "mxfp4" : "mxfp8";
  snprintf(b, sizeof b, "%s b%d g%d e%d gs%d sdt=%s %s M%ld N%ld K%ld x=%s out=%s xpad%d wpad%d batch%d%s%s", m, c.bits, c.group,
           c.elem, (int)c.gs, dts(c.sdt), c.transpose ? "T" : "N", (long)c.M, (long)c.N, (long)c.K, dts(c.xdt),
           dts(c.odt), c.xpad, c.wpad, c.batch, c.wbatch ? " wbatch" : "", c.bias ? " bias" : "");
  return b;
}

Mat mat(void* p, DType dt, int64_t rows, int64_t cols, int64_t ld, int nb, int64_t bshape, int64_t bstride) {
  Mat m;
  m.ptr = p; m.dt = dt; m.rows = rows; m.cols = cols; m.ld = ld; m.device = 0;
  m.nb = nb;
  if (nb) { m.bshape[0] = bshape; m.bstride[0] = bstride; }
  return m;
}

// returns the number of mismatches, -1 when qmv refused
int run(const Case& c, bool verbose = false) {
  MatmulArgs a{};
  a.q.mode = (qqMode_t)c.mode; a.q.bits = c.bits; a.q.group = c.group; a.q.elem = c.elem;
  a.transpose = c.transpose; a.w_packed = true;
  a.M = c.M; a.N = c.N; a.K = c.K;
  const int64_t wr = c.transpose ? c.N : c.K, wcols = c.transpose ? c.K : c.N;  // logical W storage
  const int64_t wbytes = wcols * c.bits / 8, ng = wcols / c.group, wld = wbytes + c.wpad;
  const int nbw = c.wbatch ? c.batch : 1;
  const int nb = c.batch > 1 ? 1 : 0;
  // w
  Buf w; w.v.resize(nbw * wr * wld);
  for (auto& b : w.v) b = (uint8_t)rng();
  // scales / biases
  const bool fp = c.mode != QQ_MODE_AFFINE;
  const DType sdt = fp ? DType::U8 : c.sdt;
  const int es = dtype_size(sdt);
  Buf s, bi; s.v.resize(nbw * wr * ng * es); bi.v.resize(fp ? 0 : nbw * wr * ng * es);
  for (int64_t i = 0; i < nbw * wr * ng; ++i) {
    if (c.mode == QQ_MODE_NVFP4) s.v[i] = (uint8_t)(0x30 + rng() % 0x20);            // E4M3 0.125 .. ~2
    else if (fp) s.v[i] = (uint8_t)(124 + rng() % 6);                                 // 2^-3 .. 2^2
    else { store(sdt, s.p(), i, urand() * 0.1f); store(sdt, bi.p(), i, urand()); }
  }
  if (c.mode == QQ_MODE_MXFP8) {  // no NaN / Inf codes
    for (auto& b : w.v) if (c.elem == ELEM_E4M3 ? (b & 0x7f) == 0x7f : (b & 0x7c) == 0x7c) b &= 0xbb;
  }
  if (c.known) {  // rows 0..15 twice (along W's row), affine 4 bits, scale -1, bias 15
    for (int64_t r = 0; r < wr; ++r)
      for (int64_t j = 0; j < wcols; ++j) {
        const int v = (int)(j % 16), q = 15 - v;
        uint8_t& byte = w.v[r * wld + j / 2];
        byte = (j & 1) ? (uint8_t)((byte & 0x0f) | (q << 4)) : (uint8_t)((byte & 0xf0) | q);
      }
    for (int64_t i = 0; i < wr * ng; ++i) { store(sdt, s.p(), i, -1.0f); store(sdt, bi.p(), i, 15.0f); }
  }
  float gsv = 448.0f * 6.0f * 0.75f;
  Buf gsb; gsb.v.resize(4); memcpy(gsb.p(), &gsv, 4);
  a.gs_w = (c.mode == QQ_MODE_NVFP4 && c.gs) ? (const float*)gsb.p() : nullptr;
  // x: rows with ld = K + xpad, start xpad elements in
  const int xs = dtype_size(c.xdt);
  const int64_t xld = c.K + c.xpad;
  Buf x; x.v.resize((c.batch * c.M * xld + c.xpad) * xs + 64);
  // place x at a 16-byte aligned start + xpad elements
  const size_t xoff = (16 - ((uintptr_t)x.p() % 16)) % 16;
  for (int64_t i = 0; i < c.batch * c.M * xld + c.xpad; ++i) store(c.xdt, x.p(xoff), i, c.known ? 1.0f : urand());
  void* x0 = x.p(xoff + c.xpad * xs);
  Buf bias; bias.v.resize(c.N * 2);
  for (int64_t n = 0; n < c.N; ++n) store(DType::BF16, bias.p(), n, urand() * 5);
  Buf out; out.v.resize(c.batch * c.M * c.N * dtype_size(c.odt));
  memset(out.p(), 0xff, out.v.size());

  a.x = mat(x0, c.xdt, c.M, c.K, xld, nb, c.batch, c.M * xld);
  a.w = mat(w.p(), DType::U8, wr, wbytes, wld, nb, c.batch, c.wbatch ? wr * wld : 0);
  a.w_scales = mat(s.p(), sdt, wr, ng, ng, nb, c.batch, c.wbatch ? wr * ng : 0);
  if (!fp) a.w_biases = mat(bi.p(), sdt, wr, ng, ng, nb, c.batch, c.wbatch ? wr * ng : 0);
  if (c.bias) a.bias = mat(bias.p(), DType::BF16, 1, c.N, c.N, 0, 0, 0);
  a.out = mat(out.p(), c.odt, c.M, c.N, c.N, nb, c.batch, c.M * c.N);

  emu::ranges = {{(const char*)x.p(), x.v.size()}, {(const char*)w.p(), w.v.size()},
                 {(const char*)s.p(), s.v.size()}, {(const char*)bi.p(), bi.v.size()},
                 {(const char*)gsb.p(), gsb.v.size()}, {(const char*)bias.p(), bias.v.size()}};
  const qqStatus_t st = cuda::qmv(a, nullptr);
  if (st == QQ_STATUS_NOT_SUPPORTED) return -1;
  if (st != QQ_STATUS_SUCCESS) { printf("status %d\n", st); return 1; }

  // reference
  int bad = 0;
  const float gdec = a.gs_w ? nvfp4_dec(gsv) : 1.0f;
  std::vector<float> W(wr * wcols);
  for (int b = 0; b < c.batch; ++b) {
    cpu::dequantize_rows(a.w, a.w_scales, &a.w_biases, false, a.q, gdec, b, 0, wr, wcols, W.data());
    for (int64_t m = 0; m < c.M; ++m)
      for (int64_t n = 0; n < c.N; ++n) {
        double acc = 0, mag = 0;
        for (int64_t k = 0; k < c.K; ++k) {
          const double xv = load(c.xdt, x0, b * c.M * xld + m * xld + k);
          const double wv = c.transpose ? W[n * wcols + k] : W[k * wcols + n];
          acc += xv * wv;
          mag += fabs(xv * wv);
        }
        if (c.bias) { const float bv = load(DType::BF16, bias.p(), n); acc += bv; mag += fabs(bv); }
        const float got = load(c.odt, out.p(), (b * c.M + m) * c.N + n);
        const double tol = 1e-5 * mag + 1e-30 + (c.odt == DType::F32 ? 0 : fabs(acc) * (c.odt == DType::BF16 ? 1.0 / 128 : 1.0 / 1024));
        if (!(fabs(got - acc) <= tol) || (c.known && got != acc)) {
          if (bad < 4 || verbose) printf("  b%d m%ld n%ld got %g want %g\n", b, (long)m, (long)n, got, acc);
          ++bad;
        }
      }
  }
  return bad;
}

int main(int argc, char** argv) {
  const bool quick = argc > 1 && !strcmp(argv[1], "quick");
  int cases = 0, failed = 0, refused = 0;
  auto go = [&](const Case& c) {
    const int r = run(c);
    ++cases;
    if (r < 0) { ++refused; printf("REFUSED %s\n", name(c).c_str()); }
    else if (r > 0) { ++failed; printf("FAIL (%d) %s\n", r, name(c).c_str()); }
  };
  // known answer (test_qmm_known_answer)
  { Case c; c.known = 1; c.N = 8; c.K = 32; c.M = 3; go(c); }
  { Case c; c.known = 1; c.transpose = false; c.N = 32; c.K = 32; c.M = 2; go(c); }
  struct FpM { int mode, bits, group, elem; bool gs; };
  const FpM fps[] = {{QQ_MODE_NVFP4, 4, 16, 0, false}, {QQ_MODE_NVFP4, 4, 16, 0, true}, {QQ_MODE_MXFP4, 4, 32, 0, false},
                     {QQ_MODE_MXFP8, 8, 32, ELEM_E4M3, false}, {QQ_MODE_MXFP8, 8, 32, ELEM_E5M2, false}};
  const int Ms[] = {1, 2, 3, 4, 5, 8, 9, 16};
  const DType xdts[] = {DType::F32, DType::BF16, DType::F16};
  for (bool tr : {true, false}) {
    for (const FpM& f : fps)
      for (int M : Ms)
        for (DType xdt : xdts) {
          if (quick && xdt != DType::BF16 && M != 3) continue;
          Case c; c.mode = f.mode; c.bits = f.bits; c.group = f.group; c.elem = f.elem; c.gs = f.gs;
          c.transpose = tr; c.M = M; c.xdt = xdt;
          c.N = tr ? 200 : 224; c.K = 640;
          go(c);
          if (M == 3) {
            c.xpad = 1; c.batch = 2; c.bias = true; c.odt = DType::BF16; go(c);
            c.wbatch = true; go(c);
            c.wpad = 1; go(c);
          }
          if (M == 5) { c.K = f.group; c.N = tr ? 37 : 2 * f.group; go(c); }
        }
    for (int bits : {2, 3, 4, 5, 6, 8})
      for (int group : {32, 64, 128})
        for (DType sdt : xdts)
          for (int M : Ms) {
            if (quick && M != 3 && M != 16) continue;
            Case c; c.bits = bits; c.group = group; c.sdt = sdt; c.transpose = tr; c.M = M;
            c.xdt = xdts[(M + bits) % 3];
            c.N = tr ? 200 : (200 + group - 1) / group * group; c.K = 640 / group * group;
            go(c);
            if (M == 3 || M == 16) {
              Case d = c; d.xpad = 1; d.batch = 2; d.bias = true; d.odt = DType::F16; go(d);
              d.wbatch = true; go(d);
              d.wpad = 1; go(d);
              d.wpad = 16; d.xpad = 0; go(d);  // aligned rows of a wider w: the wide kernels with ld != row bytes
            }
            if (M == 16 && tr) { c.K = group; c.N = 37; go(c); }
          }
  }
  printf("cases %d failed %d refused %d (blocks %zu)\n", cases, failed, refused, g_blocks);
  return failed != 0;
}
