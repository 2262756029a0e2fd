// SPDX-License-Identifier: MIT
// workspace.h: the per-chunk records that K1 (prepare) writes and K2 (recurrence) reads
// (design §4.3). Host and device constexpr only, shared with api.cpp, so it lives in the
// arch-independent namespace: it defines no symbol that two arch TUs could both emit.
//
// Record of one (head, chunk), in the order K2 consumes it. A chunk is kBlocks = 1 or 2
// blocks of 16 tokens (16 everywhere in exact mode; 32 where the AUTO plan picks them,
// design §4.8). 16x16 operand tiles are stored in mma.m16n8k16
// A-fragment order (frag_a_index), so each lane of a K2 warp reads its fragment as one
// 16-byte vector, conflict-free, with no ldmatrix:
//   Kd   [blocks][8 k-blocks]  A tiles of Kd  (rows t, cols k)         4096 B a block
//   Qd   [blocks][8 k-blocks]  A tiles of Qd  (rows t, cols k)         4096 B a block
//   KrT  [8 k-blocks][blocks]  A tiles of Kr^T (rows k, cols t)        4096 B a block
//   INV  [block pairs]         A tiles of (I + L)^-1 (rows t, cols s)   512 B a pair
//   Mqk  [block pairs]         A tiles of Mqk  (rows t, cols s)          512 B a pair
//   decay fp32 e[k] = 2^Gtot[k] at decay_index(k)                        512 B
//   beta  bf16 bf(sig(beta_raw[t])), t = 0..16 blocks - 1, padded to 128 B
// Block pairs (I, J), J <= I, in the order 00, 10, 11 (block_pair). With one block this
// is the exact path's record, 13,952 B; with two, 28,288 B (884 B a token against 872).
// The format is free (design §3.5): only the values matter for bit-exactness. sm_90a's
// warpgroup pass reads the same bytes in another order (RecordTiles below).
#pragma once

#include <cstdint>

