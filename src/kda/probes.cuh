// SPDX-License-Identifier: MIT
// probes.cuh: single-instruction kernels for the PyTorch reference (design §3.7). They run
// exactly the approximate instructions and tensor-core products the real kernels use,
// through the same numerics.cuh helpers, so reference.py can reproduce every bit without
// calling K1/K2. Small enough to check by reading.
#pragma once
#ifndef FLASH_KDA_ARCH
#error "define FLASH_KDA_ARCH (the arch namespace, e.g. sm90a) before including kda headers"
#endif

#include "kda/numerics.cuh"

namespace flash_kda::FLASH_KDA_ARCH {

constexpr int kProbeThreads = 128;

__global__ void __launch_bounds__(kProbeThreads)
    probe_unary_kernel(int op, const float *x, float *y, int64_t count) {
  for (int64_t i = blockIdx.x * int64_t{kProbeThreads} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * kProbeThreads) {
    const float xi = x[i];
    y[i] = op == 0 ? ex2_approx(xi) : op == 1 ? sigmoid_tanh(xi) : rsqrt_approx(xi);
  }
}

// LG2 (the softplus gate's logarithm) in a kernel of its own, so that the three probes above
// keep their code.
__global__ void __launch_bounds__(kProbeThreads)
    probe_lg2_kernel(const float *x, float *y, int64_t count) {
  for (int64_t i = blockIdx.x * int64_t{kProbeThreads} + threadIdx.x; i < count;
       i += int64_t{gridDim.x} * kProbeThreads)
    y[i] = lg2_approx(x[i]);
}

// Operand fragments of one m16n8k16 step read straight from row-major global memory:
// A rows (row0 + g, + 8) x columns (k0 + 2cq, + 8), B^T rows (n0 + g) likewise.
struct ProbeFrags {
  uint32_t a[4];
  uint32_t b[2];
};

__device__ __forceinline__ ProbeFrags probe_frags(const uint16_t *A, const uint16_t *B, int64_t k,
                                                  int64_t k0) {
  const int lane = threadIdx.x % 32, g = lane / 4, cq = lane % 4;
  auto at = [&](const uint16_t *base, int row, int col) {
    return *reinterpret_cast<const uint32_t *>(base + row * k + k0 + col);
  };
  ProbeFrags f;
  f.a[0] = at(A, g, 2 * cq);
  f.a[1] = at(A, g + 8, 2 * cq);
  f.a[2] = at(A, g, 2 * cq + 8);
  f.a[3] = at(A, g + 8, 2 * cq + 8);
  f.b[0] = at(B, g, 2 * cq);
  f.b[1] = at(B, g, 2 * cq + 8);
  return f;
}

// One warp per 16x8 tile of C; k-blocks in ascending order from a zero accumulator.
// kHalf selects fp16 x fp16 -> fp16 (MMA16) instead of bf16 x bf16 -> fp32 (MMA32).
template <bool kHalf>
__global__ void __launch_bounds__(kProbeThreads)
    probe_mma_kernel(const uint16_t *A, const uint16_t *B, void *C, int64_t batch, int64_t m,
                     int64_t n, int64_t k) {
  const int lane = threadIdx.x % 32, g = lane / 4, cq = lane % 4;
  const int64_t tiles_m = m / 16, tiles_n = n / 8;
  const int64_t tile = blockIdx.x * int64_t{kProbeThreads / 32} + threadIdx.x / 32;
  if (tile >= batch * tiles_m * tiles_n) return;
  const int64_t b = tile / (tiles_m * tiles_n);
  const int64_t row0 = (tile / tiles_n) % tiles_m * 16, col0 = tile % tiles_n * 8;
  const uint16_t *a_tile = A + (b * m + row0) * k;
  const uint16_t *b_tile = B + (b * n + col0) * k;
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  uint32_t acc16[2] = {0u, 0u};
  for (int64_t k0 = 0; k0 < k; k0 += 16) {
    const ProbeFrags f = probe_frags(a_tile, b_tile, k, k0);
    if constexpr (kHalf) {
      mma_f16_f16(acc16, f.a, f.b[0], f.b[1]);
    } else {
      mma_bf16_f32(acc, f.a, f.b[0], f.b[1]);
    }
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t at = (b * m + row0 + g + 8 * r) * n + col0 + 2 * cq;
    if constexpr (kHalf) {
      *reinterpret_cast<uint32_t *>(static_cast<uint16_t *>(C) + at) = acc16[r];
    } else {
      static_cast<float *>(C)[at] = acc[2 * r];
      static_cast<float *>(C)[at + 1] = acc[2 * r + 1];
    }
  }
}

}  // namespace flash_kda::FLASH_KDA_ARCH
