// SPDX-License-Identifier: MIT
// bf16_pairs.cu: the paired bf16 instructions of src/kda/numerics.cuh against the
// per-element fp32 forms they replace, on every input (tests/test_numerics_gpu.py).
//
//   add.rn.bf16x2 (a, b)    vs  bf(add.rn.f32 (f(a), f(b)))   all 2^32 bf16 pairs (a, b)
//   sub.rn.bf16x2 (a, b)    vs  bf(sub.rn.f32 (f(a), f(b)))   all 2^32 bf16 pairs
//   mul.rn.bf16x2 (a, b)    vs  bf(mul.rn.f32 (f(a), f(b)))   all 2^32 bf16 pairs
//   cvt.rn.bf16x2.f32 (x)   vs  cvt.rn.bf16.f32 (x)            all 2^32 fp32 x
//
// Bit for bit, NaN payloads included. Prints one line per instruction:
// "<name> mismatches <count> first <input> <got> <want>".
#include <cstdint>
#include <cstdio>

namespace {

__device__ __forceinline__ float widen(uint32_t h) {
  return __uint_as_float((h & 0xffffu) << 16);
}

__device__ __forceinline__ uint32_t narrow(float x) {
  uint16_t h;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(x));
  return h;
}

__device__ __forceinline__ uint32_t narrow2(float lo, float hi) {
  uint32_t d;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
  return d;
}

enum Op { kAdd, kSub, kMul, kCvt, kOps };
const char *const kNames[kOps] = {"add.rn.bf16x2", "sub.rn.bf16x2", "mul.rn.bf16x2",
                                  "cvt.rn.bf16x2.f32"};

__device__ __forceinline__ uint32_t paired(int op, uint32_t a, uint32_t b) {
  uint32_t d;
  if (op == kAdd) asm("add.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  if (op == kSub) asm("sub.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  if (op == kMul) asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

__device__ __forceinline__ uint32_t single(int op, uint32_t a, uint32_t b) {
  float d;
  const float x = widen(a), y = widen(b);
  if (op == kAdd) asm("add.rn.f32 %0, %1, %2;" : "=f"(d) : "f"(x), "f"(y));
  if (op == kSub) asm("sub.rn.f32 %0, %1, %2;" : "=f"(d) : "f"(x), "f"(y));
  if (op == kMul) asm("mul.rn.f32 %0, %1, %2;" : "=f"(d) : "f"(x), "f"(y));
  return narrow(d);
}

struct Tally {
  unsigned long long count[kOps];
  uint32_t first[kOps][3];  // input, got, want
};

__device__ void record(Tally *t, int op, uint32_t input, uint32_t got, uint32_t want) {
  if (atomicAdd(&t->count[op], 1ull) == 0) {
    t->first[op][0] = input;
    t->first[op][1] = got;
    t->first[op][2] = want;
  }
}

// Input i: for the arithmetic, a = low 16 bits, b = high 16 bits, in the low halves, and
// the swapped pair (b, a) in the high halves; for the conversion, x = i and -x.
__global__ void probe(Tally *t) {
  const uint64_t stride = uint64_t{gridDim.x} * blockDim.x;
  for (uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; i < (uint64_t{1} << 32);
       i += stride) {
    const uint32_t a = static_cast<uint32_t>(i) & 0xffffu, b = static_cast<uint32_t>(i >> 16);
    for (int op = kAdd; op <= kMul; ++op) {
      const uint32_t d = paired(op, a | b << 16, b | a << 16);
      if ((d & 0xffffu) != single(op, a, b))
        record(t, op, static_cast<uint32_t>(i), d & 0xffffu, single(op, a, b));
      if ((d >> 16) != single(op, b, a))
        record(t, op, static_cast<uint32_t>(i), d >> 16, single(op, b, a));
    }
    const float x = __uint_as_float(static_cast<uint32_t>(i));
    const uint32_t d = narrow2(x, -x);
    if ((d & 0xffffu) != narrow(x))
      record(t, kCvt, static_cast<uint32_t>(i), d & 0xffffu, narrow(x));
    if ((d >> 16) != narrow(-x)) record(t, kCvt, static_cast<uint32_t>(i), d >> 16, narrow(-x));
  }
}

}  // namespace

int main() {
  Tally *t = nullptr;
  if (cudaMallocManaged(&t, sizeof(Tally)) != cudaSuccess) return 2;
  *t = Tally{};
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  probe<<<sms * 8, 256>>>(t);
  const cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess) {
    std::printf("error %s\n", cudaGetErrorString(e));
    return 2;
  }
  for (int op = 0; op < kOps; ++op)
    std::printf("%s mismatches %llu first 0x%08x 0x%04x 0x%04x\n", kNames[op], t->count[op],
                t->first[op][0], t->first[op][1], t->first[op][2]);
  return 0;
}
