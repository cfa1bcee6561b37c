// cuda/qmmp.cu - weight-only matmul for decode (M <= 64 rows of bf16 x) on
// nvfp4 / mxfp4 / mxfp8 / affine 4- and 8-bit weights in the decode layout
// (decode_layout.h), one weight or one expert per batch entry (gather_qmm), and
// the conversion of packed weights into that layout.
//
// Why a third small-M kernel: qmma.cu reads the packed (MLX) layout with
// per-lane loads and reaches ~0.6 of copy bandwidth at best; its lanes spend
// their issue slots on addressing, byte permutes of x and scale decoding
// (bench/results/qmm-decode-h100-notes.md). Here the weights arrive in the
// order the mma fragments consume them, and a whole CTA stage (64 rows x 256
// k: 9216 contiguous bytes, plus the stage's 256 k of each row of x) is one
// bulk copy into a shared-memory ring (cp.async.bulk completing on an
// mbarrier, issued by one producer lane). The consumer warps only do shared
// loads, the decode (fp4: two logic ops and one integer multiply per bf16
// pair; fp8: vec.cuh's placement), one packed bf16 multiply by the scale, and
// mma.sync. On an H100 a 16384^2 nvfp4 weight at M = 1 takes 55 us in a CUDA
// graph (0.92 of copy bandwidth; the packed layout's qmma 77 us): the
// prototype (bench/tune/qmmp_proto.cu) had the loads alone within 3 % of the
// full kernel (bench/results/qmm-decode-h100-notes.md).
//
// Exactness: as in qmma.cu, a decoded weight e * s * 2^-9 is exact in bf16,
// each product with x exact in fp32; only the order of the fp32 sums differs
// from dequantize + matmul. The 2^9 and nvfp4's global factor multiply each
// sum once at the end. Affine weights go in as exact codes and their scale and
// bias are applied per fragment block to fp32 sums (s * sum x c + b * sum x, as
// qmma.cu); a tenth warp makes the sums of x once per CTA stage (an mma with
// ones for A in every consumer warp made 16384^2 at M = 16 take 92 us against
// 71), and a result that comes out non-finite is redone weight by weight.
//
// Split K: where the 64-row tiles alone leave SMs idle, the 2 CTAs of a
// thread-block cluster share a tile's K; rank 0 adds their partial sums from
// distributed shared memory in rank order. No workspace, no atomics: the same bits on
// every run, and M does not change the order of any row's sums.
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cmath>

#include "../act.h"
#include "../codec.h"
#include "../decode_layout.h"
#include "../internal.h"
#include "common.cuh"
#include "ops.cuh"
#include "vec.cuh"

namespace cg = cooperative_groups;

namespace qq {
namespace cuda {
namespace {

// 8 consumer warps per RS (row split: RS warps share a (row block, fragment-block parity)
// and take 1 / RS of x's row tiles each), 1 producer warp, and for affine 1 warp that sums
// x per fragment block
constexpr int kConsumers = 8;
// NT: 64-row tiles a CTA (2: see qmmp_body's NT), each with its own kConsumers * RS warps
constexpr int threads_of(int fm, int rs, int nt = 1) {
  return 32 * (kConsumers * rs * nt + 1 + (dec_affine(fm) ? 1 : 0));
}

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }
// Shared loads at 32-bit shared addresses, for the consumer loop's operands (qmmp_body): its
// addresses are per-thread offsets computed once (opaque) plus the stage's address; written as
// C++ pointer arithmetic, nvcc re-derived them from threadIdx.x and the cluster's shared
// window in every stage. volatile: they stay after the stage's barrier wait.
__device__ __forceinline__ uint4 lds128(uint32_t a) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a));
  return v;
}
__device__ __forceinline__ uint2 lds64(uint32_t a) {
  uint2 v;
  asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "r"(a));
  return v;
}
__device__ __forceinline__ uint32_t lds16(uint32_t a) {
  uint16_t v;
  asm volatile("ld.shared.u16 %0, [%1];" : "=h"(v) : "r"(a));
  return v;
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ void mbar_init(uint32_t a, int n) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(a), "r"(n));
}
__device__ __forceinline__ void mbar_expect(uint32_t a, uint32_t tx) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(a), "r"(tx) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t a) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(a) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t a, uint32_t parity) {
  uint32_t done;
  do {
    asm volatile(
        "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
        : "=r"(done)
        : "r"(a), "r"(parity)
        : "memory");
  } while (!done);
}
// Bulk copy global -> shared completing on mbarrier `bar`; the weights are read
// once, so they go with an evict-first L2 policy (measured 3-10 % faster).
__device__ __forceinline__ void bulk_g2s(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
               "l"(src), "r"(bytes), "r"(bar)
               : "memory");
}
__device__ __forceinline__ void bulk_g2s_evict_first(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar,
                                                     uint64_t pol) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::"r"(
          dst),
      "l"(src), "r"(bytes), "r"(bar), "l"(pol)
      : "memory");
}
#endif

// ---- wgmma (sm_90a) for 17..64 rows of x (the WG configurations) ----
// Below 17 rows each consumer warp multiplies its decoded 16 x 16 weight fragment by x's
// fragments with mma.sync, loading x from shared memory per row tile (at 64 rows, 8 KB of
// loads and 32 mma per fragment block and warp). With wgmma the 4 warps of a fragment-block
// parity (a warpgroup: row blocks 0..3, the same k) hand their decoded fragments to one
// m64n32k16 or m64n64k16 (A from registers: the same fragment layout as mma.sync's A), and
// the tensor cores read x from shared memory, where x_stage_kernel put it in wgmma's
// core-matrix order (x_stage_wg). The bits equal mma.sync's (test_decode's every-M test). At
// 64 rows it gains 1-12 % with two warpgroups a parity (n32), and up to 24 % more with one
// (n64) where a CTA has 16 stages or more (dispatch); the x loads were not what held 17..64
// rows back: the epilogue was (below).
// Descriptor of a K-major B without swizzle (bits 0-13: address >> 4; 16-29: the stride
// between the two core matrices along K (LBO) >> 4; 32-45: between 8-row groups (SBO) >> 4).
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// The consumers build the low word (address and LBO) once, wg_desc_lo, and add a stage's,
// fragment block's and k-step's byte offsets >> 4 to it: all are multiples of 16 and the
// window is below 256 KB, so the 14-bit address field never carries into the LBO. (Built
// per wgmma from the address, it was 6-7 SASS instructions each, ~1/6 of the two-tile
// form's main loop at 64 rows; qmm-decode-h100-notes.md, session bd.)
__device__ __forceinline__ uint32_t wg_desc_lo(uint32_t addr, uint32_t lbo) {
  return ((addr & 0x3ffffu) >> 4) | (lbo >> 4) << 16;
}
__device__ __forceinline__ uint64_t wg_desc(uint32_t lo, uint32_t sbo) { return (uint64_t)lo | (uint64_t)(sbo >> 4) << 32; }
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wg_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }
// d (m64 x n32: this warp's 16 rows, mma.sync's C layout per n8 tile) += a * B: a warpgroup's
// 32 rows of x, at 17..32 rows, and half of them past 32 where two warpgroups share a parity
// (dispatch).
__device__ __forceinline__ void wg_mma(float (&d)[4][4], uint4 a, uint64_t desc) {
  asm volatile(
      "{ .reg .pred p; setp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, "
      "%12, %13, %14, %15}, {%16, %17, %18, %19}, %20, p, 1, 1, 0; }"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]),
        "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]),
        "+f"(d[3][2]), "+f"(d[3][3])
      : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "l"(desc), "r"(1));
}
// The same for n64: one warpgroup a parity takes all 64 rows of x past 32 rows, so that each
// fragment block is decoded once (dispatch). x's 8-row groups lie SBO apart whatever their
// number, so the descriptor is the n32 one's.
__device__ __forceinline__ void wg_mma(float (&d)[8][4], uint4 a, uint64_t desc) {
  asm volatile(
      "{ .reg .pred p; setp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, "
      "%12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "{%32, %33, %34, %35}, %36, p, 1, 1, 0; }"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]), "+f"(d[1][2]),
        "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), "+f"(d[3][0]), "+f"(d[3][1]),
        "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]),
        "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]),
        "+f"(d[7][0]), "+f"(d[7][1]), "+f"(d[7][2]), "+f"(d[7][3])
      : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "l"(desc), "r"(1));
}
// Keeps the compiler from moving reads or writes of an accumulator across a wgmma wait.
template <int N8>
__device__ __forceinline__ void wg_hold(float (&d)[N8][4]) {
#pragma unroll
  for (int t = 0; t < N8; ++t)
#pragma unroll
    for (int i = 0; i < 4; ++i) asm volatile("" : "+f"(d[t][i])::"memory");
}
#endif

struct QP {
  const uint8_t* w;
  const __nv_bfloat16* x;
  int64_t xld;  // elements between rows of x
  // staged x (see decode_matmul's `stage`): x rearranged by x_stage_kernel, stage c's M
  // rows in shared memory's row pitch (then affine's sums) at xt + c * x_stage_bytes, so
  // that a stage's x is one bulk copy (else one copy per row and stage); grouped gathers:
  // work item z's rows in slots (gx_slot_bytes)
  const uint8_t* xt;
  // gather (gidx.ptr set): batch entry blockIdx.z multiplies x's entry (xb's batch offset)
  // by expert gidx[entry] of E layouts of wper bytes; out entry b at b * Mo * N.
  // Grouped by expert (plan.ntiles set): blockIdx.z is work item z of the plan (ops.cuh,
  // GPlan), up to M rows of one expert from the entries naming it (Mo rows each); z past
  // the plan's count exits.
  Mat xb, gidx;
  GPlan plan;
  int64_t wper;
  int E;
  int M, N, K, B;
  int zest;  // the z slices expected to have work (B; grouped: the plan's likely item count)
  // float16 x (dense calls): staged as 2 Mo bf16 rows, x's high parts (rows 0 .. Mo - 1) and
  // their exact remainders (Mo .. 2 Mo - 1); output row m adds the two rows' sums. Mo = M for
  // bf16 x.
  int Mo;
  bool x16;
  int cps;      // stages per CTA of a cluster (the last ranks may get fewer, even none)
  const float* gs;
  Mat bias, out;
  // a gated layout (qqDecodeGatedMatmul): F = N / 2, else 0; swiglu: out [Mo, F] (row
  // stride F) holds SwiGLU of each gate / up pair of sums, which the same CTA makes
  int gated;
  bool swiglu;
  uint32_t mul0, mul1;  // 65 << 6, 65 << 2: kernel parameters so that ptxas keeps the multiplies (IMAD)
};

// The layout's geometry per format (decode_layout.h): bytes per fragment
// block, FBs per row block in a 256-k chunk, bytes per chunk; x's row pitch in
// shared memory pads each row so that the 8 lanes of a shared-load phase hit
// distinct banks (4-bit: 32-byte x reads per lane, +16; 8-bit: 16-byte, +64).
// The bytes after each row of x in a stage (its pitch KC * 512 + XPAD): 64 for the 8-bit codes.
constexpr int dec_xpad(int fm) { return dec_bits8(fm) ? 64 : 16; }
template <int FM> struct Geo {
  static constexpr int FB = dec_fb_bytes(FM), FBS = dec_fbs(FM), STAGE = dec_stage(FM), XPAD = dec_xpad(FM);
};

__device__ __forceinline__ float bf_lo(uint32_t v) { return __uint_as_float(v << 16); }
__device__ __forceinline__ float bf_hi(uint32_t v) { return __uint_as_float(v & 0xffff0000u); }