namespace flash_kda {

constexpr int kChunk = 16;     // tokens per 16-row block, and per chunk of the exact path
constexpr int kHeadDim = 128;  // K = V = D (design §0)

constexpr int kTileElems = 16 * 16;              // one 16x16 operand tile
constexpr int kTileBytes = kTileElems * 2;       // bf16: 512 B, one lane's 16 B times 32 lanes
constexpr int kKBlocks = kHeadDim / 16;          // 16-wide blocks of the head dimension
constexpr int kOpBytes = kKBlocks * kTileBytes;  // 8 bf16 tiles = 4096 B

constexpr int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

constexpr int64_t round_up(int64_t a, int64_t b) {
  return ceil_div(a, b) * b;
}

// Tile of block pair (I, J), J <= I, in the INV and Mqk planes.
constexpr int block_pair(int i, int j) {
  return i * (i + 1) / 2 + j;
}

// The record of a chunk of kBlocks 16-token blocks. Records stay 128-byte aligned (bulk
// copies want 16, L2 sectors 32, lines 128).
template <int kBlocks>
struct RecordLayout {
  static_assert(kBlocks == 1 || kBlocks == 2, "chunks of 16 or 32 tokens");
  static constexpr int kTokens = 16 * kBlocks;
  static constexpr int kPairs = block_pair(kBlocks, 0);
  static constexpr int kOffKd = 0;
  static constexpr int kOffQd = kOffKd + kBlocks * kOpBytes;
  static constexpr int kOffKrT = kOffQd + kBlocks * kOpBytes;
  static constexpr int kOffInv = kOffKrT + kBlocks * kOpBytes;
  static constexpr int kOffMqk = kOffInv + kPairs * kTileBytes;
  static constexpr int kOffDecay = kOffMqk + kPairs * kTileBytes;
  static constexpr int kOffBeta = kOffDecay + kHeadDim * 4;
  static constexpr int kBytes = static_cast<int>(round_up(kOffBeta + kTokens * 2, 128));
  // Byte offsets of the A tile of Kd / Qd block `blk`, k-block kb, and of Kr^T k-block mb,
  // token block blk.
  static constexpr int kd(int blk, int kb) { return kOffKd + (blk * kKBlocks + kb) * kTileBytes; }
  static constexpr int qd(int blk, int kb) { return kOffQd + (blk * kKBlocks + kb) * kTileBytes; }
  static constexpr int krt(int mb, int blk) { return kOffKrT + (mb * kBlocks + blk) * kTileBytes; }
};

// The exact path's record (one block), under the names the kernels have always used.
using Record16 = RecordLayout<1>;
using Record32 = RecordLayout<2>;
constexpr int kOffKd = Record16::kOffKd;
constexpr int kOffQd = Record16::kOffQd;
constexpr int kOffKrT = Record16::kOffKrT;
constexpr int kOffInv = Record16::kOffInv;
constexpr int kOffMqk = Record16::kOffMqk;
constexpr int kOffDecay = Record16::kOffDecay;
constexpr int kOffBeta = Record16::kOffBeta;
constexpr int kRecordBytes = Record16::kBytes;  // 13,952 B

static_assert(kRecordBytes == 13952 && Record32::kBytes == 28288, "record sizes (design §4.3)");
static_assert(Record32::kBytes % 128 == 0 && kRecordBytes % 128 == 0,
              "records must keep 128-byte alignment");
static_assert(Record32::kOffBeta % 16 == 0 && Record32::kOffDecay % 16 == 0 && kOffBeta % 16 == 0 &&
                  kOffDecay % 16 == 0,
              "every plane must allow 16-byte vector access");

// Bytes of one record of a chunk of `tokens` (16 or 32) tokens.
constexpr int record_bytes(int tokens) {
  return tokens == 32 ? Record32::kBytes : Record16::kBytes;
}

// Element offset of (row i, col j) of a 16x16 tile in A-fragment order: lane
// (i % 8) * 4 + (j % 8) / 2 holds 8 values, register (i / 8) + 2 * (j / 8), half j % 2.
constexpr int frag_a_index(int i, int j) {
  return ((i % 8) * 4 + (j % 8) / 2) * 8 + ((i / 8) + 2 * (j / 8)) * 2 + (j % 2);
}

// Float offset of e[k] in the decay plane: lanes with g = lane / 4 read 16 contiguous
// floats e[16 mb + g + 8 h] for mb = 0..7, h = 0..1 (the rows of their accumulators).
constexpr int decay_index(int k) {
  return ((k % 8) * 8 + k / 16) * 2 + (k / 8) % 2;
}

// Its inverse: the key whose decay K1 stores at float f (f = (8 g + mb) 2 + h).
constexpr int decay_key(int f) {
  return 16 * ((f / 2) % 8) + f / 16 + 8 * (f % 2);
}

// The 16-token record in tile order, for the warpgroup pass (sm_90a, recurrence_wg.cuh,
// design §4.9): the same 13,952 bytes as Record16, the operands as wgmma reads them from
// shared memory (B operands, no swizzle, K-major). A 16 x 16 tile (rows n, columns k) is
// four 8 x 8 core matrices of 16-byte rows: core (n / 8, k / 8) at 256 (n / 8) + 128
// (k / 8), row n % 8 at 16 (n % 8) within it, so a descriptor advances 128 bytes between the
// k halves (its leading-dimension offset) and 256 between row groups (its stride offset).
//   Kd, Qd  k-block kb: the Kd tile (rows t) at 1024 kb, the Qd tile at 1024 kb + 512,
//           so that one N = 32 descriptor covers [Kd; Qd]
//   KrT     key block mb: the Kr^T tile (rows k, columns t) at 8192 + 512 mb; the 16 row
//           groups of all blocks make one N = 128 operand
//   INV, Mqk  rows t, columns s, as Record16's
//   decay   e[k] at tile_decay_index(k): the 32 floats a lane of quad position cq reads
//   beta    as Record16's
struct RecordTiles {
  static constexpr int kKdQd = 0;
  static constexpr int kKdQdStride = 2 * kTileBytes;  // bytes from one k-block to the next
  static constexpr int kQdInBlock = kTileBytes;
  static constexpr int kKrT = Record16::kOffKrT;
  static constexpr int kInv = Record16::kOffInv;
  static constexpr int kMqk = Record16::kOffMqk;
  static constexpr int kDecay = Record16::kOffDecay;
  static constexpr int kBeta = Record16::kOffBeta;
  static constexpr int kBytes = Record16::kBytes;
  static constexpr int kCoreKBytes = 128;    // between the k halves of a tile
  static constexpr int kCoreRowBytes = 256;  // between its 8-row groups
};

// Byte offset in a tile-order tile of register r of lane l's A fragment (frag_a_index: its
// word is (row 8 (r % 2) + l / 4, columns 8 (r / 2) + 2 (l % 4), + 1)). The 32 lanes' words
// of one register are 128 contiguous bytes.
constexpr int tile_word_offset(int r, int lane) {
  return (r % 2) * RecordTiles::kCoreRowBytes + (r / 2) * RecordTiles::kCoreKBytes + 4 * lane;
}

// Row and first column of the 16-byte vector v (v = 0..31, at byte 16 v) of a tile-order
// tile: row n % 8 of core matrix (n / 8, column half), i.e. 8 elements of one tile row.
constexpr uint32_t tile_vec_row(uint32_t v) {
  return 8 * (v / 16) + v % 8;
}
constexpr uint32_t tile_vec_col(uint32_t v) {
  return 8 * (v / 8 % 2);
}

// Float offset of e[k] in a tile-order decay plane. A lane of quad position cq = lane % 4
// reads the 32 floats e[8 j + 2 cq], e[8 j + 2 cq + 1], j = 0..15 (the key columns of its
// state-update accumulators), in that order p = 2 j + h, as eight float4: float4 m of quad
// position cq at 16-byte slot 4 m + cq, so that one load of the quad's four lanes reads 64
// contiguous bytes (with each lane's 32 floats contiguous, the four were 128 bytes apart, in
// the same banks: a four-way conflict on every load).
constexpr int tile_decay_index(int k) {
  const int cq = (k % 8) / 2, p = 2 * (k / 8) + k % 2;
  return 16 * (p / 4) + 4 * cq + p % 4;
}

// Its inverse: the key whose decay K1 stores at float f (f = 16 m + 4 cq + p % 4, m = p / 4).
constexpr int tile_decay_key(int f) {
  const int cq = (f % 16) / 4, p = 4 * (f / 16) + f % 4;
  return 8 * (p / 2) + 2 * cq + p % 2;
}

// The tile order checked at compile time: every fragment word and every 16-byte vector lands
// where the core-matrix layout puts its (row, column) pair, and each decay order is a permutation
// of the 128 keys whose inverse is the one K1 stores by (prepare.cuh decay_vec).
constexpr bool tile_order_consistent() {
  for (int r = 0; r < 4; ++r)
    for (int lane = 0; lane < 32; ++lane) {
      const int row = lane / 4 + 8 * (r % 2), col = 2 * (lane % 4) + 8 * (r / 2);
      const int core =
          (row / 8) * RecordTiles::kCoreRowBytes + (col / 8) * RecordTiles::kCoreKBytes;
      if (tile_word_offset(r, lane) != core + 16 * (row % 8) + 2 * (col % 8)) return false;
    }
  for (uint32_t v = 0; v < 32; ++v) {
    const uint32_t row = tile_vec_row(v), col = tile_vec_col(v);
    if (row >= 16 || (row / 8) * RecordTiles::kCoreRowBytes + (col / 8) * RecordTiles::kCoreKBytes +
                             16 * (row % 8) !=
                         16 * v)
      return false;
  }
  for (int f = 0; f < kHeadDim; ++f) {
    const int k = decay_key(f), t = tile_decay_key(f);
    if (k < 0 || k >= kHeadDim || decay_index(k) != f) return false;
    if (t < 0 || t >= kHeadDim || tile_decay_index(t) != f) return false;
  }
  return true;
}
static_assert(tile_order_consistent(), "tile order (RecordTiles)");

// Which order K1 writes 16-token records in: for the mma.sync passes, or for the warpgroup
// pass (32-token records have only the first).
enum class RecordOrder { kFragments, kTiles };

// Byte offset in a 16-token record of the word holding (row t, columns 2 cp, 2 cp + 1) of the
// Kd plane (or the Qd plane), in `order`: where the unbounded gates' K1 stores Kd and Qd
// straight from registers (prepare.cuh unbounded_decays; design §4.4).
constexpr int plane_word_offset(RecordOrder order, bool qd, int t, int cp) {
  const int kb = cp / 8, c = cp % 8;  // k-block; pair within it
  if (order == RecordOrder::kFragments)
    return (qd ? kOffQd : kOffKd) + kb * kTileBytes +
           4 * (((t % 8) * 4 + c % 4) * 4 + t / 8 + 2 * (c / 4));
  return RecordTiles::kKdQd + kb * RecordTiles::kKdQdStride + (qd ? RecordTiles::kQdInBlock : 0) +
         (t / 8) * RecordTiles::kCoreRowBytes + (c / 4) * RecordTiles::kCoreKBytes + 16 * (t % 8) +
         4 * (c % 4);
}

// The words land where the fragments (frag_a_index) and the tile-order vectors (tile_vec_row,
// tile_vec_col, at 16 v of a tile) of the other K1 put those elements.
constexpr bool plane_words_consistent() {
  for (int qd = 0; qd < 2; ++qd)
    for (int t = 0; t < kChunk; ++t)
      for (int cp = 0; cp < kHeadDim / 2; ++cp) {
        const int kb = cp / 8, col = 2 * cp % 16;
        const int frag = (qd ? kOffQd : kOffKd) + kb * kTileBytes + 2 * frag_a_index(t, col);
        if (plane_word_offset(RecordOrder::kFragments, qd, t, cp) != frag) return false;
        int tile = -1;
        for (uint32_t v = 0; v < 32; ++v)
          if (tile_vec_row(v) == static_cast<uint32_t>(t) && tile_vec_col(v) == 8u * (col / 8))
            tile = RecordTiles::kKdQd + kb * RecordTiles::kKdQdStride +
                   (qd ? RecordTiles::kQdInBlock : 0) + 16 * static_cast<int>(v) + 2 * (col % 8);
        const int at = plane_word_offset(RecordOrder::kTiles, qd, t, cp);
        if (at != tile) return false;
        // unbounded_decays' 8-byte stores: in tile order, rows 2 r, 2 r + 1 of pairs
        // 4 m .. 4 m + 3 fill one aligned 32-byte sector, row by row, pair by pair.
        const int in_sector = 16 * (t % 2) + 4 * (cp % 4);
        if (at % 32 != in_sector ||
            at - in_sector != plane_word_offset(RecordOrder::kTiles, qd, t & ~1, cp & ~3))
          return false;
      }
  return true;
}
static_assert(plane_words_consistent(), "Kd / Qd words of the unbounded gates' K1");

// Records per head: an upper bound on the chunks of `tokens` tokens (16 or 32) of any
// split of total_tokens into num_seqs sequences (design §1.6).
constexpr int64_t tiles_per_head(int64_t total_tokens, int64_t num_seqs, int tokens = kChunk) {
  return ceil_div(total_tokens, tokens) + num_seqs;
}

// prefix_kernel's threads (one CTA): it scans the varlen prefix arrays, and ranks up to this
// many sequences by length, one a thread, for the whole pass's longest-first order, which
// it writes in the segment prefix's space (that pass has no segments; design §4.2).
constexpr int kPrefixThreads = 1024;

// The overlapped forward's work counter (design §4.7), after the ready flags (one uint32
// per record); the launch zeroes flags and counter together.
struct OverlapSync {
  uint32_t next_item;  // K1's next item
  uint32_t stayers;    // K1 CTAs that work until the items run out (K1 leaving the pass's SMs)
  uint32_t pad[30];    // 128 bytes: the workspace stays 128-byte aligned
};
static_assert(sizeof(OverlapSync) == 128, "keeps the workspace 128-byte aligned");

// Bytes of the ready flags and the counters.
constexpr int64_t ready_bytes(int64_t heads, int64_t tiles) {
  return round_up(4 * heads * tiles, 128) + static_cast<int64_t>(sizeof(OverlapSync));
}

}  // namespace flash_kda
