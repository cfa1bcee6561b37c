// cuda/grouped_gemm_sm90.cu - the grouped bf16 GEMM of grouped_qqmm's exact
// path on Hopper: one launch over every expert, group sizes read on the device.
//
//   D[rows of e, N] = alpha_e * A[rows of e, K] @ B[e]^T,   e = 0..E-1,
//   rows of e = [ends[e-1], ends[e]),
//
// A bf16 [T, K], B bf16 [E] x [N, K], D bf16 [T, N], all row-major, fp32
// accumulation. The GEMM is CUTLASS's sm90 ptr-array grouped kernel (TMA +
// warp-specialized wgmma, persistent, problem shapes read on the device:
// cutlass/gemm/kernel/sm90_gemm_array_tma_warpspecialized_cooperative.hpp),
// from the nvidia-cutlass wheel's headers - the kernel torch's _grouped_mm
// builds on, so the GEMM itself runs at the speed of the bf16 peer. What is
// ours: one small kernel that turns the int32 group ends into the per-group
// shapes, pointers and strides CUTLASS reads, and checks them on the way.
//
// Why a separate translation unit: CUTLASS's sm90 kernels need sm_90a and take
// ~40 s of nvcc per instantiation, so this file is compiled for sm_90a alone
// (CMakeLists.txt, QQ_HAVE_GROUPED_SM90) and talks to the rest of libqq through
// grouped_gemm.h's plain types. It contains no libqq headers beyond that one.
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

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
// Tokens are CUTLASS's M (row-major A), the expert's [N, K] weight its
// column-major K x N B, D row-major. The tile and cluster of the large bf16
// grouped problems of MoE training (the choice torch makes for them too);
// TMA needs 16-byte rows, hence alignment 8 (grouped_gemm_sm90_takes).
using LayoutA = cutlass::layout::RowMajor;
using LayoutB = cutlass::layout::ColumnMajor;
using LayoutD = cutlass::layout::RowMajor;
constexpr int kAlign = 8;
using TileShape = Shape<_128, _256, _64>;
using ClusterShape = Shape<_2, _1, _1>;

using Epilogue = typename cutlass::epilogue::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, TileShape, ClusterShape,
    cutlass::epilogue::collective::EpilogueTileAuto, float, float,
    void, LayoutD*, kAlign,  // no C: D = alpha * acc
    Elem, LayoutD*, kAlign, cutlass::epilogue::PtrArrayTmaWarpSpecializedCooperative,
    cutlass::epilogue::fusion::LinearCombination<Elem, float>>::CollectiveOp;

using Mainloop = typename cutlass::gemm::collective::CollectiveBuilder<
    cutlass::arch::Sm90, cutlass::arch::OpClassTensorOp, Elem, LayoutA*, kAlign, Elem, LayoutB*, kAlign, float,
    TileShape, ClusterShape,
    cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename Epilogue::SharedStorage))>,
    cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative>::CollectiveOp;

using Kernel = cutlass::gemm::kernel::GemmUniversal<ProblemShape, Mainloop, Epilogue>;
using Gemm = cutlass::gemm::device::GemmUniversalAdapter<Kernel>;

using StrideA = typename Kernel::InternalStrideA;
using StrideB = typename Kernel::InternalStrideB;
using StrideD = typename Kernel::InternalStrideD;
using Shape3 = typename ProblemShape::UnderlyingProblemShape;

// The per-group arrays CUTLASS reads, carved from one scratch buffer.
struct Arrays {
  Shape3* shapes;
  const Elem** a;
  const Elem** b;
  Elem** d;
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
  r.d = reinterpret_cast<Elem**>(p), p += align_up(E * sizeof(void*));
  r.sa = reinterpret_cast<StrideA*>(p), p += align_up(E * sizeof(StrideA));
  r.sb = reinterpret_cast<StrideB*>(p), p += align_up(E * sizeof(StrideB));
  r.sd = reinterpret_cast<StrideD*>(p);
  return r;
}

// Each operand is rows of contiguous elements: stride (row pitch, 1, 0) over
// (rows, K or N, group). The kernel's stride types must be exactly that.
static_assert(std::is_same_v<StrideA, Stride<int64_t, _1, _0>>, "A: (pitch, 1, 0)");
static_assert(std::is_same_v<StrideB, Stride<int64_t, _1, _0>>, "B: (pitch, 1, 0)");
static_assert(std::is_same_v<StrideD, Stride<int64_t, _1, _0>>, "D: (pitch, 1, 0)");
template <typename S>
__device__ S row_stride(int64_t pitch) {
  S s{};
  get<0>(s) = pitch;
  return s;
}

constexpr int kPrepThreads = 256;

