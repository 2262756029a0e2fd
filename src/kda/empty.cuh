// SPDX-License-Identifier: MIT
// empty.cuh: a call without tokens (flash_kda.h): every sequence's final state is its start
// state, kept in bf16 like any state between chunks (design §1.4): the initial state (its
// pool slot; zero without one, for padding and where has_initial_state is 0) rounded to
// bf16, stored as bf16 or widened exactly to fp32. One CTA per (sequence, head) copies one
// 128 x 128 block; grid (N, H), kEmptyThreads threads, no shared memory.
#pragma once
#ifndef FLASH_KDA_ARCH
#error "define FLASH_KDA_ARCH (the arch namespace, e.g. sm90a) before including kda headers"
#endif

#include "kda/chains.cuh"

namespace flash_kda::FLASH_KDA_ARCH {

constexpr int kEmptyThreads = 256;

__global__ void __launch_bounds__(kEmptyThreads) empty_states_kernel(const FwdParams p) {
  const int64_t seq = blockIdx.x, head = blockIdx.y;
  const StateSink sink = final_sink(p, seq, head);
  if (sink.block == nullptr) return;
  const StateSource source = initial_source(p, seq, head);
  for (int i = threadIdx.x; i < kHeadDim * kHeadDim; i += kEmptyThreads) {
    uint32_t bits = 0;  // bf16 zero
    if (source.block != nullptr && source.dtype == Dtype::kBf16)
      bits = static_cast<const uint16_t *>(source.block)[i];
    else if (source.block != nullptr)
      bits = f32_to_bf16(static_cast<const float *>(source.block)[i]);
    if (sink.dtype == Dtype::kBf16)
      static_cast<uint16_t *>(sink.block)[i] = static_cast<uint16_t>(bits);
    else
      static_cast<float *>(sink.block)[i] = bf16_to_f32(bits);
  }
}

}  // namespace flash_kda::FLASH_KDA_ARCH
