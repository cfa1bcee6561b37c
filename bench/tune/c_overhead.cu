// c_overhead.cu - the C side of bench_overhead's CUDA rows: what a qq call costs on the host
// without Python (issue 11's split between the binding and libqq + the CUDA launch).
// A diagnostic, not a benchmark. Prints us per call of a loop of N calls followed by one
// synchronize, median of 9 repeats, on the legacy default stream (torch's default):
//   - an empty kernel with a 16-byte argument, and one with an argument of QuantizeArgs's
//     size (the launch alone, and what a larger kernel argument adds);
//   - qqAmax, qqQuantize (nvfp4, mxfp8) and qqDequantize of a [16, 4096] bf16 tensor.
// Build and run where libqq is installed (P = python3 -c "import qq; print(qq.cmake_prefix_path())"):
//   nvcc -O2 -arch=sm_90a bench/tune/c_overhead.cu -I$P/include -L$P/lib -l:libqq.so.0 \
//        -Xlinker -rpath,$P/lib -o /tmp/c_overhead && /tmp/c_overhead
#include <cuda_runtime.h>
#include <qq/qq.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <vector>

struct Small { long long a, b; };
struct Big { char b[736]; };
__global__ void k_small(Small) {}
__global__ void k_big(Big) {}

static double loop_us(const std::function<void()>& f, int n = 2000, int reps = 9) {
  f();
  cudaDeviceSynchronize();
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < n; ++i) f();
    cudaDeviceSynchronize();
    auto t1 = std::chrono::steady_clock::now();
    t.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / n);
  }
  std::sort(t.begin(), t.end());
  return t[reps / 2];
}

static DLTensor dev_tensor(void* p, DLDataType dt, int nd, int64_t* shape) {
  DLTensor t;
  memset(&t, 0, sizeof t);
  t.data = p;
  t.device.device_type = kDLCUDA;
  t.device.device_id = 0;
  t.ndim = nd;
  t.dtype = dt;
  t.shape = shape;
  return t;
}

static void ok(qqStatus_t st, const char* what) {
  if (st != QQ_STATUS_SUCCESS) {
    fprintf(stderr, "%s: %s: %s\n", what, qqGetStatusString(st), qqGetLastErrorMessage());
    exit(1);
  }
}

int main() {
  const int M = 16, K = 4096;
  void *x, *data, *scales, *out, *am;
  cudaMalloc(&x, M * K * 2);
  cudaMemset(x, 0, M * K * 2);
  cudaMalloc(&data, M * K);
  cudaMalloc(&scales, M * K / 16);
  cudaMalloc(&out, M * K * 2);
  cudaMalloc(&am, 4);
  DLDataType bf16 = {kDLBfloat, 16, 1}, u8 = {kDLUInt, 8, 1}, f32 = {kDLFloat, 32, 1};
  int64_t xs[2] = {M, K}, ds4[2] = {M, K / 2}, ds8[2] = {M, K}, ss16[2] = {M, K / 16}, ss32[2] = {M, K / 32};
  DLTensor tx = dev_tensor(x, bf16, 2, xs), tam = dev_tensor(am, f32, 0, nullptr);
  DLTensor td4 = dev_tensor(data, u8, 2, ds4), ts16 = dev_tensor(scales, u8, 2, ss16);
  DLTensor td8 = dev_tensor(data, u8, 2, ds8), ts32 = dev_tensor(scales, u8, 2, ss32);
  DLTensor tout = dev_tensor(out, bf16, 2, xs);
  qqQuantParams_t p4, p8;
  qqQuantParamsInit(&p4, QQ_MODE_NVFP4);
  qqQuantParamsInit(&p8, QQ_MODE_MXFP8);
  ok(qqQuantize(NULL, &tx, &p4, NULL, &td4, &ts16, NULL, NULL), "quantize nvfp4");
  ok(qqQuantize(NULL, &tx, &p8, NULL, &td8, &ts32, NULL, NULL), "quantize mxfp8");
  ok(qqAmax(NULL, &tx, &tam, NULL), "amax");
  ok(qqDequantize(NULL, &td4, &ts16, NULL, &p4, NULL, &tout, NULL), "dequantize");
  Small s{};
  Big b{};
  int dev = 0;
  printf("us per call, loop of 2000 calls then one synchronize, median of 9 (legacy default stream)\n");
  printf("  empty kernel, 16-byte argument       %6.2f\n", loop_us([&] { k_small<<<1, 32>>>(s); }));
  printf("  empty kernel, 736-byte argument      %6.2f\n", loop_us([&] { k_big<<<1, 32>>>(b); }));
  printf("  empty kernel + cudaGetDevice + cudaGetLastError %6.2f\n", loop_us([&] {
    cudaGetDevice(&dev);
    k_small<<<1, 32>>>(s);
    (void)cudaGetLastError();
  }));
  printf("  qqAmax                               %6.2f\n", loop_us([&] { qqAmax(NULL, &tx, &tam, NULL); }));
  printf("  qqQuantize nvfp4                     %6.2f\n",
         loop_us([&] { qqQuantize(NULL, &tx, &p4, NULL, &td4, &ts16, NULL, NULL); }));
  printf("  qqQuantize mxfp8                     %6.2f\n",
         loop_us([&] { qqQuantize(NULL, &tx, &p8, NULL, &td8, &ts32, NULL, NULL); }));
  printf("  qqDequantize nvfp4                   %6.2f\n",
         loop_us([&] { qqDequantize(NULL, &td4, &ts16, NULL, &p4, NULL, &tout, NULL); }));
  // the same with the loop's GPU time out of the way: what the host alone spends a call
  auto host_only = [&](const std::function<void()>& f) {
    const int n = 2000;
    f();
    cudaDeviceSynchronize();
    std::vector<double> t;
    for (int r = 0; r < 9; ++r) {
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < n; ++i) f();
      auto t1 = std::chrono::steady_clock::now();
      cudaDeviceSynchronize();
      t.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / n);
    }
    std::sort(t.begin(), t.end());
    return t[4];
  };
  printf("host time alone (no synchronize inside the timed loop)\n");
  printf("  empty kernel, 16-byte argument       %6.2f\n", host_only([&] { k_small<<<1, 32>>>(s); }));
  printf("  qqQuantize nvfp4                     %6.2f\n",
         host_only([&] { qqQuantize(NULL, &tx, &p4, NULL, &td4, &ts16, NULL, NULL); }));
  printf("  qqDequantize nvfp4                   %6.2f\n",
         host_only([&] { qqDequantize(NULL, &td4, &ts16, NULL, &p4, NULL, &tout, NULL); }));
  return 0;
}