// Affine: acc += s * 2^7 * tmp + b * xs for one fragment block, tmp holding its sums
// of x * c * 2^-7 (acc's layout) and xs[t] the FB's sums of x rows 8t + 2q and
// 8t + 2q + 1; sb: the FB's (s_g | s_g+8 << 16, b_g | b_g+8 << 16).
template <int MT>
__device__ __forceinline__ void affine_apply(float (&acc)[MT][4], const float (&tmp)[MT][4], const float2 (&xs)[MT],
                                             uint2 sb) {
  const float s0 = bf_lo(sb.x) * 128.0f, s1 = bf_hi(sb.x) * 128.0f, b0 = bf_lo(sb.y), b1 = bf_hi(sb.y);
#pragma unroll
  for (int t = 0; t < MT; ++t)
#pragma unroll
    for (int i = 0; i < 4; ++i)
      acc[t][i] = fmaf(i < 2 ? b0 : b1, i & 1 ? xs[t].y : xs[t].x, fmaf(i < 2 ? s0 : s1, tmp[t][i], acc[t][i]));
}

// Affine: the sum of x over one fragment block's k for one row (N uint4 of bf16), in one
// fixed order: the x-sum warp and x_stage_kernel give the same bits, so every M does.
template <int N>
__device__ __forceinline__ float fb_xsum(const uint4* xv) {
  float a[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
  for (int u = 0; u < N; ++u) {
    const uint4 v = xv[u];
    a[0] += bf_lo(v.x) + bf_hi(v.x);
    a[1] += bf_lo(v.y) + bf_hi(v.y);
    a[2] += bf_lo(v.z) + bf_hi(v.z);
    a[3] += bf_lo(v.w) + bf_hi(v.w);
  }
  return (a[0] + a[1]) + (a[2] + a[3]);
}

// Affine: one result weight by weight from the layout, sum_k x_k * fma(c_k, s, b) in
// fp32 (as the CPU backend), for a result that came out non-finite. The factoring
// differs there (an Inf in x meets a code 0 as Inf * 0 = NaN where the weight is b; an
// Inf scale or bias; fp32 overflow), so such results are redone exactly; rare, slow.
template <int FM>
__device__ __noinline__ float affine_exact(const uint8_t* w, const __nv_bfloat16* x, bool x16, int K, int n) {
  float acc = 0.0f;
  for (int k = 0; k < K; ++k) {
    const float xk = x16 ? __half2float(reinterpret_cast<const __half*>(x)[k]) : __bfloat162float(x[k]);
    const DecPos d = decode_pos(FM, n, k, K);
    const uint32_t c = (w[d.byte] >> d.shift) & (dec_bits8(FM) ? 255u : 15u);
    const float s = bf16_to_f((uint16_t)(w[d.sbyte] | w[d.sbyte + 1] << 8));
    const float b = bf16_to_f((uint16_t)(w[d.sbyte + 4] | w[d.sbyte + 5] << 8));
    acc = fmaf(xk, affine_decode(c, s, b), acc);
  }
  return acc;
}

// The shared memory of a configuration (the ring, its barriers, the two partial-sum arrays).
// X2: a stage holds two rows of x (M <= 2), not MT * 8.
// NT > 1: NT tiles' weights a stage; the partial-sum arrays live in the ring (qmmp_body).
template <int FM, int MT, int S, int KC, bool X2 = false, int NT = 1>
constexpr size_t smem_bytes() {
  using G = Geo<FM>;
  const size_t xsum = dec_affine(FM) ? (size_t)S * G::FBS * KC * MT * 8 * 4 : 0;
  const size_t xrows = X2 ? 2 : MT * 8;
  return (size_t)S * (NT * KC * G::STAGE + xrows * (KC * 512 + G::XPAD)) + 3 * S * 8 +
         (NT > 1 ? 0 : 2 * (4 * MT * 4 * 32) * 4) + xsum;
}

// Whether this architecture's code of a configuration is built: compute capability 12.x
// gives a block at most 99 KB of shared memory, so the larger configurations (most of them)
// compile there as an empty body that launch() never reaches (it refuses them first); this
// keeps nvcc's time for sm_120a down.
// The WG configurations (wgmma) are sm_90a code only; dispatch runs them on 9.x devices.
template <int FM, int MT, int S, int KC, bool WG, bool X2, int NT = 1>
__device__ constexpr bool built_here() {
#if !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  if (WG) return false;
#endif
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1200 && __CUDA_ARCH__ < 1300
  return smem_bytes<FM, MT, S, KC, X2, NT>() <= 99 * 1024;
#else
  return true;
#endif
}

// Bytes per stage that x_stage_kernel writes: M rows of x in shared memory's row pitch
// (WG: all R rows in wgmma's order, no pads), then (affine) the stage's sums of x [NF][R]
// (R = MT * 8 rows, zeros past M).
template <int FM, int KC, bool WG>
constexpr size_t x_stage_bytes(int M, int R) {
  using G = Geo<FM>;
  return (WG ? (size_t)R * KC * 512 : (size_t)M * (KC * 512 + G::XPAD)) +
         (dec_affine(FM) ? (size_t)G::FBS * KC * R * 4 : 0);
}
// A grouped gather's slot of staged x for one work item and stage (gx_stage_kernel writes it,
// launch() sizes the buffer by it, the decode kernel reads it): R rows, whatever the item's
// count, so that item z's stage c is at xt + (z * stages + c) * gx_slot_bytes.
template <int FM, int KC>
constexpr size_t gx_slot_bytes(int R) {
  return x_stage_bytes<FM, KC, false>(R, R);
}

// A CTA's rows of x and out: row r is row r of batch entry `entry`, or (gather grouped by
// expert, ents set) row (row0 + r) % Mo of entry ents[(row0 + r) / Mo].
struct RowMap {
  const int32_t* ents;
  int row0, Mo, entry;
  __device__ __forceinline__ int of(int r, int64_t* e) const {
    if (ents) {
      const int gr = row0 + r;
      *e = ents[gr / Mo];
      return gr % Mo;
    }
    *e = entry;
    return r;
  }
};

// Work item z of a grouped gather (p.plan): its rows (RowMap), their count (*rows_out, at
// most cap: the tile's rows, MT * 8, which must equal the plan's rows per item: dispatch
// gives the plan's 8 rows MT = 1 and its 16 rows MT = 2) and its expert (*e; p.E for the
// plan's bin of indices out of range).
// (Plain values: a lambda capturing p by reference put the whole parameter block on the
// stack, 848 bytes, and made every kernel 2-3x slower on the H100.)
__device__ __forceinline__ RowMap item_rows(const QP& p, int z, int cap, int* rows_out, int* e) {
  *e = p.plan.tile_seg[z];
  const int s0 = p.plan.seg_start[*e], row0 = p.plan.tile_row0[z];
  *rows_out = min(cap, (p.plan.seg_start[*e + 1] - s0) * p.Mo - row0);
  return RowMap{p.plan.perm + s0, row0, p.Mo, z};
}

// k-step j (16 k) of this lane's 16 bytes w4 of a fragment block, decoded into mma's A
// registers (rows g, g + 8 of the row block; the layout put the k-step's codes in
// fragment order), each value exact in bf16: fp4 and fp8 as e * s * 2^-9 (sg / sg8:
// bf16x2 of the scale times the placement's factor for rows g / g + 8), affine the codes
// as c * 2^-7 (scale and bias go to the fp32 sums). The same for mma.sync and wgmma.
template <int FM>
__device__ __forceinline__ uint4 dec_frag(const uint32_t (&w4)[4], int j, uint32_t sg, uint32_t sg8, uint32_t mul0,
                                          uint32_t mul1) {
  // affine codes: a code c in the low bits of a bf16 is the subnormal c * 2^-133 (4-bit
  // codes at bits 4..7: c * 2^-129); one exact multiply makes it c * 2^-7
  constexpr uint32_t k126 = 0x7e807e80u, k122 = 0x7c807c80u;
  if constexpr (FM == kDecFp4) {
    // E2M1 pairs (nibbles i, i + 4) placed as bf16 e * 2^-126 (vec.cuh's fp4_pairs)
    const uint32_t mul[2] = {mul0, mul1};
    uint32_t pr[4];
    fp4_pairs(w4[j], mul, pr);
    return make_uint4(bmul(pr[0], sg), bmul(pr[1], sg8), bmul(pr[2], sg), bmul(pr[3], sg8));
  } else if constexpr (FM == kDecFp8) {
    // word 2j is row g, 2j + 1 row g + 8; E4M3 placed as e * 2^-120
    uint32_t p0g, p1g, p0h, p1h;
    fp8_place(w4[2 * j], 4, 4, 0x07f007f0u, p0g, p1g);
    fp8_place(w4[2 * j + 1], 4, 4, 0x07f007f0u, p0h, p1h);
    return make_uint4(bmul(p0g, sg), bmul(p0h, sg8), bmul(p1g, sg), bmul(p1h, sg8));
  } else if constexpr (dec_bits8(FM)) {
    // word 2j is row g, 2j + 1 row g + 8; bytes (0, 2), (1, 3)
    const uint32_t wg = w4[2 * j], wh = w4[2 * j + 1];
    return make_uint4(bmul(wg & 0x00ff00ffu, k126), bmul(wh & 0x00ff00ffu, k126), bmul((wg >> 8) & 0x00ff00ffu, k126),
                      bmul((wh >> 8) & 0x00ff00ffu, k126));
  } else {
    // nibbles (0, 4) / (1, 5) / (2, 6) / (3, 7): a0 / a1 / a2 / a3
    const uint32_t w = w4[j], w8 = w >> 8;
    return make_uint4(bmul(w & 0x000f000fu, k126), bmul(w & 0x00f000f0u, k122), bmul(w8 & 0x000f000fu, k126),
                      bmul(w8 & 0x00f000f0u, k122));
  }
}

// MT n8 tiles of x rows (M <= 8 MT), S stages of KC chunks (256 k each); FM: the
// layout's format (DecFmt); RS: consumer warps per (row block, parity), each with MT / RS
// of the row tiles (a row's sums run in the same order for every RS).
// GR: gather grouped by expert (p.plan), its own instantiations so that the dense and
// per-entry kernels keep their registers (the grouped rows cost affine's 17..64-row tiles
// 10-23 % when compiled into every kernel, H100).
// WG: wgmma with x from shared memory (sm_90a; staged x in x_stage_kernel's WG order, 32 or 64
// rows of x per warpgroup, dense calls: see wg_mma).
// X2: two rows of x in a stage (M <= 2: one row of bf16 x, or of float16 x's high parts and
// remainders), not 8: the lanes of mma columns 2..7 read row 0 again, and those columns are
// not stored. The 6 rows of zeros were 23 % of a 4-bit 512-k stage; without them such
// stages fit four CTAs an SM.
// NT: 64-row tiles a CTA (dense calls without a K split). With NT = 2 a stage holds two
// tiles' weights beside one copy of x's rows, and each tile has its own 8 * RS consumer
// warps doing exactly what they do at NT = 1 (the same FBs in the same order: the same
// bits). Where x's 64 rows are 3.5x a tile's weight bytes a stage (33..64 rows), this
// halves x's shared-memory and L2 traffic per weight byte and doubles the warps an SM
// without decoding any FB twice. The partial-sum arrays then live in the ring (idle after
// the main loop), so the ring keeps its depth.
template <int FM, int MT, int S, int KC, int RS, bool GR, bool WG, bool X2, int NT>
__device__ __forceinline__ void qmmp_body(const QP p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using G = Geo<FM>;
  constexpr bool F8 = dec_bits8(FM), AFF = dec_affine(FM);
  constexpr int kThreads = threads_of(FM, RS, NT), kCons = kConsumers * RS * NT, MW = MT / RS;
  static_assert(NT == 1 || (!GR && !X2), "two tiles a CTA: dense calls");
  static_assert(MT % RS == 0, "row tiles split evenly");
  static_assert(!WG || (!GR && (MW == 4 || MW == 8)), "wgmma: 32 or 64 rows of x per warpgroup (wg_mma)");
  static_assert(!X2 || (MT == 1 && !WG && !GR), "two rows of x: dense or per-entry calls at M <= 2");
  constexpr int XS = KC * 512 + G::XPAD, XR = X2 ? 2 : MT * 8;  // bytes per row of x in a stage, rows
  constexpr int TW = KC * G::STAGE, SW = NT * TW, STG = SW + XR * XS, RED = 4 * MT * 4 * 32;
  constexpr int NF = G::FBS * KC, XSUM = AFF ? NF * MT * 8 : 0;  // affine: sums of x per stage [FB][row]
  extern __shared__ __align__(128) uint8_t smem[];
  // full[S], empty[S], affine: xready[S] (the stage's sums of x are in)
  float* xsum = reinterpret_cast<float*>(smem + S * STG);  // affine: [S][NF][MT * 8] (16-byte aligned: copied to)
  uint64_t* bars = reinterpret_cast<uint64_t*>(xsum + S * XSUM);
  // the odd warps' partial sums, then this CTA's sums (read by the cluster's rank 0); a
  // tile's at ti * RED; NT > 1: in the ring
  float* red = NT > 1 ? reinterpret_cast<float*>(smem) : reinterpret_cast<float*>(bars + 3 * S);
  float* part = red + NT * RED;
  static_assert(NT == 1 || (size_t)S * STG >= 2 * NT * RED * sizeof(float), "the ring holds the sums");
  cg::cluster_group cluster = cg::this_cluster();
  const int ks = (int)cluster.dim_blocks().y, rank = (int)cluster.block_rank();
  const int nk = p.K / (kDecChunkK * KC), entry = blockIdx.z;
  // gather: the expert comes from memory the previous kernel may have written (a router's
  // top-k, or the plan), so every thread waits for it first; an index out of range gives
  // NaN rows
  int64_t expert = 0;
  bool bad = false;
  // This CTA's rows: rows 0 .. M - 1 of entry blockIdx.z, or (grouped) Mc rows of the
  // plan's item, row r being row (row0 + r) % Mo of entry ents[(row0 + r) / Mo].
  int Mc = p.M;
  RowMap rows{nullptr, 0, p.Mo, entry};
  if constexpr (GR) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    if (entry >= *p.plan.ntiles) return;  // (both ranks of a cluster: one z)
    int e;
    rows = item_rows(p, entry, MT * 8, &Mc, &e);
    bad = e >= p.E;  // the plan's bin of indices out of range
    expert = bad ? 0 : e;
  } else if (p.gidx.ptr) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    expert = *((const int32_t*)p.gidx.ptr + p.gidx.offset(entry));
    bad = expert < 0 || expert >= p.E;
    if (bad) expert = 0;
  }
  const int c0 = (blockIdx.y) * p.cps, nch = bad ? 0 : max(0, min(nk, c0 + p.cps) - c0);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const uint32_t bar0 = smem_u32(bars);
  if (threadIdx.x == 0) {
    for (int s = 0; s < S; ++s) {
      mbar_init(bar0 + 8 * s, 1);
      // Every consumer thread (empty) and every x-sum thread (xready) arrives: an arrive
      // releases only the arriving thread's own accesses, so a lane's shared loads of a
      // stage are ordered before the slot's next copy (or sums) by its own arrive, not by
      // one elected lane's (compute-sanitizer's racecheck sees the difference: with one
      // lane per warp it reported the slot's next bulk copy as racing with the loads of
      // lanes that had not arrived, wherever the ring wrapped in a cluster of 2).
      mbar_init(bar0 + 8 * (S + s), 32 * kCons);
      mbar_init(bar0 + 8 * (2 * S + s), 32);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  // rows of x past M stay zero in every stage (the copies never write them; WG: the staged
  // copies bring every row, zeros included)
  if (!WG)
    for (int s = 0; s < S; ++s)
      for (int i = threadIdx.x; i < (XR - Mc) * (XS / 16); i += kThreads)
        reinterpret_cast<uint4*>(smem + s * STG + SW + Mc * XS)[i] = make_uint4(0, 0, 0, 0);
  if (!p.xt)  // (staged: the copies bring the sums, zeros past M included)
    for (int i = threadIdx.x; i < S * XSUM; i += kThreads) xsum[i] = 0.0f;  // rows past M stay 0
  __syncthreads();
  // The next kernel in the stream may start its own weight prefetch now (it waits
  // for this one to finish before it reads x or writes anything).
  // Not in swiglu mode: the down projection launched this early made the gate/up + down
  // pair slower (H200, CUDA graphs, M = 1: nvfp4 44.0 -> 47.7 us, mxfp8 57.3 -> 70.5;
  // bench/results/qmm-decode-h100-notes.md, session t); it launches when this grid ends.
  if (!p.swiglu) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  // consumer: tile ti of the CTA's NT, row block rb of it, fragment blocks of parity fpar,
  // row tiles T0 .. T0 + MW - 1
  const int ti = warp / (kConsumers * RS), wr = warp % (kConsumers * RS);
  const int rb = wr & 3, fpar = (wr >> 2) & 1, T0 = (wr >> 3) * MW, g = lane >> 2, q = lane & 3;
  const int tile = blockIdx.x * NT + ti;  // (consumers only: the producer copies all NT)
  float acc[MW][4];
#pragma unroll
  for (int t = 0; t < MW; ++t)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[t][i] = 0.0f;
  if (warp == kCons) {
    // The producer warp: lane 0 arms each stage's barrier and copies its weights; the
    // rows of x are copied by all 32 lanes (up to 64 rows: one lane issuing them all
    // would serialize 64 copies per stage).
    uint64_t pol;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
    // the CTA's first tile's weights from this CTA's first stage; tile u's tstride * u further
    const size_t tstride = (size_t)(p.K / kDecChunkK) * G::STAGE;
    const uint8_t* wt =
        p.w + expert * p.wper + ((size_t)blockIdx.x * NT * (p.K / kDecChunkK) + (size_t)c0 * KC) * G::STAGE;
    // unstaged x from this CTA's first stage: rows 0 .. M - 1 of the entry at xs, or
    // (grouped, at most 16 rows) this lane's row of the item at xr
    const __nv_bfloat16* xs = p.x + (p.gidx.ptr ? p.xb.offset(entry) : 0) + (size_t)c0 * KC * kDecChunkK;
    const __nv_bfloat16* xr = nullptr;
    if (GR && !p.xt && lane < Mc) {
      int64_t e;
      const int m = rows.of(lane, &e);
      xr = p.x + p.xb.offset(e) + (int64_t)m * p.xld + (size_t)c0 * KC * kDecChunkK;
    }
    // Programmatic dependent launch: the weights do not depend on the previous
    // kernel in the stream, so the first stages' weight copies go out before
    // waiting for it (overlapping its tail with this kernel's ramp); x, and with
    // it everything this kernel writes, comes after the wait.
    const int pre = nch < S ? nch : S;
    // staged x: the stage's rows, then (affine) its sums of x, from x_stage_kernel
    const uint32_t xbytes = WG ? MT * 8 * 512 * KC : p.xt ? Mc * XS : Mc * 512 * KC;
    const uint32_t sbytes = AFF && p.xt ? XSUM * 4 : 0;
    if (lane == 0)
      for (int i = 0; i < pre; ++i) {
        const uint32_t full = bar0 + 8 * i;
        mbar_expect(full, SW + xbytes + sbytes);
#pragma unroll
        for (int u = 0; u < NT; ++u)
          bulk_g2s_evict_first(smem_u32(smem + i * STG + u * TW), wt + u * tstride + (size_t)i * TW, TW, full, pol);
      }
    // (a stage's x copies after its expect: the barrier's transaction count never runs
    // ahead of what it was armed for)
    __syncwarp();
    asm volatile("griddepcontrol.wait;" ::: "memory");
    for (int i = 0; i < nch; ++i) {
      const int s = i % S;
      const uint32_t full = bar0 + 8 * s, dst = smem_u32(smem + s * STG);
      if (i >= pre) {
        mbar_wait(bar0 + 8 * (S + s), ((i / S) - 1) & 1);
        if (lane == 0) {
          mbar_expect(full, SW + xbytes + sbytes);
#pragma unroll
          for (int u = 0; u < NT; ++u)
            bulk_g2s_evict_first(dst + u * TW, wt + u * tstride + (size_t)i * TW, TW, full, pol);
        }
        __syncwarp();
      }
      if (p.xt) {
        if (lane == 0) {
          // (grouped: item `entry`'s stages, slots of R rows: gx_stage_kernel)
          const uint8_t* blk = GR ? p.xt + ((size_t)entry * nk + c0 + i) * gx_slot_bytes<FM, KC>(MT * 8)
                                  : p.xt + (size_t)(c0 + i) * (xbytes + sbytes);
          bulk_g2s(dst + SW, blk, xbytes, full);
          if (sbytes) bulk_g2s(smem_u32(xsum + s * XSUM), blk + xbytes, sbytes, full);
        }
      } else {
        if constexpr (GR) {
          static_assert(MT * 8 <= 32, "one row of x per producer lane");
          if (xr) bulk_g2s(dst + SW + lane * XS, xr + (size_t)i * KC * kDecChunkK, 512 * KC, full);
        } else {
          for (int m = lane; m < Mc; m += 32)
            bulk_g2s(dst + SW + m * XS, xs + (size_t)m * p.xld + (size_t)i * KC * kDecChunkK, 512 * KC, full);
        }
      }
    }
  } else if (warp > kCons) {
    if (AFF && !p.xt) {
      // Affine: the sums of x over each fragment block's k, one per (FB, row) of a stage,
      // for the consumers' b * sum(x) (in a fixed order: the same bits for every M)
      constexpr int FK = dec_fb_k(FM);  // k per FB: 64 / 32 (8 / 4 uint4 of bf16)
      for (int i = 0; i < nch; ++i) {
        const int s = i % S;
        // xsum[s] was read by the consumers of stage i - S: wait for their release of the slot
        if (i >= S) mbar_wait(bar0 + 8 * (S + s), ((i / S) - 1) & 1);
        mbar_wait(bar0 + 8 * s, (i / S) & 1);
        const uint8_t* xbase = smem + s * STG + SW;
        for (int j = lane; j < NF * Mc; j += 32) {
          const int f = j / Mc, m = j % Mc;
          xsum[(s * NF + f) * MT * 8 + m] = fb_xsum<FK / 8>(reinterpret_cast<const uint4*>(xbase + m * XS + f * FK * 2));
        }
        mbar_arrive(bar0 + 8 * (2 * S + s));
      }
    }
  } else {
    constexpr int FK = dec_fb_k(FM), J = FK / 16, XW = FK / 8;  // k per FB, k-steps per FB, x words per lane
    // This thread's operands within a stage, as shared-memory offsets computed once (opaque):
    // FB f = fpar + 2 ff of row block rb starts at ((f / FBS) * 4 + rb) * FBS * FB + (f % FBS)
    // * FB, which for an even FBS is the thread's (rb, fpar) term plus a constant of ff (fo
    // below). In the loop, a stage's address and those constants; re-derived from threadIdx.x
    // in every stage they were ~40 of the M = 1 loop's ~200 instructions (sm_90a).
    static_assert(G::FBS % 2 == 0, "FB parity and f / FBS separate");
    const uint32_t ring = opaque(smem_u32(smem)), xsring = opaque(smem_u32(xsum));
    const uint32_t fbt = ti * TW + rb * G::FBS * G::FB + fpar * G::FB;
    const uint32_t wofs = opaque(fbt + 16 * lane);
    // the FB's scales: fp4 2 bytes a lane; fp8 2 bytes a row g; affine (s, b) pairs of row g
    const uint32_t sofs = opaque(fbt + 512 + (AFF ? 8 * g : F8 ? 2 * g : 2 * lane));
    const int xrow = X2 ? (g < 2 ? g : 0) : 8 * T0 + g;  // the x row of this lane's mma column
    const uint32_t xofs = opaque(SW + xrow * XS + fpar * FK * 2 + q * (FK / 2));  // mma.sync's x words
    const uint32_t xsofs = opaque(4 * (fpar * MT * 8 + 8 * T0 + 2 * q));  // affine: the FB's sums of x
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    // WG: x's descriptor for stage 0's k-step (fpar, 0): 8-row groups a stage's 256 k (4096
    // bytes) apart, k-step (f, j)'s two core matrices 128 bytes apart (x_stage_kernel's WG order)
    static_assert(STG % 16 == 0, "stage offsets in 16-byte units");
    const uint32_t xd0 = WG ? opaque(wg_desc_lo(ring + SW + (uint32_t)(fpar * J) * 256u + (uint32_t)T0 * 4096u * KC, 128u)) : 0u;
#endif
    for (int i = 0, s = 0, ph = 0; i < nch; ++i) {
      mbar_wait(bar0 + 8 * s, ph);
      if (AFF && !p.xt) mbar_wait(bar0 + 8 * (2 * S + s), ph);  // x's sums of the stage
      const uint32_t st = ring + s * STG;
#pragma unroll
      for (int ff = 0; ff < G::FBS * KC / 2; ++ff) {
        const uint32_t fo = (2 * ff / G::FBS) * 4 * G::FBS * G::FB + (2 * ff % G::FBS) * G::FB;
        const uint4 wv = lds128(st + wofs + fo);
        const uint32_t w4[4] = {wv.x, wv.y, wv.z, wv.w};
        // the FB's scales: fp, bf16x2 of the scale times the decoder's factor for rows g
        // (sg) and g + 8 (sg8); affine, its (scale, bias) pairs and this FB's sums of x
        uint32_t sg = 0, sg8 = 0;
        uint2 sb{};
        float2 xs[MW];
        if constexpr (AFF) {
          sb = lds64(st + sofs + fo);
#pragma unroll
          for (int t = 0; t < MW; ++t) {
            const uint2 v = lds64(xsring + 4 * (s * XSUM + 2 * ff * MT * 8 + 8 * t) + xsofs);
            xs[t] = make_float2(__uint_as_float(v.x), __uint_as_float(v.y));
          }
        } else if constexpr (F8) {
          // s * 2^111 (the code is its exponent field)
          const uint32_t sc = lds16(st + sofs + fo);
          sg = prmt(sc, 0, 0x4040u) * 128u, sg8 = prmt(sc, 0, 0x4141u) * 128u;
        } else {
          // s * 2^117
          const uint32_t sc = lds16(st + sofs + fo);
          sg = prmt(sc, 0, 0x4040u) * 16u + 0x70007000u, sg8 = prmt(sc, 0, 0x4141u) * 16u + 0x70007000u;
        }
        // affine: the codes go into the mma exact, and the FB's scales and biases are applied
        // to its fp32 sums of x * c * 2^-7 after its last k-step (qmma.cu's factoring:
        // sum x (s c + b) = s sum x c + b sum x, the sums of x from the x-sum warp or the
        // staging kernel)
        float tmp[MW][4];
#pragma unroll
        for (int t = 0; t < MW; ++t)
#pragma unroll
          for (int e = 0; e < 4; ++e) tmp[t][e] = 0.0f;
        float(&dst)[MW][4] = AFF ? tmp : acc;
        if constexpr (WG) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
          // x of k-step (fpar + 2 ff, j): 256 bytes a k-step from xd0's, in 16-byte units
          const uint32_t xd = xd0 + (uint32_t)s * (STG / 16) + (uint32_t)(2 * ff * J) * 16u;
          uint4 a[J];
#pragma unroll
          for (int j = 0; j < J; ++j) a[j] = dec_frag<FM>(w4, j, sg, sg8, p.mul0, p.mul1);
          if (AFF) wg_hold<MW>(tmp);
          wg_fence();
#pragma unroll
          for (int j = 0; j < J; ++j) wg_mma(dst, a[j], wg_desc(xd + 16u * j, 4096u * KC));
          wg_commit();
          if (AFF) {
            wg_wait0();
            wg_hold<MW>(tmp);
          }
#endif
        } else {
          // x's words for this lane: rows 8 (T0 + t) + g, k-step j's pair in words 2j, 2j + 1
          uint32_t xw[MW][XW];
#pragma unroll
          for (int t = 0; t < MW; ++t)
#pragma unroll
            for (int u = 0; u < XW / 4; ++u) {
              const uint4 v = lds128(st + xofs + 8 * t * XS + 2 * ff * FK * 2 + 16 * u);
              xw[t][4 * u] = v.x, xw[t][4 * u + 1] = v.y, xw[t][4 * u + 2] = v.z, xw[t][4 * u + 3] = v.w;
            }
#pragma unroll
          for (int j = 0; j < J; ++j) {
            const uint4 a = dec_frag<FM>(w4, j, sg, sg8, p.mul0, p.mul1);
#pragma unroll
            for (int t = 0; t < MW; ++t) mma16816(dst[t], a.x, a.y, a.z, a.w, xw[t][2 * j], xw[t][2 * j + 1]);
          }
        }
        if constexpr (AFF) affine_apply<MW>(acc, tmp, xs, sb);
      }
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
      if constexpr (WG) {
        // the slot's x is read by the tensor cores until the group completes
        wg_wait0();
        wg_hold<MW>(acc);
      }
#endif
      mbar_arrive(bar0 + 8 * (S + s));  // this thread is done with slot s (and its xsum)
      if (++s == S) s = 0, ph ^= 1;
    }
  }
  // The CTA's sum: the two FB-parity warps of a row block, even + odd.
  // (NT > 1: red and part are in the ring, which other warps may still be reading; ks is 1)
  if constexpr (NT > 1) __syncthreads();
  float* const tred = red + ti * RED;  // this warp's tile's
  if (warp < kCons && fpar == 1)
#pragma unroll
    for (int t = 0; t < MW; ++t)
#pragma unroll
      for (int i = 0; i < 4; ++i) tred[((rb * MT + T0 + t) * 4 + i) * 32 + lane] = acc[t][i];
  __syncthreads();
  if (warp < kCons && fpar == 0)
#pragma unroll
    for (int t = 0; t < MW; ++t)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int o = ti * RED + ((rb * MT + T0 + t) * 4 + i) * 32 + lane;
        part[o] = acc[t][i] + red[o];
      }
  // Without a K split the CTA is a cluster of one: a CTA barrier orders part[] (float16 x's
  // remainder rows read other lanes' sums) and no rank waits for another. (A cluster
  // barrier's arrive releases the CTA's writes to the cluster: a memory barrier before it,
  // where ncu put ~13 % of the warp-stall samples of 28672 x 4096 at M = 1, four CTAs an SM.)
  if (ks > 1)
    cluster.sync();
  else
    __syncthreads();
  // (rank 0 has a stage, so its threads are past the producer's wait; this is for the
  // reads of gs and bias, which the previous kernel may have written)
  asm volatile("griddepcontrol.wait;" ::: "memory");
  // K split: rank 0's threads copy the other ranks' sums into the ring (idle now: every
  // stage was consumed), all loads in flight at once; the output loop below then reads
  // them locally, and the other ranks are released here, before rank 0's stores. (Read in
  // that loop through the cluster, one value at a time, the loads were 4 MW dependent round
  // trips a thread: H200, CUDA graphs, 6144 x 4096 nvfp4 M = 64 35.5 -> 29.1 us, 4096^2
  // M = 16 11.5 -> 11.0, M = 1 from 5 % faster to 1 % slower; qmm-decode-h100-notes.md,
  // session aj.) Rank r's sums at ring + (r - 1) * RED (decode_matmul splits K over at most
  // 2 ranks; every ring holds the sums of 3 more). The additions keep their order: the
  // same bits as before.
  float* rpart = reinterpret_cast<float*>(smem);
  static_assert((size_t)S * STG >= 3 * RED * sizeof(float), "the ring holds 3 other ranks' sums");
  if (ks > 1 && rank == 0) {
    for (int r = 1; r < ks; ++r) {
      // (8-byte words: part is 8-byte aligned, after 3 S barriers)
      const float2* src = reinterpret_cast<const float2*>(cluster.map_shared_rank(part, r));
      float2* dst = reinterpret_cast<float2*>(rpart + (r - 1) * RED);
      for (int i = threadIdx.x; i < RED / 2; i += kThreads) dst[i] = src[i];
    }
    __syncthreads();
  }
  if (ks > 1) cluster.sync();  // the other ranks' shared memory stays until rank 0 has read it
  if (rank == 0 && warp < kCons && fpar == 0) {
    // 2^9 undoes the fp decoders' 2^-9 (affine: the scales took the 2^7)
    const float alpha = AFF ? 1.0f : p.gs ? nvfp4_dec(*p.gs) * 512.0f : 512.0f;
    // output rows (float16 x: Mo of the 2 Mo staged); grouped: the item's, read again here
    // rather than kept in registers through the main loop
    int Mout = p.Mo;
    if constexpr (GR) {
      int e;
      rows = item_rows(p, entry, MT * 8, &Mout, &e);
    }
    // Rolled loops (the sums are in part[], not in registers). Unrolled, this was ~560
    // instructions an output value (the K split's loop, float16 x, bias, dtype and swiglu
    // paths), 18 K instructions at 64 rows (sm_90a: 15.9 MB of cubin for this file, now
    // 3.3), run once a tile from a cold instruction cache: a fixed ~16-40 us a tile at 64
    // rows. Rolled, H200, CUDA graphs: 4096^2 nvfp4 M = 32 22.8 -> 14.6 us, M = 64 27.5 ->
    // 20.1, M = 1 8.1 -> 7.6; 28672 x 4096 M = 64 111 -> 91 (qmm-decode-h100-notes.md,
    // session ai).
#pragma unroll 1
    for (int t = 0; t < MW; ++t)
#pragma unroll 1
      for (int i = 0; i < 4; ++i) {
        const int o = ti * RED + ((rb * MT + T0 + t) * 4 + i) * 32 + lane;
        const int m = 8 * (T0 + t) + 2 * q + (i & 1), n = tile * kDecTileRows + rb * 16 + g + 8 * (i >> 1);
        if (m < Mout && n < p.N) {
          float v = part[o];
#pragma unroll 1
          for (int r = 1; r < ks; ++r) v += rpart[(r - 1) * RED + o];
          if (p.x16) {  // + the sums of row m's remainder row, m + Mo (the same column n)
            const int h = m + p.Mo;
            const int o2 = ti * RED + ((rb * MT + (h >> 3)) * 4 + ((i & 2) | (h & 1))) * 32 + 4 * g + ((h & 7) >> 1);
            float v2 = part[o2];
#pragma unroll 1
            for (int r = 1; r < ks; ++r) v2 += rpart[(r - 1) * RED + o2];
            v += v2;
          }
          int64_t e;
          const int mm = rows.of(m, &e);
          if (AFF && !bad && !isfinite(v))
            v = affine_exact<FM>(p.w + expert * p.wper, p.x + (p.gidx.ptr ? p.xb.offset(e) : 0) + (int64_t)mm * p.xld,
                                 p.x16, p.K, n);
          v = bad ? __int_as_float(0x7fc00000) : v * alpha;
          // a gated layout: column n holds the weight's row nw; swiglu: the value as stored
          // (biased, rounded to out's dtype) goes to red[o] for the pass below
          const int nw = p.gated ? (int)decode_gated_row(n, p.gated) : n;
          if (p.swiglu)
            red[o] = round_as(p.out.dt, biased(p.bias, nw, v));
          else
            store_biased(p.out, p.bias, (e * p.Mo + mm) * p.N + nw, nw, v);
        }
      }
    if (p.swiglu) {
      // SwiGLU of each (gate, up) pair: a tile's gate rows are its row blocks 0 and 1, the
      // up rows of the same output columns blocks 2 and 3 (32 rows further), which other
      // warps of this CTA hold: they meet in red[] after a barrier of these 4 * RS warps
      // (up to 16 kernel rows: past that decode_matmul runs the product and qq's swiglu)
      asm volatile("bar.sync %0, %1;" ::"r"(1 + ti), "r"(128 * RS) : "memory");  // (a barrier a tile)
      if (rb < 2)
#pragma unroll 1
        for (int t = 0; t < MW; ++t)
#pragma unroll 1
          for (int i = 0; i < 4; ++i) {
            const int o = ti * RED + ((rb * MT + T0 + t) * 4 + i) * 32 + lane, ou = o + 2 * MT * 4 * 32;
            const int m = 8 * (T0 + t) + 2 * q + (i & 1), n = tile * kDecTileRows + rb * 16 + g + 8 * (i >> 1);
            if (m < Mout && n < p.N) {
              int64_t e;
              const int mm = rows.of(m, &e);
              const int nw = (int)decode_gated_row(n, p.gated);
              store_as(p.out, (e * p.Mo + mm) * p.gated + nw, swiglu_f32(red[o], red[ou]));
            }
          }
    }
  }