// The group ends of experts e0 .. e0+E-1 -> CUTLASS's per-group arrays
// (block 0). Every block checks all E_all ends (int32 reads, cheap); ends that are not non-decreasing within
// [0, T] with the last equal to T leave every group empty and fill D with NaN,
// so a bad routing shows in the result instead of an out-of-bounds read (the
// host cannot check them without waiting for the stream).
__global__ void __launch_bounds__(kPrepThreads) prep_kernel(GroupedGemmSm90 g, Arrays r) {
  __shared__ int bad_s;
  if (threadIdx.x == 0) bad_s = 0;
  __syncthreads();
  int bad = 0;
  for (int e = threadIdx.x; e < g.E_all; e += kPrepThreads) {
    const int32_t end = g.ends[e], start = e ? g.ends[e - 1] : 0;
    bad |= end < start || end > g.T || (e == g.E_all - 1 && end != g.T);
  }
  if (bad) atomicOr(&bad_s, 1);
  __syncthreads();
  bad = bad_s;
  if (blockIdx.x == 0) {
    for (int i = threadIdx.x; i < g.E; i += kPrepThreads) {
      const int e = g.e0 + i;
      const int64_t start = e ? g.ends[e - 1] : 0;
      const int m = bad ? 0 : (int)(g.ends[e] - start);
      r.shapes[i] = make_shape(m, (int)g.N, (int)g.K);
      const int64_t row = bad ? 0 : start;
      r.a[i] = static_cast<const Elem*>(g.A) + row * g.lda;
      r.b[i] = static_cast<const Elem*>(g.B) + i * g.b_stride;
      r.d[i] = static_cast<Elem*>(g.D) + row * g.ldd;
      r.sa[i] = row_stride<StrideA>(g.lda);
      r.sb[i] = row_stride<StrideB>(g.ldb);
      r.sd[i] = row_stride<StrideD>(g.ldd);
    }
  }
  if (!bad) return;
  const int64_t total = g.T * g.N;
  const uint16_t nan_bits = 0x7fc0;  // bf16 quiet NaN
  for (int64_t i = (int64_t)blockIdx.x * kPrepThreads + threadIdx.x; i < total;
       i += (int64_t)gridDim.x * kPrepThreads) {
    const int64_t row = i / g.N, col = i - row * g.N;
    static_cast<uint16_t*>(g.D)[row * g.ldd + col] = nan_bits;
  }
}

typename Gemm::Arguments arguments(const GroupedGemmSm90& g, const Arrays& r) {
  cutlass::KernelHardwareInfo hw;
  hw.device_id = g.device;
  hw.sm_count = g.sm_count;
  typename Gemm::Arguments args;
  decltype(args.epilogue.thread) fusion;
  fusion.alpha = 1.0f;
  fusion.beta = 0.0f;
  fusion.alpha_ptr = g.alpha ? g.alpha + g.e0 : nullptr;  // one per group (stride 1 over the groups), or none
  fusion.dAlpha = {_0{}, _0{}, g.alpha ? 1 : 0};
  args = typename Gemm::Arguments{cutlass::gemm::GemmUniversalMode::kGrouped,
                                  {g.E, r.shapes, nullptr},
                                  {r.a, r.sa, r.b, r.sb},
                                  {fusion, nullptr, nullptr, r.d, r.sd},
                                  hw};
  return args;
}

}  // namespace

bool grouped_gemm_sm90_built() { return true; }

size_t grouped_gemm_sm90_scratch(const GroupedGemmSm90& g) {
  Arrays r{};
  return arrays_bytes(g.E) + align_up(Gemm::get_workspace_size(arguments(g, r)));
}

const char* grouped_gemm_sm90(const GroupedGemmSm90& g, void* scratch, cudaStream_t st) {
  const Arrays r = carve(scratch, g.E);
  int blocks = (int)((g.T * g.N + kPrepThreads * 16 - 1) / (kPrepThreads * 16));
  blocks = blocks < 1 ? 1 : (blocks > 4 * g.sm_count ? 4 * g.sm_count : blocks);
  prep_kernel<<<blocks, kPrepThreads, 0, st>>>(g, r);
  if (cudaPeekAtLastError() != cudaSuccess) return "the group-shape kernel did not launch";
  const typename Gemm::Arguments args = arguments(g, r);
  void* workspace = static_cast<char*>(scratch) + arrays_bytes(g.E);
  Gemm gemm;
  if (gemm.can_implement(args) != cutlass::Status::kSuccess) return "CUTLASS refused the problem (can_implement)";
  if (gemm.initialize(args, workspace, st) != cutlass::Status::kSuccess) return "CUTLASS initialize failed";
  if (gemm.run(st) != cutlass::Status::kSuccess) return "the CUTLASS grouped GEMM did not launch";
  return nullptr;
}

}  // namespace cuda
}  // namespace qq
