// cuda/grouped_gemm_sm90.cu - the grouped bf16 GEMMs of the MoE operations'
// exact path on Hopper: one launch over every expert, group sizes read on the
// device (grouped_gemm.h has the two forms):
//
//   grouped_qqmm:       D[rows of e, N] = alpha_e * A[rows of e, K] @ B[e]^T
//   grouped_qqmm_wgrad: D[e] [K, N] = alpha * A[:, tokens of e] @ B[:, tokens of e]^T
//
// bf16 operands, fp32 accumulation, bf16 or fp32 D. The GEMM is CUTLASS's sm90
// ptr-array grouped kernel (TMA + warp-specialized wgmma, persistent, problem
// shapes read on the device:
// cutlass/gemm/kernel/sm90_gemm_array_tma_warpspecialized_cooperative.hpp),
// from the nvidia-cutlass wheel's headers - the kernel torch's _grouped_mm
// builds on, so the GEMM itself runs at the speed of the bf16 peer. What is
// ours: one small kernel that turns the int32 group ends into the per-group
// shapes, pointers and strides CUTLASS reads, and checks them on the way.
//
// Why a separate translation unit: CUTLASS's sm90 kernels need sm_90a and take
// ~45 s of nvcc per instantiation (three here: bf16 and fp32 D, and bf16 D with
// B stored transposed for grouped_qqmm's dgrad), so this file is
// compiled for sm_90a alone
// (CMakeLists.txt, QQ_HAVE_GROUPED_SM90) and talks to the rest of libqq through
// grouped_gemm.h's plain types. It contains no libqq headers beyond that one.
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include <algorithm>
#include <type_traits>

#include <cute/tensor.hpp>
#include <cutlass/cutlass.h>
#include <cutlass/epilogue/collective/collective_builder.hpp>
#include <cutlass/gemm/collective/collective_builder.hpp>
#include <cutlass/gemm/device/gemm_universal_adapter.h>
#include <cutlass/gemm/group_array_problem_shape.hpp>
#include <cutlass/gemm/kernel/gemm_universal.hpp>

#include "grouped_gemm.h"