#else
  __trap();  // never launched: launch() refuses code compiled below sm_90
#endif
}

template <int FM, int MT, int S, int KC, int kMinBlocks, int RS, bool GR, bool WG, bool X2, int NT>
__global__ void __launch_bounds__(threads_of(FM, RS, NT), kMinBlocks) qmmp_kernel(const QP p) {
  if constexpr (built_here<FM, MT, S, KC, WG, X2, NT>())
    qmmp_body<FM, MT, S, KC, RS, GR, WG, X2, NT>(p);
  else
    __trap();
}

// A pair of float16 values as bf16 high parts (round to nearest) and their remainders,
// which bf16 holds exactly (at most 4 significant bits left, no exponent below bf16's):
// x = hi + lo with both products by a weight exact in fp32. A non-finite x keeps lo = 0.
__device__ __forceinline__ void f16_split(uint32_t v, uint32_t& hi, uint32_t& lo) {
  const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&v));
  const __nv_bfloat162 h = __floats2bfloat162_rn(f.x, f.y);
  const float2 hf = __bfloat1622float2(h);
  const float l0 = isfinite(hf.x) ? f.x - hf.x : 0.0f, l1 = isfinite(hf.y) ? f.y - hf.y : 0.0f;
  const __nv_bfloat162 l = __floats2bfloat162_rn(l0, l1);
  hi = *reinterpret_cast<const uint32_t*>(&h);
  lo = *reinterpret_cast<const uint32_t*>(&l);
}
// Eight float16 values (16 bytes) split so.
__device__ __forceinline__ void f16_split(const uint4& v, uint4& hi, uint4& lo) {
  f16_split(v.x, hi.x, lo.x);
  f16_split(v.y, hi.y, lo.y);
  f16_split(v.z, hi.z, lo.z);
  f16_split(v.w, hi.w, lo.w);
}

