// SPDX-License-Identifier: MIT
// sequences.cuh: which tokens, records, segments and checkpoint slots belong to which
// sequence (docs/design.md §1.3, §4.2, §6).
//
// A chunk is 16 or 32 tokens (p.chunk_shift: 4 or 5, workspace.h RecordLayout).
// Batched mode: sequence i is tokens [i T, (i + 1) T), its chunks are records
// [i ceil(T/C), (i + 1) ceil(T/C)), C the chunk length. Varlen mode: sequence i is tokens [cu[i],
// cu[i+1]) and prefix_kernel writes, per sequence, its first record, first segment and first
// checkpoint slot. cu_seqlens lives on the device and is not validated there (no host
// sync), so every bound is clamped: a sequence is clamped into [0, total_tokens) and each
// prefix into its capacity, which makes garbage cu_seqlens give garbage rows but never an
// out-of-bounds access.
#pragma once
#ifndef FLASH_KDA_ARCH
#error "define FLASH_KDA_ARCH (the arch namespace, e.g. sm90a) before including kda headers"
#endif

#include "kda/params.h"
#include "kda/workspace.h"

namespace flash_kda::FLASH_KDA_ARCH {

// Entry i of an int32 or int64 index tensor.
__device__ __forceinline__ int64_t load_index(const void *ptr, Dtype dtype, int64_t i) {
  return dtype == Dtype::kInt32 ? int64_t{static_cast<const int32_t *>(ptr)[i]}
                                : static_cast<const int64_t *>(ptr)[i];
}

// Element offset of (batch b, token t, head h) in a strided activation or beta.
__device__ __forceinline__ int64_t token_offset(const Strides &s, int64_t b, int64_t t, int64_t h) {
  return b * s.batch + t * s.token + h * s.head;
}

// Tokens of a chunk, and the chunks of `len` tokens (shifts: no division on the device).
__device__ __forceinline__ int64_t chunk_tokens(const FwdParams &p) {
  return int64_t{1} << p.chunk_shift;
}

__device__ __forceinline__ int64_t chunks_of(const FwdParams &p, int64_t len) {
  return (len + chunk_tokens(p) - 1) >> p.chunk_shift;
}

// A run of whole chunks of one sequence: a sequence, or a segment of one.
struct SeqSpan {
  int64_t b, t0;       // batch and token coordinates of the first token
  int64_t len;         // tokens
  int64_t first_tile;  // first record within the head
  int64_t num_chunks;  // records (== ceil(len / C) unless cu_seqlens is inconsistent)
  int64_t chunk0;      // index of the first chunk within its sequence
};

// Tokens [bos, bos + len) of sequence i (flattened over the batch), clamped.
__device__ __forceinline__ void seq_bounds(const FwdParams &p, int64_t i, int64_t &bos,
                                           int64_t &len) {
  if (p.cu_seqlens == nullptr) {
    bos = i * p.seqlen;
    len = p.seqlen;
    return;
  }
  const int64_t b =
      min(max(load_index(p.cu_seqlens, p.cu_seqlens_dtype, i), int64_t{0}), p.total_tokens);
  const int64_t e =
      min(max(load_index(p.cu_seqlens, p.cu_seqlens_dtype, i + 1), b), p.total_tokens);
  bos = b;
  len = e - b;
}

__device__ __forceinline__ SeqSpan seq_span(const FwdParams &p, int64_t i) {
  SeqSpan s;
  int64_t bos;
  seq_bounds(p, i, bos, s.len);
  s.chunk0 = 0;
  if (p.cu_seqlens == nullptr) {
    s.b = i;
    s.t0 = 0;
    s.num_chunks = chunks_of(p, p.seqlen);
    s.first_tile = i * s.num_chunks;
  } else {
    s.b = 0;
    s.t0 = bos;
    s.first_tile = p.tile_prefix[i];
    s.num_chunks = p.tile_prefix[i + 1] - s.first_tile;
  }
  return s;
}

// Chunks [c0, c0 + count) of a span, clamped to it.
__device__ __forceinline__ SeqSpan sub_span(const FwdParams &p, const SeqSpan &s, int64_t c0,
                                            int64_t count) {
  SeqSpan r = s;
  c0 = min(c0, s.num_chunks);
  r.first_tile = s.first_tile + c0;
  r.num_chunks = min(count, s.num_chunks - c0);
  r.t0 = s.t0 + (c0 << p.chunk_shift);
  r.len = max(int64_t{0}, min(count << p.chunk_shift, s.len - (c0 << p.chunk_shift)));
  r.chunk0 = s.chunk0 + c0;
  return r;
}

// Largest i in [0, n) with prefix[i] <= x, for prefix[0] <= x < prefix[n] (non-decreasing).
__device__ __forceinline__ int64_t owner_of(const int32_t *prefix, int64_t n, int64_t x) {
  int64_t lo = 0, hi = n;  // prefix[lo] <= x < prefix[hi]
  while (hi - lo > 1) {
    const int64_t mid = (lo + hi) / 2;
    if (prefix[mid] <= x)
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}

struct ChunkRef {
  int64_t tile;   // record index within the head
  int64_t b, t0;  // batch and token coordinates of the chunk's first token
  int n;          // valid rows, 1..C
};

// K1's chunk for grid index x; false for the excess CTAs of varlen's upper-bound grid.
__device__ __forceinline__ bool locate_chunk(const FwdParams &p, int64_t x, ChunkRef &ref) {
  int64_t seq = 0;
  if (p.cu_seqlens == nullptr) {
    seq = x / chunks_of(p, p.seqlen);
  } else {
    if (x >= p.tile_prefix[p.num_seqs]) return false;
    seq = owner_of(p.tile_prefix, p.num_seqs, x);  // the non-empty sequence owning record x
  }
  const SeqSpan s = seq_span(p, seq);
  const int64_t c = x - s.first_tile;
  ref.tile = x;
  ref.b = s.b;
  ref.t0 = s.t0 + (c << p.chunk_shift);
  ref.n = static_cast<int>(min(chunk_tokens(p), s.len - (c << p.chunk_shift)));
  return ref.n > 0;
}

// K1's item i of the overlapped forward (design §4.7, batched mode). The sequences come
// in groups of order_group, the sequences whose pass CTAs one wave starts together (all
// of them where the pass fits one wave); group g's items come before group g + 1's, and
// in a group the order is (chunk j, sequence, head). The pass's CTAs walk their chains
// side by side, wave after wave, so they find their records in about the order K1 writes
// them. 32-bit: the plan overlaps only calls of fewer than 2^31 items, and order_group is
// at most num_seqs.
__device__ __forceinline__ bool locate_item(const FwdParams &p, int32_t i, int64_t &head,
                                            ChunkRef &ref) {
  const int32_t heads = static_cast<int32_t>(p.heads);
  const int32_t chunks = static_cast<int32_t>(chunks_of(p, p.seqlen));
  const int32_t group_items = p.order_group * chunks * heads;
  const int32_t first = i / group_items * p.order_group;  // the group's first sequence
  const int32_t members = min(p.order_group, static_cast<int32_t>(p.num_seqs) - first);
  const int32_t slab = i % group_items / heads, j = slab / members;
  head = i % heads;
  if (j >= chunks) return false;  // past the items (prepare_items bounds i)
  ref.b = first + slab % members;
  ref.tile = ref.b * chunks + j;
  ref.t0 = int64_t{j} << p.chunk_shift;
  ref.n = static_cast<int>(min(chunk_tokens(p), p.seqlen - ref.t0));
  return true;
}

// ---------------------------------------------------------------- segments (design §6)

// Segments of a sequence of `chunks` chunks: an empty sequence has one, of no chunk, so
// that its final state (its initial state) is still written by the rerun.
__device__ __forceinline__ int64_t segments_of(const FwdParams &p, int64_t chunks) {
  return max(int64_t{1}, ceil_div(chunks, p.segment_chunks));
}

// Segments of sequence i: one count in batched mode, prefix differences in varlen mode.
__device__ __forceinline__ int64_t segment_count(const FwdParams &p, int64_t i) {
  if (p.cu_seqlens == nullptr) return segments_of(p, chunks_of(p, p.seqlen));
  return int64_t{p.segment_prefix[i + 1]} - p.segment_prefix[i];
}

struct SegmentRef {
  int64_t seq;    // owning sequence
  int64_t index;  // j: position within the sequence
  int64_t count;  // segments of the sequence
  SeqSpan span;   // the segment's chunks
};

// Global segment s (0 <= s < max_segments); false for the excess of the upper-bound grid.
__device__ __forceinline__ bool locate_segment(const FwdParams &p, int64_t s, SegmentRef &ref) {
  if (p.cu_seqlens == nullptr) {
    const int64_t per_seq = segment_count(p, 0);
    ref.seq = s / per_seq;
    ref.index = s % per_seq;
    ref.count = per_seq;
    if (ref.seq >= p.num_seqs) return false;
  } else {
    if (s >= p.segment_prefix[p.num_seqs]) return false;
    ref.seq = owner_of(p.segment_prefix, p.num_seqs, s);
    ref.index = s - p.segment_prefix[ref.seq];
    ref.count = segment_count(p, ref.seq);
  }
  const SeqSpan whole = seq_span(p, ref.seq);
  ref.span = sub_span(p, whole, ref.index * p.segment_chunks, p.segment_chunks);
  return ref.count > 0;
}

// Global index of segment 0 of sequence i.
__device__ __forceinline__ int64_t first_segment(const FwdParams &p, int64_t i) {
  return p.cu_seqlens == nullptr ? i * segment_count(p, i) : p.segment_prefix[i];
}

// First checkpoint slot of sequence i (flash_kda.h: slots in sequence order).
__device__ __forceinline__ int64_t first_checkpoint(const FwdParams &p, int64_t i) {
  if (p.cu_seqlens == nullptr) return i * (p.seqlen / (chunk_tokens(p) * p.checkpoint_chunks));
  return p.checkpoint_prefix[i];
}

// ---------------------------------------------------------------- varlen prefixes

// Varlen only: per sequence i, prefix[i] = sum over j < i of its count: records
// ceil(len_j / C) (clamped to tiles_per_head), segments ceil(records_j / segment_chunks)
// (clamped to max_segments) and checkpoints floor(len_j / checkpoint_every). One CTA of
// kPrefixThreads threads; thread t scans a contiguous run of sequences. Where the whole
// pass takes the sequences longest first (p.seq_order), their order replaces the segment
// prefix, which that pass does not read: thread i ranks sequence i.
constexpr int kPrefixes = 3;

__device__ __forceinline__ void prefix_counts(const FwdParams &p, int64_t i,
                                              int64_t (&count)[kPrefixes]) {
  int64_t bos, len;
  seq_bounds(p, i, bos, len);
  count[0] = chunks_of(p, len);
  count[1] = p.segment_chunks > 0 ? segments_of(p, count[0]) : 0;
  count[2] = p.checkpoint_chunks > 0 ? len / (chunk_tokens(p) * p.checkpoint_chunks) : 0;
}

// seq_order[r] = the sequence of rank r: more chunks first, ties by index. The ranks are a
// permutation whatever the lengths (a strict total order), so every sequence runs once
// even with garbage cu_seqlens. CTA-uniform call, num_seqs <= kPrefixThreads.
__device__ __forceinline__ void rank_by_length(const FwdParams &p) {
  __shared__ int32_t chunks[kPrefixThreads];
  const int t = threadIdx.x;
  int32_t mine = 0;
  if (t < p.num_seqs) {
    int64_t count[kPrefixes];
    prefix_counts(p, t, count);
    mine = static_cast<int32_t>(min(count[0], p.tiles_per_head));
    chunks[t] = mine;
  }
  __syncthreads();
  if (t >= p.num_seqs) return;
  int32_t rank = 0;
  for (int j = 0; j < p.num_seqs; ++j) rank += chunks[j] > mine || (chunks[j] == mine && j < t);
  p.seq_order[rank] = t;
}

__global__ void __launch_bounds__(kPrefixThreads) prefix_kernel(const FwdParams p) {
  __shared__ int64_t warp_total[kPrefixes][kPrefixThreads / 32];
  int32_t *const prefix[kPrefixes] = {
      p.tile_prefix, p.seq_order != nullptr ? nullptr : p.segment_prefix, p.checkpoint_prefix};
  const int64_t capacity[kPrefixes] = {p.tiles_per_head, p.max_segments, int64_t{1} << 30};
  const int t = threadIdx.x, lane = t % 32, warp = t / 32;
  const int64_t per_thread = ceil_div(p.num_seqs, kPrefixThreads);
  const int64_t first = min(p.num_seqs, t * per_thread);
  const int64_t last = min(p.num_seqs, first + per_thread);

  int64_t local[kPrefixes] = {0, 0, 0}, count[kPrefixes];
  for (int64_t i = first; i < last; ++i) {
    prefix_counts(p, i, count);
    for (int k = 0; k < kPrefixes; ++k) local[k] += count[k];
  }
  int64_t running[kPrefixes];
  for (int k = 0; k < kPrefixes; ++k) {  // warp inclusive scan, then across warps
    int64_t inclusive = local[k];
    for (int off = 1; off < 32; off *= 2) {
      const int64_t up = __shfl_up_sync(0xffffffffu, inclusive, off);
      if (lane >= off) inclusive += up;
    }
    if (lane == 31) warp_total[k][warp] = inclusive;
    running[k] = inclusive - local[k];
  }
  __syncthreads();
  if (warp == 0) {
    for (int k = 0; k < kPrefixes; ++k) {
      int64_t total = warp_total[k][lane];
      for (int off = 1; off < 32; off *= 2) {
        const int64_t up = __shfl_up_sync(0xffffffffu, total, off);
        if (lane >= off) total += up;
      }
      warp_total[k][lane] = total;
    }
  }
  __syncthreads();
  for (int k = 0; k < kPrefixes; ++k) {
    running[k] += warp > 0 ? warp_total[k][warp - 1] : 0;
    if (t == 0 && prefix[k] != nullptr) prefix[k][0] = 0;
  }
  for (int64_t i = first; i < last; ++i) {
    prefix_counts(p, i, count);
    for (int k = 0; k < kPrefixes; ++k) {
      running[k] += count[k];
      if (prefix[k] != nullptr)
        prefix[k][i + 1] = static_cast<int32_t>(min(running[k], capacity[k]));
    }
  }
  if (p.seq_order != nullptr && p.num_seqs <= kPrefixThreads) rank_by_length(p);
}

}  // namespace flash_kda::FLASH_KDA_ARCH