namespace qq {
namespace cuda {
namespace {

using namespace cute;

using Elem = cutlass::bfloat16_t;
using ProblemShape = cutlass::gemm::GroupProblemShape<Shape<int, int, int>>;  // (M, N, K) per group
// CUTLASS's M runs along A's rows (tokens for grouped_qqmm, K for wgrad), B is
// the column-major K x N operand (our [N, K] rows), D row-major. The tile and
// cluster of the large bf16 grouped problems of MoE training (the choice torch
// makes for them too); TMA needs 16-byte rows (grouped_qqmm checks).
// B stored transposed ([K, N] rows: g.b_trans) is CUTLASS's row-major B: the
// dgrad of a MoE layer multiplies by the experts' [N, K] values as they are, so
// its caller need not write a transposed copy of every expert each step.
using LayoutA = cutlass::layout::RowMajor;
using LayoutD = cutlass::layout::RowMajor;
constexpr int kAlignAB = 8;
using TileShape = Shape<_128, _256, _64>;
using ClusterShape = Shape<_2, _1, _1>;

template <typename ElemD, typename LayoutB = cutlass::layout::ColumnMajor>
struct Grouped {
  static constexpr int kAlignD = 16 / sizeof(ElemD);
  using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
      cutlass::epilogue::collective::EpilogueTileAuto, float, float,
      void, LayoutD*, kAlignD,  // no C: D = alpha * acc
      ElemD, LayoutD*, kAlignD, cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative,
      cutlass::epilogue::fusion::LinearCombination<ElemD, float>>::CollectiveOp;
  using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
      cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Elem, LayoutA*, kAlignAB, Elem, LayoutB*, kAlignAB,
      float, TileShape, ClusterShape,
      cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
      cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative>::CollectiveOp;
  using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, Mainloop, Epilogue>;
  using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;
};

using Gbf16 = Grouped<Elem>;
using Gf32 = Grouped<float>;
using Gbf16T = Grouped<Elem, cutlass::layout::RowMajor>;  // B stored [K, N] (b_trans)
using StrideA = typename Gbf16::Kernel::InternalStrideA;
using StrideB = typename Gbf16::Kernel::InternalStrideB;
using StrideBT = typename Gbf16T::Kernel::InternalStrideB;
using StrideD = typename Gbf16::Kernel::InternalStrideD;
using Shape3 = typename ProblemShape::UnderlyingProblemShape;
// Each operand is rows of contiguous elements: stride (row pitch, 1, 0) over
// (rows, K or N, group). The kernels' stride types must be exactly that.
static_assert(std::is_same_v<StrideA, Stride<int64_t, _1, _0>>, "A: (pitch, 1, 0)");
static_assert(std::is_same_v<StrideB, Stride<int64_t, _1, _0>>, "B: (pitch, 1, 0)");
static_assert(std::is_same_v<StrideD, Stride<int64_t, _1, _0>>, "D: (pitch, 1, 0)");
static_assert(std::is_same_v<StrideD, typename Gf32::Kernel::InternalStrideD>, "fp32 D: (pitch, 1, 0)");
// B stored [K, N]: stride (1, pitch, 0) over (N, K, group), in the same 8 bytes
static_assert(std::is_same_v<StrideBT, Stride<_1, int64_t, _0>>, "transposed B: (1, pitch, 0)");
static_assert(sizeof(StrideBT) == sizeof(StrideB), "one array serves both B strides");
static_assert(std::is_same_v<StrideA, typename Gbf16T::Kernel::InternalStrideA> &&
              std::is_same_v<StrideD, typename Gbf16T::Kernel::InternalStrideD>, "A, D as in Gbf16");

// The per-group arrays CUTLASS reads, carved from one scratch buffer.
struct Arrays {
  Shape3* shapes;
  const Elem** a;
  const Elem** b;
  void** d;
  StrideA* sa;
  StrideB* sb;
  StrideD* sd;
};

size_t align_up(size_t v) { return (v + 255) & ~size_t(255); }

size_t arrays_bytes(int E) {
  return align_up(E * sizeof(Shape3)) + 3 * align_up(E * sizeof(void*)) + align_up(E * sizeof(StrideA)) +
         align_up(E * sizeof(StrideB)) + align_up(E * sizeof(StrideD));
}

Arrays carve(void* base, int E) {
  char* p = static_cast<char*>(base);
  Arrays r;
  r.shapes = reinterpret_cast<Shape3*>(p), p += align_up(E * sizeof(Shape3));
  r.a = reinterpret_cast<const Elem**>(p), p += align_up(E * sizeof(void*));
  r.b = reinterpret_cast<const Elem**>(p), p += align_up(E * sizeof(void*));
  r.d = reinterpret_cast<void**>(p), p += align_up(E * sizeof(void*));
  r.sa = reinterpret_cast<StrideA*>(p), p += align_up(E * sizeof(StrideA));
  r.sb = reinterpret_cast<StrideB*>(p), p += align_up(E * sizeof(StrideB));
  r.sd = reinterpret_cast<StrideD*>(p);
  return r;
}

template <typename S>
__device__ S row_stride(int64_t pitch) {
  S s{};
  get<0>(s) = pitch;
  return s;
}
__device__ StrideBT trans_stride(int64_t pitch) {
  StrideBT s{};
  get<1>(s) = pitch;
  return s;
}

constexpr int kPrepThreads = 256;

__device__ void fill(void* D, bool f32, int64_t rows, int64_t cols, int64_t ld, uint32_t f32_bits,
                     uint16_t bf16_bits, int64_t first, int64_t step) {
  const int64_t total = rows * cols;
  for (int64_t i = first; i < total; i += step) {
    const int64_t r = i / cols, c = i - r * cols;
    if (f32) static_cast<uint32_t*>(D)[r * ld + c] = f32_bits;
    else static_cast<uint16_t*>(D)[r * ld + c] = bf16_bits;
  }
}

// The group ends of experts e0 .. e0+E-1 -> CUTLASS's per-group arrays
// (block 0). Every block checks all E_all ends (int32 reads, cheap); ends that
// are not non-decreasing within [0, T] with the last equal to T leave every
// group empty and fill D with NaN (all blocks), so a bad routing shows in the
// result instead of an out-of-bounds read (the host cannot check them without
// waiting for the stream). kSplitReduction: the blocks also write zeros into
// the D of each empty expert (no GEMM tile covers it).
__global__ void __launch_bounds__(kPrepThreads) prep_kernel(GroupedGemmSm90 g, Arrays r) {
  __shared__ int bad_s;
  if (threadIdx.x == 0) bad_s = 0;
  __syncthreads();
  int bad = 0;
  for (int e = threadIdx.x; e < g.E_all; e += kPrepThreads) bad |= group_end_bad(g.ends, e, g.E_all, g.T);
  if (bad) atomicOr(&bad_s, 1);
  __syncthreads();
  bad = bad_s;
  const bool rows = g.split == kSplitRows;
  if (blockIdx.x == 0) {
    for (int i = threadIdx.x; i < g.E; i += kPrepThreads) {
      const int e = g.e0 + i;
      const int64_t start = e ? g.ends[e - 1] : 0;
      const int n_e = bad ? 0 : (int)(g.ends[e] - start);
      if (rows) {
        const int64_t row = bad ? 0 : start;
        r.shapes[i] = make_shape(n_e, (int)g.N, (int)g.K);
        r.a[i] = static_cast<const Elem*>(g.A) + row * g.lda;
        r.b[i] = static_cast<const Elem*>(g.B) + i * g.b_stride;
        r.d[i] = static_cast<char*>(g.D) + row * g.ldd * (g.d_f32 ? 4 : 2);
      } else {
        const int64_t col = bad ? 0 : 32 * (int64_t)g.seg_blocks[e];
        const int len = wgrad_span(n_e);
        r.shapes[i] = make_shape(len ? (int)g.K : 0, (int)g.N, len);
        r.a[i] = static_cast<const Elem*>(g.A) + col;
        r.b[i] = static_cast<const Elem*>(g.B) + col;
        r.d[i] = static_cast<char*>(g.D) + e * g.d_stride * (g.d_f32 ? 4 : 2);
      }
      r.sa[i] = row_stride<StrideA>(g.lda);
      if (g.b_trans) reinterpret_cast<StrideBT*>(r.sb)[i] = trans_stride(g.ldb);
      else r.sb[i] = row_stride<StrideB>(g.ldb);
      r.sd[i] = row_stride<StrideD>(g.ldd);
    }
  }
  const int64_t first = (int64_t)blockIdx.x * kPrepThreads + threadIdx.x, step = (int64_t)gridDim.x * kPrepThreads;
  if (bad) {  // NaN everywhere this call writes
    if (rows) fill(g.D, g.d_f32, g.T, g.N, g.ldd, 0x7fc00000u, 0x7fc0, first, step);
    else
      for (int i = 0; i < g.E; ++i)
        fill(static_cast<char*>(g.D) + (int64_t)(g.e0 + i) * g.d_stride * (g.d_f32 ? 4 : 2), g.d_f32, g.K, g.N,
             g.ldd, 0x7fc00000u, 0x7fc0, first, step);
    return;
  }
  if (!rows)
    for (int i = 0; i < g.E; ++i) {
      const int e = g.e0 + i;
      if (g.ends[e] == (e ? g.ends[e - 1] : 0))
        fill(static_cast<char*>(g.D) + (int64_t)e * g.d_stride * (g.d_f32 ? 4 : 2), g.d_f32, g.K, g.N, g.ldd, 0u,
             0, first, step);
    }
}

template <typename G>
typename G::Gemm::Arguments arguments(const GroupedGemmSm90& g, const Arrays& r) {
  using ElemD = typename G::Gemm::ElementD;
  cutlass::KernelHardwareInfo hw;
  hw.device_id = g.device;
  hw.sm_count = g.sm_count;
  typename G::Gemm::Arguments args;
  decltype(args.epilogue.thread) fusion;
  fusion.alpha = 1.0f;
  fusion.beta = 0.0f;
  // one alpha per group (stride 1 over the groups) or one for all (stride 0), or none
  fusion.alpha_ptr = g.alpha ? g.alpha + (int64_t)g.e0 * g.alpha_stride : nullptr;
  fusion.dAlpha = {_0{}, _0{}, g.alpha ? g.alpha_stride : 0};
  args = typename G::Gemm::Arguments{cutlass::gemm::GemmUniversalMode::kGrouped,
                                     {g.E, r.shapes, nullptr},
                                     {r.a, r.sa, r.b, reinterpret_cast<typename G::Kernel::InternalStrideB*>(r.sb)},
                                     {fusion, nullptr, nullptr, reinterpret_cast<ElemD**>(r.d), r.sd},
                                     hw};
  return args;
}

template <typename G>
size_t workspace_bytes(const GroupedGemmSm90& g) {
  Arrays r{};
  return G::Gemm::get_workspace_size(arguments<G>(g, r));
}

template <typename G>
const char* run(const GroupedGemmSm90& g, const Arrays& r, void* workspace, cudaStream_t st) {
  const typename G::Gemm::Arguments args = arguments<G>(g, r);
  typename G::Gemm gemm;
  if (gemm.can_implement(args) != cutlass::Status::kSuccess) return "CUTLASS refused the problem (can_implement)";
  if (gemm.initialize(args, workspace, st) != cutlass::Status::kSuccess) return "CUTLASS initialize failed";
  if (gemm.run(st) != cutlass::Status::kSuccess) return "the CUTLASS grouped GEMM did not launch";
  return nullptr;
}

}  // namespace

bool grouped_gemm_sm90_built() { return true; }

size_t grouped_gemm_sm90_scratch(const GroupedGemmSm90& g) {
  const size_t ws = g.d_f32 ? workspace_bytes<Gf32>(g) : g.b_trans ? workspace_bytes<Gbf16T>(g) : workspace_bytes<Gbf16>(g);
  return arrays_bytes(g.E) + align_up(ws);
}

const char* grouped_gemm_sm90(const GroupedGemmSm90& g, void* scratch, cudaStream_t st) {
  // (refused before any launch: an error leaves the stream as it was)
  if (g.b_trans && (g.d_f32 || g.split != kSplitRows)) return "a transposed B is built for bf16 grouped_qqmm only";
  const Arrays r = carve(scratch, g.E);
  const int64_t outputs = g.split == kSplitRows ? g.T * g.N : (int64_t)g.E * g.K * g.N;
  int blocks = (int)std::min<int64_t>((outputs + kPrepThreads * 16 - 1) / (kPrepThreads * 16), 4 * g.sm_count);
  prep_kernel<<<blocks < 1 ? 1 : blocks, kPrepThreads, 0, st>>>(g, r);
  if (cudaPeekAtLastError() != cudaSuccess) return "the group-shape kernel did not launch";
  void* workspace = static_cast<char*>(scratch) + arrays_bytes(g.E);
  return g.d_f32 ? run<Gf32>(g, r, workspace, st) : g.b_trans ? run<Gbf16T>(g, r, workspace, st)
                                                    : run<Gbf16>(g, r, workspace, st);
}

}  // namespace cuda
}  // namespace qq