// x_stage_kernel for the WG configurations: the R staged rows of stage c in wgmma's K-major
// core matrices (8 rows x 16 bytes, 128 contiguous bytes): 8-row group r8 at r8 * KC * 4096,
// k-step (FB f, j) at (f * J + j) * 256, its two core matrices 128 bytes apart. A core
// matrix row holds the 4 bf16 pairs that mma.sync's lanes q = 0..3 load for that k-step
// (the layout's k order within an FB: pair (FK / 8) q + 2 j + h of the FB's k, h the core
// matrix), so the tensor cores meet the weight codes in the order the layout stored them.
// One thread per (row, FB); rows past M are zeros.
template <int FM, int KC, bool X16>
__device__ __forceinline__ void x_stage_wg(const __nv_bfloat16* x, int64_t xld, int Mx, int R, uint8_t* xt) {
  constexpr int FK = dec_fb_k(FM), J = FK / 16, NF = Geo<FM>::FBS * KC, NW = FK / 2;  // words per FB row
  const int c = blockIdx.x, M = X16 ? 2 * Mx : Mx;
  const __nv_bfloat16* xc = x + (size_t)c * KC * kDecChunkK;
  uint8_t* blk = xt + (size_t)c * x_stage_bytes<FM, KC, true>(M, R);
  float* sums = reinterpret_cast<float*>(blk + (size_t)R * KC * 512);
  for (int i = threadIdx.x; i < R * NF; i += blockDim.x) {
    const int f = i / R, m = i % R, src = X16 && m >= Mx ? m - Mx : m;
    uint4 v[FK / 8];
#pragma unroll
    for (int u = 0; u < FK / 8; ++u) {
      v[u] = m < M ? *reinterpret_cast<const uint4*>(xc + (size_t)src * xld + f * FK + 8 * u) : make_uint4(0, 0, 0, 0);
      if constexpr (X16) {  // high parts (rows < Mx) or remainders
        uint4 hi, lo;
        f16_split(v[u], hi, lo);
        v[u] = m < Mx ? hi : lo;
      }
    }
    const uint32_t* wd = reinterpret_cast<const uint32_t*>(v);
    uint8_t* row = blk + (size_t)(m >> 3) * KC * 4096 + (m & 7) * 16;
#pragma unroll
    for (int j = 0; j < J; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        *reinterpret_cast<uint4*>(row + ((f * J + j) * 2 + h) * 128) =
            make_uint4(wd[2 * j + h], wd[NW / 4 + 2 * j + h], wd[2 * NW / 4 + 2 * j + h], wd[3 * NW / 4 + 2 * j + h]);
    if constexpr (dec_affine(FM)) sums[f * R + m] = fb_xsum<FK / 8>(v);  // (zeros past M)
  }
}

// Stage c's Mx rows of x into blk in shared memory's row pitch, pads zeroed (float16 x: Mx
// high-part rows, then Mx remainder rows), then for affine the sums of each staged row per
// fragment block in the x-sum warp's order, R of them (zeros past the staged rows).
// row(m): row m's first element of this stage. One block per stage, or per stage and group
// of rows m0..m1-1 (of the R sums, and of x's Mx rows; float16 x: all of them); 16-byte copies.
template <int FM, int KC, bool X16, typename Row>
__device__ __forceinline__ void x_stage_rows(Row row, int Mx, int R, uint8_t* blk, int m0 = 0, int m1 = 1 << 30) {
  constexpr int XS = KC * 512 + Geo<FM>::XPAD, per = XS / 16, data = KC * kDecChunkK / 8;  // uint4 per row
  const int M = X16 ? 2 * Mx : Mx;  // staged rows
  if (X16 || m1 > R) m1 = R;
  if (X16) m0 = 0;
  uint4* dst = reinterpret_cast<uint4*>(blk);
  for (int i = m0 * per + threadIdx.x; i < (Mx < m1 ? Mx : m1) * per; i += blockDim.x) {
    const int m = i / per, j = i % per;
    const uint4 v = j < data ? *reinterpret_cast<const uint4*>(row(m) + 8 * j) : make_uint4(0, 0, 0, 0);
    if constexpr (X16) {
      uint4 hi, lo;
      f16_split(v, hi, lo);
      dst[i] = hi;
      dst[i + Mx * per] = lo;
    } else {
      dst[i] = v;
    }
  }
  if constexpr (dec_affine(FM)) {
    constexpr int FK = dec_fb_k(FM), NF = Geo<FM>::FBS * KC;
    __syncthreads();  // the sums read the staged rows (this block's global writes)
    float* sums = reinterpret_cast<float*>(blk + (size_t)M * XS);
    const int rows = m1 - m0;
    for (int i = threadIdx.x; i < NF * rows; i += blockDim.x) {
      const int f = i / rows, m = m0 + i % rows;
      sums[f * R + m] =
          m < M ? fb_xsum<FK / 8>(reinterpret_cast<const uint4*>(blk + (size_t)m * XS + f * FK * 2)) : 0.0f;
    }
  }
}

// x [Mx, K] (row stride xld) into stages: stage c (KC * 256 k) at c * x_stage_bytes
// (x_stage_rows), its rows split over gridDim.y blocks (launch: about kXStageBlocks in all;
// float16 x: one). WG: x_stage_wg's order.
constexpr int kXStageBlocks = 128;
template <int FM, int KC, bool X16, bool WG>
__global__ void x_stage_kernel(const __nv_bfloat16* x, int64_t xld, int Mx, int R, uint8_t* xt) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");  // x comes from the previous kernel
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
  if constexpr (WG) {
    x_stage_wg<FM, KC, X16>(x, xld, Mx, R, xt);
    return;
  }
  const int c = blockIdx.x, rb = (R + gridDim.y - 1) / gridDim.y;  // rows a block
  const __nv_bfloat16* xc = x + (size_t)c * KC * kDecChunkK;
  x_stage_rows<FM, KC, X16>([=](int m) { return xc + (size_t)m * xld; }, Mx, R,
                            xt + (size_t)c * x_stage_bytes<FM, KC, false>(X16 ? 2 * Mx : Mx, R),
                            (int)blockIdx.y * rb, ((int)blockIdx.y + 1) * rb);
}

