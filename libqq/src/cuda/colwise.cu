// cuda/colwise.cu - quantization along the rows (qqQuantizeColwise: the
// row-wise quantization of x^T without materializing it, optionally of x
// too from the same read) and of the MoE weights [E, D1, D2] with their
// 32x1 / 32x32 scalings (qqQuantizeMoe), on the GPU.
//
// Indexing and bit-exactness: quant.cuh.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "../codec.h"
#include "../internal.h"
#include "common.cuh"
#include "quant.cuh"
#include "vec.cuh"

namespace qq {
namespace cuda {
namespace {

// ---------------------------------------------------------------------------
// quantize along rows (x^T), optionally along K too, and the MoE 3D weights.
// One block per tile of kTM = 128 rows x kTK = 64 columns: the tile is read
// once (16-byte loads along the contiguous axis) into shared memory as fp32,
// then (a) thread t encodes the column groups of column t % 64 (groups of G
// rows; their packed bytes are contiguous in x^T's row) and (b) when asked,
// the row groups (G columns of one row) for the row-wise outputs. The pitch of
// 65 floats keeps both the column reads (a warp reads 32 consecutive columns
// of one row) and the row reads (32 rows, stride 65) free of bank conflicts.
// ---------------------------------------------------------------------------
constexpr int kTM = 128, kTK = 64, kPitch = kTK + 1;

// Encode G values (get(i)) of one group with the group amax `amax` (the
// group's own, or its 32x32 tile's) into G*bits/8 bytes at dst (4-byte
// aligned). Returns the scale byte (fp modes) or writes *scale / *bias
// (affine, fp32; the caller rounds them to the stored dtype).
template <int G, typename Get>
__device__ __forceinline__ uint8_t encode_group(const QSpec& q, float enc, float amax, float wmin, float wmax,
                                                bool finite, Get get, uint8_t* dst, float* scale, float* bias) {
  constexpr int kMaxWords = G * 8 / 32;  // words for the widest element (8 bits)
  uint32_t w[kMaxWords];
#pragma unroll
  for (int i = 0; i < kMaxWords; ++i) w[i] = 0;
  uint8_t sc = 0;
  const int bits = q.bits;
  // Only the modes a group size can belong to are compiled for it (nvfp4:
  // 16; mx: 32; affine: 32, 64, 128): this keeps the build time in check.
  constexpr bool kFp = G <= 32, kAffine = G >= 32;
  if (kFp && q.fp()) {
    const FpGroupScale gsc = fp_group_scale(amax, q.mode == QQ_MODE_NVFP4, enc, q.elem, q.floor_rounding);
    const float f = gsc.factor;
    const bool nan_group = gsc.nan_group;
    sc = gsc.code;
    if (G == 16 || bits == 4) {
#pragma unroll
      for (int i = 0; i < G / 8; ++i) {
        float y[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) y[j] = get(8 * i + j) * f;
        w[i] = nan_group ? 0u : e2m1x8_encode(y);  // a NaN group's codes are 0
      }
    } else {
#pragma unroll
      for (int i = 0; i < G; i += 2) {
        const uint32_t pr = nan_group ? 0x7f7fu
                            : (q.elem == ELEM_E4M3 ? e4m3x2_encode(get(i) * f, get(i + 1) * f)
                                                   : e5m2x2_encode(get(i) * f, get(i + 1) * f));
        w[i / 4] |= pr << (8 * (i % 4));
      }
    }
  } else if (kAffine) {
    // 8 elements * bits bits = `bits` whole bytes: encode and store 8 at a time.
    // (No word array indexed by a run-time bit position: that would live in
    // local memory and slow every mode compiled into this function.)
    float s = u2f(0x7fc00000u), b = s, inv = 0.0f;
    if (finite) {
      affine_params(wmin, wmax, bits, &s, &b);
      inv = 1.0f / s;
    }
    *scale = s;
    *bias = b;
#pragma unroll
    for (int j = 0; j < G / 8; ++j) {
      uint64_t acc = 0;
      if (finite) {
#pragma unroll
        for (int i = 0; i < 8; ++i) acc |= (uint64_t)affine_encode(get(8 * j + i), s, inv, b, bits) << (i * bits);
      }
      uint8_t* dj = dst + j * bits;
      if (bits == 4) *reinterpret_cast<uint32_t*>(dj) = (uint32_t)acc;
      else if (bits == 8) *reinterpret_cast<uint2*>(dj) = make_uint2((uint32_t)acc, (uint32_t)(acc >> 32));
      else
        for (int i = 0; i < bits; ++i) dj[i] = (uint8_t)(acc >> (8 * i));
    }
    return 0;
  }
  const int words = G * bits / 32;
  uint32_t* d = reinterpret_cast<uint32_t*>(dst);
  if (words % 4 == 0 && ((uintptr_t)dst & 15) == 0) {  // 16-byte stores where aligned
#pragma unroll
    for (int i = 0; i + 3 < kMaxWords; i += 4)
      if (i < words) reinterpret_cast<uint4*>(dst)[i / 4] = make_uint4(w[i], w[i + 1], w[i + 2], w[i + 3]);
  } else if (words % 2 == 0 && ((uintptr_t)dst & 7) == 0) {
#pragma unroll
    for (int i = 0; i + 1 < kMaxWords; i += 2)
      if (i < words) reinterpret_cast<uint2*>(dst)[i / 2] = make_uint2(w[i], w[i + 1]);
  } else {
#pragma unroll
    for (int i = 0; i < kMaxWords; ++i)
      if (i < words) d[i] = w[i];
  }
  return sc;
}

// A group's statistics: fp modes need its amax alone (NaN-propagating: the integer max
// of the magnitudes' bits, NaN above Inf), affine its min, max and whether all are
// finite. Each mode computes only its own (the loops are most of the kernel's work
// besides the encoding).
template <int G, typename Get>
__device__ __forceinline__ void group_stats(bool fp, Get get, float* amax, float* wmin, float* wmax, bool* finite) {
  if (fp) {
    uint32_t m = 0;
#pragma unroll 8
    for (int i = 0; i < G; ++i) m = max(m, f2u(get(i)) & 0x7fffffffu);
    *amax = u2f(m);
    *wmin = *wmax = 0.0f;
    *finite = true;
    return;
  }
  float lo = get(0), hi = 0.0f;
  bool f = true;
#pragma unroll 8
  for (int i = 0; i < G; ++i) {
    const float v = get(i);
    f = f && is_finite_f(v);
    lo = v < lo ? v : lo;
    hi = v > hi ? v : hi;
  }
  *amax = 0.0f;
  *wmin = lo, *wmax = hi;
  *finite = f;
}

template <typename T, int G, bool kColMajor>
__global__ void __launch_bounds__(kThreads, 6) quantize_tile_kernel(ColwiseArgs a, bool vec) {
  __shared__ float xs[kTM * kPitch];  // xs[m * kPitch + k], logical (m, k) of the tile
  const int64_t M = a.M, K = a.K;
  const int64_t m0 = (int64_t)blockIdx.x * kTM, k0 = (int64_t)blockIdx.y * kTK;
  const int64_t b = blockIdx.z;
  const T* xb = reinterpret_cast<const T*>(a.x.ptr) + a.x.offset(b);
  const float enc = a.gs ? nvfp4_enc(*a.gs) : 1.0f;

  // ---- load: 8 consecutive elements along the contiguous axis per step
  constexpr int kSteps = kTM * kTK / 8 / kThreads;  // 16-byte loads per thread (4)
  if (!kColMajor) {
    // physical rows m, contiguous along k: 8 loaders per row of 64; all loads
    // of a thread are issued before the first shared-memory store
#pragma unroll
    for (int it = 0; it < kSteps; ++it) {
      const int i = it * kThreads + threadIdx.x;
      const int r = i / (kTK / 8), c = (i % (kTK / 8)) * 8;
      const int64_t m = m0 + r, k = k0 + c;
      float v[8];
      if (vec && m < M && k + 8 <= K) {
        load8<T>(xb + m * a.x.ld + k, v);
      } else {
#pragma unroll
        for (int j = 0; j < 8; ++j) v[j] = (m < M && k + j < K) ? load_cast<T>(xb + m * a.x.ld + k + j) : 0.0f;
      }
#pragma unroll
      for (int j = 0; j < 8; ++j) xs[r * kPitch + c + j] = v[j];
    }
  } else {
    // physical rows k (the D2 columns), contiguous along m: 16 loaders per row of 128
#pragma unroll
    for (int it = 0; it < kSteps; ++it) {
      const int i = it * kThreads + threadIdx.x;
      const int c = i / (kTM / 8), r = (i % (kTM / 8)) * 8;
      const int64_t k = k0 + c, m = m0 + r;
      float v[8];
      if (vec && k < K && m + 8 <= M) {
        load8<T>(xb + k * a.x.ld + m, v);
      } else {
#pragma unroll
        for (int j = 0; j < 8; ++j) v[j] = (k < K && m + j < M) ? load_cast<T>(xb + k * a.x.ld + m + j) : 0.0f;
      }
#pragma unroll
      for (int j = 0; j < 8; ++j) xs[(r + j) * kPitch + c] = v[j];
    }
  }
  __syncthreads();

  // ---- affine column groups of 64 / 128 rows: a thread per 32 rows of a column (all 256
  // busy; one thread per group left 2 / 3 of 4 idle, each with a long serial group), the
  // group's min / max / finiteness combined through shared memory; each thread then
  // encodes its 32 rows with the whole group's parameters (encode_group<32> computes
  // them from the same min and max: the same bytes as one thread encoding the group).
  if constexpr (G > 32) {
    constexpr int kSubs = kTM / 32;  // 4 = kThreads / kTK
    __shared__ float part_lo[kSubs][kTK], part_hi[kSubs][kTK];
    __shared__ int part_fin[kSubs][kTK];
    const int c = threadIdx.x % kTK, sub = threadIdx.x / kTK;
    const int64_t k = k0 + c, m = m0 + (int64_t)sub * 32;
    const float* col = xs + sub * 32 * kPitch + c;
    auto get = [&](int i) { return col[i * kPitch]; };
    float amax, wmin, wmax;
    bool finite;
    group_stats<32>(false, get, &amax, &wmin, &wmax, &finite);
    part_lo[sub][c] = wmin, part_hi[sub][c] = wmax, part_fin[sub][c] = finite;
    __syncthreads();
    const int first = sub / (G / 32) * (G / 32);  // the group's first sub
    // the group's min and max in the order one thread would have met its rows: a
    // strict comparison keeps the first of equal values (+-0), as group_stats does
    wmin = part_lo[first][c], wmax = part_hi[first][c], finite = part_fin[first][c];
#pragma unroll
    for (int j = 1; j < G / 32; ++j) {
      const float lo = part_lo[first + j][c], hi = part_hi[first + j][c];
      wmin = lo < wmin ? lo : wmin;
      wmax = hi > wmax ? hi : wmax;
      finite = finite && part_fin[first + j][c];
    }
    if (k < K && m < M) {  // M % G == 0: a group is all in or all out
      uint8_t* dst = (uint8_t*)a.data_t.ptr + (b * K + k) * a.data_t.cols + m * a.q.bits / 8;
      float s = 0.0f, bi = 0.0f;
      encode_group<32>(a.q, enc, amax, wmin, wmax, finite, get, dst, &s, &bi);
      if (sub == first) {
        const int64_t ng = M / G, g = m / G;
        reinterpret_cast<T*>(a.scales_t.ptr)[(b * K + k) * ng + g] = store_cast<T>(s);
        reinterpret_cast<T*>(a.biases_t.ptr)[(b * K + k) * ng + g] = store_cast<T>(bi);
      }
    }
  } else {
  // ---- column groups: thread -> column c = t % 64, groups gi = t / 64, +4, ...
    const int c = threadIdx.x % kTK;
    const int64_t k = k0 + c;
    constexpr int kGroups = kTM / G;
    for (int gi = threadIdx.x / kTK; gi < kGroups; gi += kThreads / kTK) {
      const int64_t m = m0 + (int64_t)gi * G;
      const bool valid = k < K && m < M;  // M % G == 0: a group is all in or all out
      const float* col = xs + gi * G * kPitch + c;
      auto get = [&](int i) { return col[i * kPitch]; };
      float amax, wmin, wmax;
      bool finite;
      group_stats<G>(a.q.fp(), get, &amax, &wmin, &wmax, &finite);
      if (a.tile32) {
        // one amax per 32x32 tile: reduce over the 32 columns of this warp
        // (lanes are columns; all lanes run this with the same gi)
        const float t = valid ? amax : 0.0f;
        float r = t;
#pragma unroll
        for (int o = 16; o; o >>= 1) r = nanmax_f(r, __shfl_xor_sync(0xffffffffu, r, o));
        amax = r;
      }
      if (!valid) continue;
      uint8_t* dst = (uint8_t*)a.data_t.ptr + (b * K + k) * a.data_t.cols + m * a.q.bits / 8;
      float s = 0.0f, bi = 0.0f;
      const uint8_t sc = encode_group<G>(a.q, enc, amax, wmin, wmax, finite, get, dst, &s, &bi);
      const int64_t ng = M / G, g = m / G;
      if (!a.q.fp()) {
        reinterpret_cast<T*>(a.scales_t.ptr)[(b * K + k) * ng + g] = store_cast<T>(s);
        reinterpret_cast<T*>(a.biases_t.ptr)[(b * K + k) * ng + g] = store_cast<T>(bi);
      } else {
        uint8_t* sp = (uint8_t*)a.scales_t.ptr;
        if (a.scale_kind == COL_SCALE_T_LINEAR) sp[(b * K + k) * ng + g] = sc;
        else if (a.scale_kind == COL_SCALE_BLOCKED)
          sp[b * a.scales_t.rows * a.scales_t.cols + blocked_offset(k, g, a.scales_t.cols)] = sc;
        else if (!a.tile32) sp[(b * ng + g) * K + k] = sc;
        else if (k % 32 == 0) sp[(b * ng + g) * (K / 32) + k / 32] = sc;
      }
    }
  }


  // ---- row groups (both orientations from this one read)
  if (a.rowwise && G <= kTK) {
    constexpr int kRowGroups = kTK / G;
    const QuantizeArgs& r = a.row;
    for (int i = threadIdx.x; i < kTM * kRowGroups; i += kThreads) {
      const int rr = i % kTM, gj = i / kTM;  // consecutive threads: consecutive rows
      const int64_t m = m0 + rr, k = k0 + (int64_t)gj * G;
      if (m >= M || k >= K) continue;  // K % G == 0 here
      const float* row = xs + rr * kPitch + gj * G;
      auto get = [&](int j) { return row[j]; };
      float amax, wmin, wmax;
      bool finite;
      group_stats<G>(a.q.fp(), get, &amax, &wmin, &wmax, &finite);
      uint8_t* dst = (uint8_t*)r.data.ptr + (b * M + m) * r.data.cols + k * a.q.bits / 8;
      float s = 0.0f, bi = 0.0f;
      const uint8_t sc = encode_group<G>(a.q, enc, amax, wmin, wmax, finite, get, dst, &s, &bi);
      const int64_t ng = K / G, g = k / G;
      if (!a.q.fp()) {
        reinterpret_cast<T*>(r.scales.ptr)[(b * M + m) * ng + g] = store_cast<T>(s);
        reinterpret_cast<T*>(r.biases.ptr)[(b * M + m) * ng + g] = store_cast<T>(bi);
      } else if (a.q.blocked) {
        ((uint8_t*)r.scales.ptr)[b * r.scales.rows * r.scales.cols + blocked_offset(m, g, r.scales.cols)] = sc;
      } else {
        ((uint8_t*)r.scales.ptr)[(b * M + m) * ng + g] = sc;
      }
    }
  }
}

template <typename T, bool kColMajor>
qqStatus_t launch_tile_t(const ColwiseArgs& a, bool vec, cudaStream_t st) {
  const dim3 grid((unsigned)((a.M + kTM - 1) / kTM), (unsigned)((a.K + kTK - 1) / kTK), (unsigned)a.x.batch());
  if (kColMajor) {  // only the MoE weights (mxfp8, group 32) come column-major
    quantize_tile_kernel<T, 32, true><<<grid, kThreads, 0, st>>>(a, vec);
  } else {
    switch (a.q.group) {
      case 16: quantize_tile_kernel<T, 16, false><<<grid, kThreads, 0, st>>>(a, vec); break;
      case 32: quantize_tile_kernel<T, 32, false><<<grid, kThreads, 0, st>>>(a, vec); break;
      case 64: quantize_tile_kernel<T, 64, false><<<grid, kThreads, 0, st>>>(a, vec); break;
      default: quantize_tile_kernel<T, 128, false><<<grid, kThreads, 0, st>>>(a, vec); break;
    }
  }
  return check_launch("quantize_colwise");
}

}  // namespace

qqStatus_t quantize_colwise(qqHandle_t h, const ColwiseArgs& a, void* stream) {
  if (a.x.batch() > 65535)
    return set_error(QQ_STATUS_NOT_SUPPORTED, "quantize_colwise: more than 65535 batch entries on the GPU; "
                     "split the batch");
  // 16-byte loads need 16-byte aligned rows; otherwise the kernel loads
  // element by element (correct, slower), as its edge tiles always do.
  const bool vec = aligned(a.x, 16);
  return on_device(a.x.device, [&]() -> qqStatus_t {
    cudaStream_t st = (cudaStream_t)stream;
    // Blocked padding (rows K..roundup(K,128), columns beyond the groups) is
    // zero: clear the (small) scale buffers first when there is any.
    if (a.scale_kind == COL_SCALE_BLOCKED &&
        (a.scales_t.rows != a.K || a.scales_t.cols * a.q.group != a.M))
      QQ_CUDA_TRY(cudaMemsetAsync(a.scales_t.ptr, 0, (size_t)(a.x.batch() * a.scales_t.rows * a.scales_t.cols), st),
                  "quantize_colwise");
    ColwiseArgs b = a;
    if (a.rowwise && a.q.group > kTK) {
      // affine group 128 is wider than a tile: the row-wise half runs as its own kernel
      QQ_TRY(quantize(h, a.row, stream));
      b.rowwise = false;
    } else if (a.rowwise && a.q.blocked &&
               (a.row.scales.rows != a.M || a.row.scales.cols * a.q.group != a.K)) {
      QQ_CUDA_TRY(cudaMemsetAsync(a.row.scales.ptr, 0,
                                  (size_t)(a.x.batch() * a.row.scales.rows * a.row.scales.cols), st),
                  "quantize_colwise");
    }
    switch (a.x.dt) {
      case DType::F32:
        return a.x_colmajor ? launch_tile_t<float, true>(b, vec, st) : launch_tile_t<float, false>(b, vec, st);
      case DType::F16:
        return a.x_colmajor ? launch_tile_t<__half, true>(b, vec, st) : launch_tile_t<__half, false>(b, vec, st);
      default:
        return a.x_colmajor ? launch_tile_t<__nv_bfloat16, true>(b, vec, st)
                            : launch_tile_t<__nv_bfloat16, false>(b, vec, st);
    }
  });
}

}  // namespace cuda
}  // namespace qq
