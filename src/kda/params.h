// SPDX-License-Identifier: MIT
// params.h: the plain struct at the host/kernel boundary. api.cpp fills it from a
// validated flash_kda_fwd_args; every kernel takes it by value. Arch-independent (no
// symbols), like workspace.h.
#pragma once

#include <cstdint>

namespace flash_kda {

struct FwdParams {
  // Activations, token-major [total_tokens, heads, 128] bf16 (bit patterns).
  const uint16_t *q;
  const uint16_t *k;
  const uint16_t *v;
  const uint16_t *g;
  const uint16_t *beta;  // [total_tokens, heads]
  uint16_t *out;
  const float *A_log;    // [heads]
  const float *dt_bias;  // [heads, 128]

  // States [num_seqs, heads, 128 (V), 128 (K)]; dtype 0 none, 1 bf16, 2 fp32.
  const void *initial_state;
  void *final_state;
  int32_t initial_dtype;
  int32_t final_dtype;

  const int64_t *cu_seqlens;  // [num_seqs + 1] or nullptr (batched)
  uint8_t *records;           // [heads, tiles_per_head, kRecordBytes]
  int32_t *tile_prefix;       // [num_seqs + 1], varlen only

  int64_t seqlen;        // T of batched mode
  int64_t total_tokens;  // B * T
  int64_t heads;
  int64_t num_seqs;
  int64_t tiles_per_head;  // record stride of one head
  int64_t prepare_tiles;   // K1 grid.x: exact in batched mode, upper bound in varlen

  float gate_scale;     // c = fp32(lower_bound * log2 e), spec §3.2 step 1
  uint32_t scale_bf16;  // sb = bf(fp32(scale)), spec §3.2 step 6
  int32_t block_v;      // value columns per K2 CTA
  int32_t stages;       // K2 ring depth, set at launch from the device's smem limit
};

}  // namespace flash_kda