// The same for a grouped gather (p.plan): block (c, z) stages work item z's rows (at most R)
// in its slot (gx_slot_bytes); items past the plan's count, and its bin of indices out of
// range, have nothing to stage.
template <int FM, int KC>
__global__ void gx_stage_kernel(const QP p, int R, uint8_t* xt) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");  // the plan and x come from earlier kernels
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
  const int z = blockIdx.y, c = blockIdx.x;
  if (z >= *p.plan.ntiles) return;
  int Mc, e;
  const RowMap rows = item_rows(p, z, R, &Mc, &e);
  if (e >= p.E) return;
  // the item's rows' starts in this stage, found once (a lambda holding the parameter block
  // or a Mat by reference would put them on the stack)
  __shared__ const __nv_bfloat16* rp[32];
  if (threadIdx.x < (unsigned)Mc) {
    int64_t en;
    const int mm = rows.of(threadIdx.x, &en);
    rp[threadIdx.x] = p.x + p.xb.offset(en) + (int64_t)mm * p.xld + (size_t)c * KC * kDecChunkK;
  }
  __syncthreads();
  const __nv_bfloat16* const* t = rp;
  x_stage_rows<FM, KC, false>(
      [=](int m) { return t[m]; },
      Mc, R, xt + ((size_t)z * gridDim.x + c) * gx_slot_bytes<FM, KC>(R));
}

// One thread per lane slot of a fragment block (decode_layout.h's
// decode_convert_slot, as on the CPU); *bad gets 1 when a scale cannot be encoded.
__global__ void to_decode_kernel(const DecodeLayoutArgs a, int64_t slots, int* bad) {
  const int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (t < slots && !decode_convert_slot(a, blockIdx.y, t >> 5, (int)(t & 31))) atomicOr(bad, 1);
}

// Launches one configuration; kRefused (no message) when it cannot run on this device:
// its shared memory is over the device's per-block limit (compute capability 12.x
// allows 99 KB), or the loaded code is not sm_90+ (a PTX of an older architecture,
// JIT-compiled, would have an empty body). Known per device and configuration after
// the first call, which also sets the shared-memory attribute once.
constexpr qqStatus_t kRefused = QQ_STATUS_NOT_SUPPORTED;
// xt: where x_stage_kernel's buffer comes from when x is staged, else null.
// NT > 1 (two tiles a CTA): dense calls without a K split whose tiles pair up.
template <int FM, int MT, int S, int KC, int kMinBlocks, int RS = 1, bool GR = false, bool WG = false, bool X2 = false,
          int NT = 1>
