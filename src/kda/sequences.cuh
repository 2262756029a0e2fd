// SPDX-License-Identifier: MIT
// sequences.cuh: which tokens and records belong to which sequence (spec §1.3, §4.2).
//
// Batched mode: sequence i is tokens [i T, (i + 1) T), its chunks are records
// [i ceil(T/16), (i + 1) ceil(T/16)). Varlen mode: sequence i is tokens [cu[i], cu[i+1])
// and tile_prefix_kernel writes prefix[i] = first record of sequence i. cu_seqlens lives
// on the device and is not validated there (no host sync), so every bound is clamped:
// a sequence is clamped into [0, total_tokens) and the prefix into [0, tiles_per_head],
// which makes garbage cu_seqlens give garbage rows but never an out-of-bounds access.
#pragma once
#ifndef FLASH_KDA_ARCH
#error "define FLASH_KDA_ARCH (the arch namespace, e.g. sm90a) before including kda headers"
#endif

#include "kda/params.h"
#include "kda/workspace.h"

namespace flash_kda::FLASH_KDA_ARCH {

struct SeqSpan {
  int64_t bos;         // first token
  int64_t len;         // tokens
  int64_t first_tile;  // first record within the head
  int64_t num_chunks;  // records (== ceil(len / 16) unless cu_seqlens is inconsistent)
};

// Tokens of sequence i, clamped into [0, total_tokens).
__device__ __forceinline__ void seq_bounds(const FwdParams &p, int64_t i, int64_t &bos,
                                           int64_t &len) {
  if (p.cu_seqlens == nullptr) {
    bos = i * p.seqlen;
    len = p.seqlen;
    return;
  }
  const int64_t b = min(max(p.cu_seqlens[i], int64_t{0}), p.total_tokens);
  const int64_t e = min(max(p.cu_seqlens[i + 1], b), p.total_tokens);
  bos = b;
  len = e - b;
}

__device__ __forceinline__ SeqSpan seq_span(const FwdParams &p, int64_t i) {
  SeqSpan s;
  seq_bounds(p, i, s.bos, s.len);
  if (p.cu_seqlens == nullptr) {
    s.num_chunks = ceil_div(p.seqlen, kChunk);
    s.first_tile = i * s.num_chunks;
  } else {
    s.first_tile = p.tile_prefix[i];
    s.num_chunks = p.tile_prefix[i + 1] - s.first_tile;
  }
  return s;
}

struct ChunkRef {
  int64_t tile;  // record index within the head
  int64_t tok0;  // first token of the chunk
  int n;         // valid rows, 1..16
};

// K1's chunk for grid index x; false for the excess CTAs of varlen's upper-bound grid.
__device__ __forceinline__ bool locate_chunk(const FwdParams &p, int64_t x, ChunkRef &ref) {
  int64_t seq = 0;
  if (p.cu_seqlens == nullptr) {
    const int64_t per_seq = ceil_div(p.seqlen, kChunk);
    seq = x / per_seq;
  } else {
    if (x >= p.tile_prefix[p.num_seqs]) return false;
    // Largest seq with prefix[seq] <= x: the non-empty sequence that owns record x.
    int64_t lo = 0, hi = p.num_seqs;  // prefix[lo] <= x < prefix[hi]
    while (hi - lo > 1) {
      const int64_t mid = (lo + hi) / 2;
      if (p.tile_prefix[mid] <= x)
        lo = mid;
      else
        hi = mid;
    }
    seq = lo;
  }
  const SeqSpan s = seq_span(p, seq);
  const int64_t c = x - s.first_tile;
  ref.tile = x;
  ref.tok0 = s.bos + c * kChunk;
  ref.n = static_cast<int>(min(int64_t{kChunk}, s.len - c * kChunk));
  return ref.n > 0;
}

// Varlen only: prefix[i] = sum over j < i of ceil(len_j / 16), clamped to tiles_per_head.
// One CTA of 1024 threads; thread t scans a contiguous run of sequences.
constexpr int kPrefixThreads = 1024;

__global__ void __launch_bounds__(kPrefixThreads) tile_prefix_kernel(const FwdParams p) {
  __shared__ int64_t warp_total[kPrefixThreads / 32];
  const int t = threadIdx.x, lane = t % 32, warp = t / 32;
  const int64_t per_thread = ceil_div(p.num_seqs, kPrefixThreads);
  const int64_t first = min(p.num_seqs, t * per_thread);
  const int64_t last = min(p.num_seqs, first + per_thread);

  int64_t local = 0;
  for (int64_t i = first; i < last; ++i) {
    int64_t bos, len;
    seq_bounds(p, i, bos, len);
    local += ceil_div(len, kChunk);
  }
  int64_t inclusive = local;  // warp inclusive scan, then across warps
  for (int off = 1; off < 32; off *= 2) {
    const int64_t up = __shfl_up_sync(0xffffffffu, inclusive, off);
    if (lane >= off) inclusive += up;
  }
  if (lane == 31) warp_total[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    int64_t total = warp_total[lane];
    for (int off = 1; off < 32; off *= 2) {
      const int64_t up = __shfl_up_sync(0xffffffffu, total, off);
      if (lane >= off) total += up;
    }
    warp_total[lane] = total;
  }
  __syncthreads();

  int64_t running = (warp > 0 ? warp_total[warp - 1] : 0) + inclusive - local;
  if (t == 0) p.tile_prefix[0] = 0;
  for (int64_t i = first; i < last; ++i) {
    int64_t bos, len;
    seq_bounds(p, i, bos, len);
    running += ceil_div(len, kChunk);
    p.tile_prefix[i + 1] = static_cast<int32_t>(min(running, p.tiles_per_head));
  }
}

}  // namespace flash_kda::FLASH_KDA_ARCH
