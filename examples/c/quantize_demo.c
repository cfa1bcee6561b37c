/* quantize_demo.c - quantize one NVFP4 group with libqq's C ABI and check it.
 *
 * The row 0.5, 1, 1.5, 2, 3, 4, 6, -0.5 (then zeros) has amax 6, so the
 * NVFP4 scale is E4M3(6 / 6) = 1.0 (byte 0x38) and the elements are their own
 * E2M1 codes 1..7 and 0x9; packed low nibble first, the first four bytes
 * read as the little-endian uint32 0x97654321 (docs/formats.md, Modes: packing).
 * Exit status 0 on success. */
#include <stdio.h>
#include <string.h>

#include <qq/qq.h>

static DLTensor cpu_tensor(void* data, DLDataType dt, int ndim, int64_t* shape) {
  DLTensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.device.device_type = kDLCPU;
  t.ndim = ndim;
  t.dtype = dt;
  t.shape = shape;
  return t;
}

int main(void) {
  float x[16] = {0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, -0.5f};
  uint8_t data[8], scale[1];
  int64_t xs[1] = {16}, ds[1] = {8}, ss[1] = {1};
  DLDataType f32 = {kDLFloat, 32, 1}, u8 = {kDLUInt, 8, 1};
  DLTensor tx = cpu_tensor(x, f32, 1, xs), td = cpu_tensor(data, u8, 1, ds), ts = cpu_tensor(scale, u8, 1, ss);

  qqQuantParams_t p;
  qqQuantParamsInit(&p, QQ_MODE_NVFP4);
  qqStatus_t st = qqQuantize(NULL, &tx, &p, NULL, &td, &ts, NULL, NULL);
  if (st != QQ_STATUS_SUCCESS) {
    fprintf(stderr, "qqQuantize failed: %s: %s\n", qqGetStatusString(st), qqGetLastErrorMessage());
    return 1;
  }
  uint32_t word = (uint32_t)data[0] | (uint32_t)data[1] << 8 | (uint32_t)data[2] << 16 | (uint32_t)data[3] << 24;
  printf("libqq %d: scale byte 0x%02x, packed word 0x%08x\n", qqGetVersion(), scale[0], word);
  if (scale[0] != 0x38 || word != 0x97654321u) {
    fprintf(stderr, "unexpected result: want scale 0x38 and word 0x97654321\n");
    return 1;
  }
  /* A bad argument gets a status and a message naming it. */
  xs[0] = 10;
  st = qqQuantize(NULL, &tx, &p, NULL, &td, &ts, NULL, NULL);
  printf("K=10: %s: %s\n", qqGetStatusString(st), qqGetLastErrorMessage());
  return st == QQ_STATUS_INVALID_VALUE ? 0 : 1;
}