qqStatus_t launch(const QP& p, int tiles, int ks, cudaStream_t stream, Scratch* xt = nullptr) {
  constexpr size_t smem = smem_bytes<FM, MT, S, KC, X2, NT>();
  // kMinBlocks CTAs an SM is the configuration's point: they must fit an H100 / H200 SM's
  // 228 KB (1 KB of it reserved per CTA), or the GPU would silently run fewer
  static_assert((smem + 1024) * kMinBlocks <= 228 * 1024, "the configuration's CTAs fit an SM");
  auto kern = qmmp_kernel<FM, MT, S, KC, kMinBlocks, RS, GR, WG, X2, NT>;
  if (X2 && p.M > 2) return kRefused;  // (dispatch's rule: a stage holds two rows)
  if (NT > 1 && (ks > 1 || tiles % NT || p.gidx.ptr)) return kRefused;
  static std::atomic<uint64_t> ok{0}, refused{0};  // bit d: device d (devices past 63 ask every time)
  int dev = 0;
  QQ_CUDA_TRY(cudaGetDevice(&dev), "decode_matmul");
  const uint64_t bit = dev < 64 ? 1ull << dev : 0;
  if (bit && (refused.load(std::memory_order_relaxed) & bit)) return kRefused;
  if (!bit || !(ok.load(std::memory_order_relaxed) & bit)) {
    int optin = 0;
    cudaFuncAttributes fa{};
    QQ_CUDA_TRY(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev), "decode_matmul");
    QQ_CUDA_TRY(cudaFuncGetAttributes(&fa, kern), "decode_matmul");
    if ((size_t)optin < smem || fa.ptxVersion < 90) {
      refused.fetch_or(bit, std::memory_order_relaxed);
      return kRefused;
    }
    QQ_CUDA_TRY(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem), "decode_matmul");
    ok.fetch_or(bit, std::memory_order_relaxed);
  }
  QP q = p;
  const int nk = p.K / (kDecChunkK * KC);
  q.cps = (nk + ks - 1) / ks;
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = 1;
  attr[0].val.clusterDim.y = (unsigned)ks;
  attr[0].val.clusterDim.z = 1;
  attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;  // see the producer
  attr[1].val.programmaticStreamSerializationAllowed = 1;
  if (xt) {
    uint8_t* buf = nullptr;
    const size_t xsb = GR ? (size_t)p.B * gx_slot_bytes<FM, KC>(MT * 8) : x_stage_bytes<FM, KC, WG>(p.M, MT * 8);
    QQ_TRY(xt->get("decode_matmul", (size_t)nk * xsb, &buf));
    cudaLaunchConfig_t xc = {};
    xc.gridDim = dim3((unsigned)nk, 1, 1);
    xc.blockDim = dim3(256, 1, 1);
    xc.stream = stream;
    xc.attrs = attr + 1;
    xc.numAttrs = 1;
    if constexpr (GR) {
      static_assert(!WG, "grouped items stage x in the mma.sync order");
      xc.gridDim = dim3((unsigned)nk, (unsigned)p.B, 1);
      QQ_CUDA_TRY(cudaLaunchKernelEx(&xc, gx_stage_kernel<FM, KC>, p, MT * 8, buf), "decode_matmul");
    } else if (p.x16) {
      QQ_CUDA_TRY(cudaLaunchKernelEx(&xc, x_stage_kernel<FM, KC, true, WG>, p.x, p.xld, p.Mo, MT * 8, buf),
                  "decode_matmul");
    } else {
      // The rows split over blocks (blockIdx.y) until there are about kXStageBlocks: one
      // block a stage was 4-16 blocks where K is split into 1024-k stages, and took 4.4-5.8
      // us (affine 4-bit, 16 rows); split, ~2 us. Where it already had ~16 blocks, even
      // (H200, session aw).
      if (!WG && nk < kXStageBlocks) {
        const int ny = (kXStageBlocks + nk - 1) / nk;
        xc.gridDim.y = (unsigned)(ny < MT * 8 ? ny : MT * 8);
      }
      QQ_CUDA_TRY(cudaLaunchKernelEx(&xc, x_stage_kernel<FM, KC, false, WG>, p.x, p.xld, p.M, MT * 8, buf),
                  "decode_matmul");
    }
    q.xt = buf;
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((unsigned)(tiles / NT), (unsigned)ks, (unsigned)p.B);
  cfg.blockDim = dim3(threads_of(FM, RS, NT), 1, 1);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = 2;
  QQ_CUDA_TRY(cudaLaunchKernelEx(&cfg, kern, q), "decode_matmul");
  return check_launch("decode_matmul");
}

// The configurations of a format. 9..16 rows of 4-bit codes: stages of 512 k where the
// split allows it (fewer, larger copies: 5 % faster at 16384^2), 256 k otherwise, 1024 k
// where K is split at one CTA an SM (below). Deeper
// rings (2 CTAs per SM) where the tiles fill the GPU at M <= 8: 16384^2 nvfp4 M = 1 55 us
// against 62 with 4 stages; the shallower ones win elsewhere
// (bench/results/qmm-decode-h100-notes.md, session i). Affine 8-bit's stage (18 KB) fits 4
// deep for 2 CTAs, not mxfp8's 5. A configuration the device cannot run (shared memory)
// falls to the shallower.
template <int FM, bool GR>
qqStatus_t dispatch(const QP& p, int tiles, int ks, int nk, int sms, bool wg, cudaStream_t st, Scratch* xt) {
  const int M = p.M;  // the kernel's rows
  const int64_t ctas = (int64_t)tiles * p.zest;  // before the K split (grouped: the likely ones)
  qqStatus_t r;
  if constexpr (GR) {
    // the fp formats' 24- and 32-row items (staged x): the dense 17..32-row form of two CTAs
    // an SM, with 3 or 4 8-row tiles
    if (M > 24) return launch<FM, 4, dec_bits8(FM) ? 2 : 3, 1, 2, 1, GR>(p, tiles, ks, st, xt);
    if (M > 16) return launch<FM, 3, dec_bits8(FM) ? 2 : 3, 1, 2, 1, GR>(p, tiles, ks, st, xt);
  } else {
  if (M > 16) {
    // 17..64 rows: 32- or 64-row tiles of x, one CTA per SM (x's rows fill the shared
    // memory: 64 rows of 256 k are 33-37 KB a stage), 256-k stages as at M <= 8, so a
    // row's sums run in the same order for every M. x staged first (xt, dense calls):
    // one copy per row and stage made M = 32 slower than M = 16 by 3.6x
    // (qmm-decode-h100-notes.md, session k).
    // 33..64 rows: 16 consumer warps, each pair of a (row block, parity) sharing the
    // row tiles: with 8 warps (2 per scheduler) the kernel waited on its own latencies
    // (ncu: 30 % issue slots busy); 28672 x 4096 nvfp4 M = 64 104 -> 90 us, 4096^2 32 ->
    // 21, 16384^2 126 -> 136 (each FB is decoded twice). At 17..32 rows 8 warps win.
    // On sm_90a (wg) wgmma reads x from shared memory instead (WG, see wg_mma), with the
    // same stages and CTAs per SM: one warpgroup per FB parity at 17..32 rows. Against
    // mma.sync, H200, CUDA graphs: 4096^2 nvfp4 M = 64 20.1 -> 18.7 us, 28672 x 4096 90.7 ->
    // 86.6, 16384^2 138.5 -> 132.4; M = 32 from 1 % slower to 8 % faster (session ai).
    // At 33..64 rows one warpgroup per parity too (8 consumer warps, m64n64k16: each FB
    // decoded once) where a CTA has at least 16 stages; two (16 warps, 32 of the rows each,
    // each FB decoded twice) below that, where the 8 warps' longer stage is not amortized.
    // H200, graphs, M = 64, 16 -> 8 warps: nvfp4 16384^2 124.7 -> 94.8 us, 28672 x 4096 80.3
    // -> 71.5, 4096 x 14336 34.6 -> 30.1, but 4096^2 (8 stages a CTA) 17.2 -> 17.9; mxfp8
    // 135.4 -> 108.9, 86.2 -> 78.7, 37.2 -> 33.2, 17.9 -> 18.8; affine 4-bit 136.1 -> 118.8,
    // 86.9 -> 86.0, 37.1 -> 35.5, 18.1 -> 19.9 (session au; session ai's 1.5x loss of this
    // form was its unrolled epilogue, since rolled). The sums are the same bits either way.
    constexpr int S64 = dec_bits8(FM) ? 3 : 4;  // 33..64 rows: the stages that fit beside x's rows
    if (wg && xt) {
      // 33..64 rows: two tiles a CTA (qmmp_body's NT) where K is not split, a CTA has 16
      // stages or more and the pairs still fill 90 % of the SMs; fp codes only (affine's
      // per-FB sums take 168 registers a thread, and two tiles' 17 warps leave 96). Against
      // one tile a CTA (the form below), H200, CUDA graphs, M = 64: 16384^2 nvfp4 / mxfp4 98.6 ->
      // 79.2 us, mxfp8 105.2 -> 87.5; 28672 x 4096 nvfp4 72.9 -> 55.3, mxfp8 77.0 -> 58.7;
      // M = 33 -18 to -23 %. At 17..32 rows (m64n32, 6 or 4 stages) it was mixed: 16384^2
      // -2 % (fp4) / -6 % (mxfp8), 28672 x 4096 +4-6 %, so those keep two CTAs an SM
      // (qmm-decode-h100-notes.md, session bc)
      if constexpr (!dec_affine(FM))
        if (M > 32 && ks == 1 && nk >= 16 && tiles % 2 == 0 && ctas * 5 >= (int64_t)sms * 9) {
          r = launch<FM, 8, S64, 1, 1, 1, GR, true, false, 2>(p, tiles, ks, st, xt);
          if (r != kRefused) return r;
        }
      if (M > 32)
        return nk >= 16 * ks ? launch<FM, 8, S64, 1, 1, 1, GR, true>(p, tiles, ks, st, xt)
                             : launch<FM, 8, S64, 1, 1, 2, GR, true>(p, tiles, ks, st, xt);
      r = ctas * ks > sms ? launch<FM, 4, dec_bits8(FM) ? 2 : 3, 1, 2, 1, GR, true>(p, tiles, ks, st, xt) : kRefused;
      if (r == kRefused) r = launch<FM, 4, 4, 1, 1, 1, GR, true>(p, tiles, ks, st, xt);
      return r;
    }
    if (M > 32) return launch<FM, 8, S64, 1, 1, 2, GR>(p, tiles, ks, st, xt);
    // 17..32 rows: two CTAs per SM (3 stages, 8-bit 2) where the CTAs are more than one
    // wave at one per SM (16384^2 nvfp4 M = 32 82.5 -> 72.6 us, 6144 x 4096 29.0 -> 19.4,
    // 28672 x 4096 60.4 -> 46.0); with fewer CTAs two per SM leave SMs idle (4096 x 14336
    // 26.2 -> 37.2), so one, 4 stages deep, unless its shared memory is over the device's
    // limit (99 KB on compute capability 12.x: only the two-per-SM one fits; 33..64 rows
    // fit nowhere there and take the packed weight).
    r = ctas * ks > sms ? launch<FM, 4, dec_bits8(FM) ? 2 : 3, 1, 2, 1, GR>(p, tiles, ks, st, xt) : kRefused;
    if (r == kRefused) r = launch<FM, 4, 4, 1, 1, 1, GR>(p, tiles, ks, st, xt);
    if (r == kRefused) r = launch<FM, 4, dec_bits8(FM) ? 2 : 3, 1, 2, 1, GR>(p, tiles, ks, st, xt);
    return r;
  }
  }
  // 512-k stages (KC = 2) where each rank's 256-k chunks pair up; four CTAs an SM (M <= 8)
  // past one wave of two (K split: past one and a half)
  // (a stage of KC chunks: every rank's share of the nk chunks whole stages, nk % (KC * ks)
  // == 0, so that the split point is the same for every KC and M, and with it the bits)
  const bool kc2 = nk % (2 * ks) == 0;
  // 1024-k stages (KC = 4) where K is split and each rank's chunks make whole such stages
  const bool kc4 = ks > 1 && nk % (4 * ks) == 0;
  // K split with at most one CTA an SM (the 4096-row weights): where the forms sized for one
  // CTA's use of the shared memory run
  const bool split1 = ks > 1 && ctas * ks <= sms;
  const bool four = ks == 1 ? ctas > 2 * sms : 2 * ctas > 3 * sms;
  if constexpr (dec_bits8(FM)) {
    if (M > 8) {
      // K split at one CTA an SM (the 4096-row weights): 512-k stages, 3 deep (~150 KB), as
      // the 4-bit codes take 1024-k ones there. Graphs, 16 rows, H200: mxfp8 4096 x 14336
      // 34.9 -> 20.8 us, 4096^2 13.0 -> 9.7; decode step at 16 tokens 3208 -> 2865 us.
      // 1024-k stages, 2 deep, on top were no faster (session as). mxfp8 only: affine 8-bit's
      // calls gain too, but its decode step does not (below)
      if constexpr (!GR && FM == kDecFp8)
        if (kc2 && split1) {
          r = launch<FM, 2, 3, 2, 1, 1, GR>(p, tiles, ks, st, xt);
          if (r != kRefused) return r;
        }
      return launch<FM, 2, 3, 1, 2, 1, GR>(p, tiles, ks, st, xt);
    }
    // past one wave of two CTAs per SM (the gate/up weight, 448 tiles on 264 slots): four,
    // 2 stages deep, as the 4-bit codes below; 56 registers for mxfp8, no spills. Decode
    // step, graphed, H200 (same machine): mxfp8 fused M = 1 2455 -> 2304 us, M = 4 2688 ->
    // 2515; affine 8-bit 2636 -> 2545, 2919 -> 2781 (qmm-decode-h100-notes.md, session af)
    // At M <= 2 with K split and at most two CTAs an SM: 512-k stages with two rows of x a
    // stage (X2), 3 deep (mxfp8, 108 KB) or 2 (affine 8-bit: 3 would not fit two an SM).
    // Step, 1 token, graphed, H200, same machine: mxfp8 2236 -> 2195-2196 us, affine 8-bit
    // 2445 -> 2406 (the 4-bit half of that patch was slower and was left out; session aq)
    r = kRefused;
    if constexpr (!GR)
      if (ks > 1 && M <= 2 && kc2 && ctas * ks <= 2 * sms)
        r = launch<FM, 1, FM == kDecFp8 ? 3 : 2, 2, 2, 1, GR, false, true>(p, tiles, ks, st, xt);
    // 3..8 rows with K split at one CTA an SM: 512-k stages, 3 deep (~125 KB). Graphs, H200,
    // 4096 x 14336 at 4 / 8 rows: mxfp8 22.7 / 25.5 -> 18.5 / 18.8 us, affine 8-bit 23.9 /
    // 26.8 -> 20.1 / 22.5 (session as). mxfp8 only: affine 8-bit's decode step at 4 tokens
    // was 40-80 us slower with it in four runs (and 20-30 us at 16 with the form above),
    // although its calls were faster. In the step the next layer's qkv adds ~15 us after down
    // instead of ~10: its CTAs, launched early, find less room beside the larger form
    // (139 KB, 76 registers) and start their weights' loads later (session at,
    // profile_decode_step.py)
    if constexpr (!GR && FM == kDecFp8)
      if (r == kRefused && kc2 && split1) r = launch<FM, 1, 3, 2, 1, 1, GR>(p, tiles, ks, st, xt);
    if (r == kRefused) r = four ? launch<FM, 1, 2, 1, 4, 1, GR>(p, tiles, ks, st, xt) : kRefused;
    if (r == kRefused) r = ks == 1 ? launch<FM, 1, FM == kDecFp8 ? 5 : 4, 1, 2, 1, GR>(p, tiles, ks, st, xt) : kRefused;
    if (r == kRefused) r = launch<FM, 1, 3, 1, 3, 1, GR>(p, tiles, ks, st, xt);
  } else if (M > 8) {
    // four CTAs per SM past a wave of two, as at M <= 8 below (2 stages: 16 rows of x make
    // a stage 17 KB, and three would not fit four CTAs in 228 KB); staged x only (dense
    // calls and grouped items): gather_qmm's per-entry 9..16-row calls take the
    // configurations below (those split over K reach the 1024-k one:
    // test_gpu_gather_long_k_split)
    r = kRefused;
    r = ks == 1 && xt && ctas > 2 * sms ? launch<FM, 2, 2, 1, 4, 1, GR>(p, tiles, ks, st, xt) : kRefused;
    // K split at one CTA an SM (the 4096-row weights): 1024-k stages, 2 deep (~145 KB), as
    // at M <= 8 below. H200, graphs, 16 rows (session ar): nvfp4 4096 x 14336 25.0 -> 17.1
    // us, 4096^2 10.3 -> 8.9; mxfp4 the same; affine 4-bit 27.6 -> 24.3, 12.5 -> 11.5
    if constexpr (!GR)
      if (r == kRefused && kc4 && split1)
        r = launch<FM, 2, 2, 4, 1, 1, GR>(p, tiles, ks, st, xt);
    if (r == kRefused) r = kc2 ? launch<FM, 2, 3, 2, 2, 1, GR>(p, tiles, ks, st, xt) : kRefused;
    if (r == kRefused) r = launch<FM, 2, 4, 1, 2, 1, GR>(p, tiles, ks, st, xt);
  } else {
    // 4-bit codes past one wave of two CTAs per SM (28672 x 4096: 448 tiles on 264 slots):
    // four per SM (3 stages of 13 KB), so that every tile is resident at once and no SM is
    // left with one CTA's decode throughput in a second wave. fp4 fits 56 registers; affine
    // (a tenth warp) gets 48 and spills 16 bytes, and still gains as much (H100 A/B, CUDA
    // graphs, 28672 x 4096 M = 1: nvfp4 32.8 -> 27.8 us, affine 4-bit 35.3 -> 28.4;
    // qmm-decode-h100-notes.md, session l).
    // Two and one CTA an SM: stages of 512 k (KC = 2) where K allows, the same ring bytes in
    // half the stages: a stage's fixed instructions (barrier wait and arrive, the slot's
    // address, the loop) count once for four fragment blocks a warp, not two (sm_90a, M = 1:
    // 342 instructions a 512-k stage against 2 x 181). The FBs and their order are the same.
    // At M <= 2 (kernel rows), four CTAs an SM take 512-k stages too, 2 deep, with two rows of
    // x a stage (X2).
    r = kRefused;
    if constexpr (!GR)
      if (four && M <= 2 && kc2) r = launch<FM, 1, 2, 2, 4, 1, GR, false, true>(p, tiles, ks, st, xt);
    if (r == kRefused) r = four ? launch<FM, 1, 3, 1, 4, 1, GR>(p, tiles, ks, st, xt) : kRefused;
    if (r == kRefused) r = ks == 1 && kc2 ? launch<FM, 1, 4, 2, 2, 1, GR>(p, tiles, ks, st, xt) : kRefused;
    if (r == kRefused) r = ks == 1 ? launch<FM, 1, 8, 1, 2, 1, GR>(p, tiles, ks, st, xt) : kRefused;
    // K split with at most two CTAs an SM (the 4096-row weights): stages of 1024 k (KC = 4)
    // where each rank's chunks make whole stages, 2 deep (~108 KB): a warp's stage is one
    // dependent chain from its barrier wait to its arrive, and 8 fragment blocks a warp in
    // it instead of 4 give that chain twice the independent work (KC = 2 over KC = 1 gained
    // 9-11 % at these shapes, more than its instructions saved; session ap). Measured on an
    // H200 (session ar): affine 4-bit 4096 x 14336 at M = 1 16.6 -> 15.4 us, every 4-bit code
    // at M = 8 2-4 % faster there, nvfp4 / mxfp4 at M = 1 unchanged
    // fp4 takes it only at one CTA an SM (o, down): where the CTAs are more (qkv, 192 on 132
    // SMs) the 1024-k form's 108 KB leave room beside a CTA for one of the next matmul's (o,
    // the same form) and the rest start late; with qkv in the 512-k form below (56 KB, three
    // an SM) the decode step at one token went 1709 -> 1659 us for nvfp4 (affine 4-bit
    // 1598 -> 1695: it keeps this form; session at, profile_decode_step.py)
    if constexpr (!GR)
      if (r == kRefused && kc4 && ctas * ks <= 2 * sms && (split1 || FM != kDecFp4))
        r = launch<FM, 1, 2, 4, 2, 1, GR>(p, tiles, ks, st, xt);
    if (r == kRefused) r = kc2 ? launch<FM, 1, 2, 2, 3, 1, GR>(p, tiles, ks, st, xt) : kRefused;
    if (r == kRefused) r = launch<FM, 1, 4, 1, 3, 1, GR>(p, tiles, ks, st, xt);
  }
  return r;
}

// dispatch<FM, GR> for the layout's format `fmt`.
template <bool GR>
qqStatus_t dispatch_fmt(int fmt, const QP& p, int tiles, int ks, int nk, int sms, bool wg, cudaStream_t st,
                        Scratch* xt) {
  switch (fmt) {
    case kDecFp4: return dispatch<kDecFp4, GR>(p, tiles, ks, nk, sms, wg, st, xt);
    case kDecFp8: return dispatch<kDecFp8, GR>(p, tiles, ks, nk, sms, wg, st, xt);
    case kDecAff4: return dispatch<kDecAff4, GR>(p, tiles, ks, nk, sms, wg, st, xt);
    default: return dispatch<kDecAff8, GR>(p, tiles, ks, nk, sms, wg, st, xt);
  }
}

}  // namespace

qqStatus_t to_decode_layout(qqHandle_t h, const DecodeLayoutArgs& a, void* stream) {
  if (a.E > 65535)  // one grid row per expert (and the decode kernels take as many)
    return set_error(QQ_STATUS_NOT_SUPPORTED, "to_decode_layout: %lld experts; the GPU conversion takes at most "
                     "65535 (convert them in parts, or on the CPU)", (long long)a.E);
  return on_device(a.w.device, [&]() -> qqStatus_t {
    QQ_TRY(refuse_if_captured("to_decode_layout", stream,
                              "the one-time conversion waits on the host for its check that every scale fits"));
    qqContext* c = nullptr;
    QQ_TRY(resolve_handle("to_decode_layout", h, a.w.device, &c));
    const cudaStream_t st = (cudaStream_t)stream;
    Scratch scratch(c, st);
    int* bad = nullptr;
    QQ_TRY(scratch.get("to_decode_layout", sizeof(int), &bad));
    const int64_t bytes = a.E * decode_expert_bytes(a);
    QQ_CUDA_TRY(cudaMemsetAsync(a.out, 0, (size_t)bytes, st), "to_decode_layout");
    QQ_CUDA_TRY(cudaMemsetAsync(bad, 0, sizeof(int), st), "to_decode_layout");
    const int64_t slots = decode_slots(a);
    if (slots && a.E) to_decode_kernel<<<dim3((unsigned)((slots + 255) / 256), (unsigned)a.E), 256, 0, st>>>(a, slots, bad);
    QQ_TRY(check_launch("to_decode_layout"));
    int hbad = 0;
    // The one host wait of this one-time conversion: whether every scale fitted.
    QQ_TRY(wait_on_host("to_decode_layout", stream, &hbad, bad, sizeof(int)));
    if (hbad)
      return set_error(QQ_STATUS_NOT_SUPPORTED, "to_decode_layout: w cannot be encoded in the decode layout (%s); "
                       "keep the packed weight (docs/formats.md, Decode layout)", decode_unencodable(a.q));
    return QQ_STATUS_SUCCESS;
  });
}

// The most scratch a grouped gather's staged x may take (decode_matmul).
constexpr int64_t kGxStageMax = 64ll << 20;

qqStatus_t decode_matmul(qqHandle_t h, const DecodeMatmulArgs& a, void* stream) {
  const char* op = "decode_matmul";
  if (a.M == 0 || a.N == 0 || a.B == 0) return QQ_STATUS_SUCCESS;
  return on_device(a.x.device, [&]() -> qqStatus_t {
    int cc_major = 0;  // a host-side attribute read (no driver round trip)
    QQ_CUDA_TRY(cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, a.x.device), op);
    if (cc_major < 9)
      return set_error(QQ_STATUS_NOT_SUPPORTED, "%s: the decode layout's kernel needs compute capability 9.0 or "
                       "newer (bulk copies); use the packed weight on this GPU", op);
    // float16 x runs as twice the rows of bf16 (high parts and remainders), dense calls only
    const bool x16 = a.x.dt == DType::F16;
    const bool dense = !a.gidx.ptr;  // (B is 1)
    if (!(a.x.dt == DType::BF16 && a.M <= kDecMaxM) && !(x16 && dense && 2 * a.M <= kDecMaxM))
      return set_error(QQ_STATUS_NOT_SUPPORTED, "%s: the decode layout's GPU kernel takes bfloat16 x of at most "
                       "%d rows, or float16 x of at most %d (not per gather_qmm entry); got %s x of %lld rows; use "
                       "the packed weight", op, kDecMaxM, kDecMaxM / 2,
                       a.x.dt == DType::BF16 ? "bfloat16" : (x16 ? "float16" : "float32"), (long long)a.M);
    bool xb_aligned = true;  // every batch entry of x starts 16-byte aligned (gather)
    for (int i = 0; i < a.x.nb; ++i) xb_aligned = xb_aligned && (a.x.bstride[i] & 7) == 0;
    if (a.B > 65535 || a.E > 65535)
      return set_error(QQ_STATUS_NOT_SUPPORTED, "%s: the decode layout's GPU kernel takes at most 65535 batch "
                       "entries and experts; got %lld and %lld; use the packed weight", op, (long long)a.B,
                       (long long)a.E);
    if (((uintptr_t)a.x.ptr & 15) || (a.x.ld & 7) || ((uintptr_t)a.w & 15) || !xb_aligned)
      return set_error(QQ_STATUS_NOT_SUPPORTED, "%s: the decode layout's GPU kernel reads x's rows and w_decode with "
                       "16-byte bulk copies: x's start, its row stride (%lld elements) and w_decode's start must be "
                       "multiples of 16 bytes; use the packed weight or aligned buffers", op, (long long)a.x.ld);
    // SwiGLU past 16 kernel rows: the gated product into scratch, then qq's swiglu kernel.
    // The same bits (the fused epilogue rounds each product value to out's dtype first, as
    // the product written out is), but there the epilogue's pairing pass (the up rows' values
    // through shared memory, a named barrier of the summing warps) cost more than the
    // product's round trip through memory. H200, CUDA graphs, Llama-3-8B's gate/up [28672,
    // 4096] + down [4096, 14336] pair, us, fused / two kernels on the gated layout: M = 16
    // nvfp4 49.8 / 51.1, mxfp8 64.4 / 64.4, affine 4-bit 49.9 / 50.7 (fused kept); M = 32
    // 67.3 / 65.1, 75.0 / 72.6, 72.2 / 70.3; M = 64 93.3 / 86.7, 98.6 / 91.6, 136.4 / 121.1
    // (bench/tune/gated64_probe.py; qmm-decode-h100-notes.md, session be).
    if (a.swiglu && dense && (x16 ? 2 * a.M : a.M) > 16) {
      qqContext* c = nullptr;
      QQ_TRY(resolve_handle(op, h, a.x.device, &c));
      Scratch scratch(c, (cudaStream_t)stream);
      DecodeMatmulArgs b = a;
      b.swiglu = false;
      b.out.cols = b.out.ld = a.N;  // [M, 2F] in the weight's row order (gate, then up)
      QQ_TRY(scratch.get(op, (size_t)(a.M * a.N) * dtype_size(a.out.dt), &b.out.ptr));
      QQ_TRY(decode_matmul(h, b, stream));
      QQ_TRY(swiglu(h, b.out, a.out, stream));
      return routed(QQ_STATUS_SUCCESS, QQ_ROUTE_DECODE);
    }
    QP p{};
    p.w = a.w;
    p.x = reinterpret_cast<const __nv_bfloat16*>(a.x.ptr);
    p.xld = a.x.ld;
    p.Mo = (int)a.M, p.N = (int)a.N, p.K = (int)a.K;
    p.x16 = x16;
    p.M = x16 ? 2 * p.Mo : p.Mo;  // the kernel's rows
    p.gs = a.gs;
    p.bias = a.bias;
    p.out = a.out;
    p.gated = (int)a.gated;
    p.swiglu = a.swiglu;
    p.mul0 = 65u << 6, p.mul1 = 65u << 2;
    p.xb = a.x;
    p.gidx = a.gidx;
    const int fmt = decode_fmt(a.q);
    p.wper = decode_layout_bytes(a.N, a.K, fmt);
    p.E = (int)a.E;
    p.B = (int)a.B;
    p.zest = p.B;
    const int tiles = (int)(roundup(a.N, kDecTileRows) / kDecTileRows);
    const int sms = sm_count(a.x.device), target = sms * 3 / 2;
    const cudaStream_t st = (cudaStream_t)stream;
    qqContext* c = nullptr;
    QQ_TRY(resolve_handle(op, h, a.x.device, &c));
    Scratch scratch(c, st);
    // gather_qmm whose entries likely share experts: grouped by expert first (the plan,
    // one small kernel), so that each touched expert's layout is read once, by work items
    // of up to 8, 16 or (fp formats) 24 or 32 rows (the rows an expert is expected to get, B * M
    // over at most min(B, E) experts); the grid covers the most items the plan can make and
    // the items past its count exit at once. Likely sharing: the expected number of distinct
    // experts of B uniform picks, E (1 - (1 - 1/E)^B), is below 0.9 B (DeepSeek-like E = 256:
    // from 56 entries, 7 tokens of top-8; Mixtral-like E = 8: from 3 entries). Not where the
    // items could pass the grid's 65535 (per entry then).
    // The items' rows of x are staged first (gx_stage_kernel: one bulk copy of x a stage
    // instead of one a row, and affine's sums of x made there instead of by every CTA's x-sum
    // warp) for affine, and for the fp formats' items of 16 rows and more. H200, us a call, two
    // rounds (bench/tune/gather_ab.py, session av): Mixtral-like 64 tokens (16 rows an expert
    // on average, up to ~30, so an expert read by two 16-row items) nvfp4 174 -> 153 with
    // 16-row items staged -> 148 with 32-row items, mxfp8 214 -> 195 -> 173, affine 4-bit 198
    // -> 140 (32-row items 166: affine keeps 16); DeepSeek-like 16 / 64 tokens (8-row items)
    // affine 4-bit down 295 / 645 -> 261 / 564, up 231 / 482 -> 220 / 464. The fp formats'
    // 8-row items were up to 5 % slower staged (DeepSeek-up 64 tokens nvfp4 479 -> 497, mxfp8
    // 764 -> 799): their rows are copied one by one, as before. (Affine 8-bit follows affine
    // 4-bit; not measured.) The staged rows have a slot of R rows an item, so that the plan's
    // slack (up to an item an expert) can make the buffer several times x's size: staging is
    // left out where it would pass kGxStageMax bytes (24- and 32-row items need it: 16 then).
    // The fp formats' items have 24 rows where an expert expects 13..20 (Mixtral-like 64
    // tokens: more than 24 rows in an expert ~1-2 % of the time): mxfp8 167 -> 145 us, nvfp4
    // 151-158 -> 138-146 against 32-row items (H200, two rounds, session aw).
    const double distinct = a.E * (1.0 - std::pow(1.0 - 1.0 / (double)a.E, (double)a.B));
    const int64_t spread = a.B < a.E ? a.B : a.E, per_expert = (a.B * a.M + spread - 1) / spread;
    const auto gx_bytes = [&](int r) {  // at most: a row and 256 k at the widest pitch (8-bit's), the sums
      return gather_plan_max_items(a.B, a.M, a.E, r) * r * (a.K / kDecChunkK) *
             (512 + dec_xpad(kDecFp8) + 4 * dec_fbs(fmt));
    };
    int R = 8;  // rows per work item
    if (per_expert > 6) R = 16;
    if (!dec_affine(fmt) && per_expert > 12) R = per_expert > 20 ? 32 : 24;
    if (R > 16 && gx_bytes(R) > kGxStageMax) R = 16;
    const int64_t most = gather_plan_max_items(a.B, a.M, a.E, R);
    const bool grouped = !dense && !x16 && a.M <= 16 && a.E <= kPlanMaxE && most <= 65535 &&
                         distinct < 0.9 * (double)a.B;
    bool gstage = false;  // grouped items' x staged (below)
    if (grouped) {
      QQ_TRY(gather_plan(a.gidx, a.B, a.M, (int)a.E, R, scratch, st, op, &p.plan));
      const int64_t est = a.B * a.M / R > spread ? a.B * a.M / R : spread;
      p.M = R;  // the configuration's rows; each item has its own count
      p.B = (int)most;
      p.zest = (int)(est < most ? est : most);
      gstage = (dec_affine(fmt) || R > 8) && gx_bytes(R) <= kGxStageMax;
    }
    // A cluster of 2 where the CTAs without a split (row tiles x batch entries) leave
    // SMs idle: larger clusters were slower at every decode shape (a rank waits for its
    // cluster before it exits). Counting the entries matters for gather_qmm: one
    // DeepSeek-like token (8 entries of 2048 x 7168) is 256 CTAs, a wave at two per SM;
    // split, 512 CTAs at three per SM were 1.3 waves. The split point is in 256-k chunks
    // and does not depend on M, so a row's sums run in the same order for every M (they
    // may differ with N, K and the number of entries).
    const int nk = (int)(a.K / kDecChunkK);
    // Per-entry gather_qmm whose CTAs fill 1.5 to 2 an SM unsplit (one DeepSeek-like token:
    // 8 entries x 32 tiles = 256 CTAs at two an SM, 28 stages each, 0.48 of copy on an H200):
    // split too, into one wave of four CTAs an SM (dispatch). H200, three rounds in two
    // sessions: nvfp4 deepseek-up one token 32.6-32.9 -> 29.8-29.9 us, affine 4-bit 32.7 ->
    // 31.7, every other case within 1 % (gather_qmm-h200-notes.md, session al).
    const int64_t unsplit = (int64_t)tiles * p.zest;
    const bool wave4 = !dense && !grouped && unsplit >= target && unsplit <= 2 * (int64_t)sms;
    const int ks = (unsplit < target || wave4) && nk >= 2 ? 2 : 1;
    // x staged in scratch first (x_stage_kernel) for 17..64 rows of a dense call, and for
    // 9..16 where the tiles fill the GPU without a K split: one bulk copy of x per stage
    // instead of one per row, and affine's sums of x made there (16384^2 M = 16: nvfp4
    // 63.5 -> 59.7 us, affine 4-bit 70.1 -> 60.4). The extra kernel's latency lost ~3 us
    // at the K-split shapes (4096^2 nvfp4 M = 16 11.7 -> 14.8), which copy row by row.
    // float16 x is always staged: the staging kernel splits it into bf16 rows.
    // Affine's 9..16 rows are staged where K is split too: the staging kernel makes the sums
    // of x once instead of every CTA's x-sum warp. H200, 32-layer Llama-8B-shaped decode step
    // at M = 16 (profile_decode_step.py, session aw): affine 4-bit 2741 -> 2523 us, 8-bit 3674
    // -> 3540; staged only where K >= 8192 (the down projection), 8-bit was 3644 (the next
    // layer's unstaged qkv kernel then overlapped the staged down kernel less). Per call in
    // a CUDA graph, 4096 x 14336 M = 12 / 16 affine 4-bit 22.0 / 24.6 -> 19.0 / 18.4 us; at
    // K = 4096 from -7 % to +7 % (M = 12 slower; the step at M = 12 not measured). The fp
    // formats staged so were slower at every K-split shape (4096^2 nvfp4 M = 16 8.9 -> 11.1).
    // Affine 8-bit only from 13 rows: the same step at M = 9 / 12 (session ax, two rounds)
    // was 3307 / 3441 us unstaged and 3392-3398 / 3491-3495 staged (4-bit: 2508 / 2630
    // unstaged, 2462-2465 / 2516-2521 staged).
    const bool aff_split = fmt == kDecAff4 || (fmt == kDecAff8 && p.M > 12);
    const bool stage = (dense && nk > 0 && (x16 || p.M > 16 || (p.M > 8 && (ks == 1 || aff_split)))) ||
                       (gstage && nk > 0);
    Scratch* xt = stage ? &scratch : nullptr;
    // wgmma (the WG configurations) on compute capability 9.x, whose code is sm_90a
    // (launch() refuses code older than sm_90)
    const bool wg = cc_major == 9;
    const qqStatus_t r = grouped ? dispatch_fmt<true>(fmt, p, tiles, ks, nk, sms, wg, st, xt)
                                 : dispatch_fmt<false>(fmt, p, tiles, ks, nk, sms, wg, st, xt);
    if (r == kRefused)
      return set_error(QQ_STATUS_NOT_SUPPORTED, "%s: the decode layout's kernel cannot run on this GPU (compute "
                       "capability %d.x: no sm_90a / sm_100a / sm_120a code for it in this build, or too little "
                       "shared memory); use the packed weight", op, cc_major);
    return routed(r, QQ_ROUTE_DECODE);
  });
}

}  // namespace cuda
}  // namespace qq
