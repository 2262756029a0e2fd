// SPDX-License-Identifier: MIT
// launch.cuh: the launch sequence of one forward (design §4.1, §4.2, §6.2) and the probe launches,
// all on the caller's stream, no allocation, no synchronisation. Included once per arch
// TU, inside that arch's namespace; FLASH_KDA_DEFINE_ARCH_TABLE then exports the table.
#pragma once
#ifndef FLASH_KDA_ARCH
#error "define FLASH_KDA_ARCH (the arch namespace, e.g. sm90a) before including kda headers"
#endif

#include <cuda.h>          // CUtensorMap (header only: libcuda is reached through the runtime)
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled

#include <flash_kda/flash_kda.h>

#include "arch/table.h"
#include "kda/prepare.cuh"
#include "kda/probes.cuh"
#include "kda/combine.cuh"
#include "kda/config.h"
#include "kda/recurrence.cuh"

namespace flash_kda::FLASH_KDA_ARCH {

inline LaunchStatus launch_status(const char *stage) {
  const cudaError_t err = cudaGetLastError();
  return {err, err == cudaSuccess ? nullptr : stage};
}

// The driver's tensor-map encoder, found once through the runtime, so the library does
// not link libcuda (it still loads on machines without a driver).
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void *fn = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    const cudaError_t err = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000,
                                                             cudaEnableDefault, &found);
    return err == cudaSuccess && found == cudaDriverEntryPointSuccess
               ? reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn)
               : nullptr;
  }();
  return encode;
}

// The current device's shared memory: the opt-in maximum per block and the total per SM.
inline cudaError_t shared_memory_limits(int &per_block_optin, int &per_sm) {
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess)
    err = cudaDeviceGetAttribute(&per_block_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (err == cudaSuccess)
    err = cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device);
  return err;
}

// v as a 4-D tensor (128 columns, heads, tokens, batch) with the caller's strides, for
// K2's tensor copies: one box is the [16 tokens, kBlockV columns] tile of one head; tokens
// past the end of a batch row read as zeros.
template <int kBlockV>
cudaError_t make_value_map(const FwdParams &p, CUtensorMap *map) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr) return cudaErrorNotSupported;
  const Strides &s = p.v_strides;
  const cuuint64_t dims[4] = {kHeadDim, static_cast<cuuint64_t>(p.heads),
                              static_cast<cuuint64_t>(p.seqlen), static_cast<cuuint64_t>(p.batch)};
  // Byte strides of dimensions 1..3; a dimension of extent 1 is never stepped, so any
  // valid stride does (api.cpp accepts any value there).
  auto bytes = [](int64_t elems, int64_t extent) {
    return static_cast<cuuint64_t>(extent > 1 ? 2 * elems : 2 * kHeadDim);
  };
  const cuuint64_t strides[3] = {bytes(s.head, p.heads), bytes(s.token, p.seqlen),
                                 bytes(s.batch, p.batch)};
  const cuuint32_t box[4] = {kBlockV, 1, kChunk, 1};
  const cuuint32_t unit[4] = {1, 1, 1, 1};
  const CUresult res =
      encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, const_cast<uint16_t *>(p.v), dims, strides,
             box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return res == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

// One pass of recurrence_kernel<kNB, kWarps, kGeneral> (grid: units x heads x column
// slices).
template <int kNB, int kWarps, bool kGeneral>
LaunchStatus launch_recurrence(FwdParams p, ChainPass pass, cudaStream_t stream) {
  constexpr int kBlockV = 8 * kNB * kWarps;
  int smem_optin = 0, smem_sm = 0;
  cudaError_t err = shared_memory_limits(smem_optin, smem_sm);
  if (err != cudaSuccess) return {err, "recurrence_kernel device query"};
  p.pass = pass;
  p.block_v = kBlockV;
  // As deep a ring as lets resident_ctas CTAs share an SM (1 KB per CTA is reserved).
  constexpr int kResident = kGeneral ? resident_ctas(kNB, kWarps) : 1;
  const int per_cta = std::min(smem_optin, smem_sm / kResident - 1024);
  p.stages = std::min(kMaxStages, (per_cta - kBarrierBytes) / stage_bytes(kBlockV));
  if (p.stages < 2)
    return {cudaErrorInvalidConfiguration, "recurrence_kernel ring (too little shared memory)"};
  const int smem = recurrence_smem_bytes(kBlockV, p.stages);
  const cudaError_t attr = cudaFuncSetAttribute(recurrence_kernel<kNB, kWarps, kGeneral>,
                                                cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (attr != cudaSuccess) return {attr, "recurrence_kernel shared-memory attribute"};
  CUtensorMap value_map;
  err = make_value_map<kBlockV>(p, &value_map);
  if (err != cudaSuccess) return {err, "recurrence_kernel tensor map of v"};
  const int64_t units = pass == ChainPass::kWhole ? p.num_seqs : p.max_segments;
  const int columns = pass == ChainPass::kSegment ? 2 * kHeadDim : kHeadDim;
  const int64_t ctas = units * p.heads * (columns / kBlockV);
  recurrence_kernel<kNB, kWarps, kGeneral>
      <<<static_cast<unsigned>(ctas), 32 * (kWarps + 1), smem, stream>>>(p, value_map);
  return launch_status("recurrence_kernel launch");
}

// The pass at the width the plan chose; the widths are config.h's. The exact path's
// whole-sequence pass without checkpoints takes the specialised kernel (kGeneral false).
template <bool kGeneral>
LaunchStatus launch_width(const FwdParams &p, ChainPass pass, int block_v, cudaStream_t stream) {
  constexpr RecurrenceShape s0 = kRecurrenceShapes[0], s1 = kRecurrenceShapes[1],
                            s2 = kRecurrenceShapes[2];
  static_assert(kNumRecurrenceShapes == 3, "one case per config.h instantiation");
  switch (block_v) {
    case s0.block_v:
      return launch_recurrence<s0.nb, s0.warps, kGeneral>(p, pass, stream);
    case s1.block_v:
      return launch_recurrence<s1.nb, s1.warps, kGeneral>(p, pass, stream);
    case s2.block_v:
      return launch_recurrence<s2.nb, s2.warps, kGeneral>(p, pass, stream);
    default:
      return {cudaErrorInvalidValue, "recurrence_kernel block_v (not in config.h)"};
  }
}

inline LaunchStatus launch_pass(const FwdParams &p, ChainPass pass, int block_v,
                                cudaStream_t stream) {
  if (pass == ChainPass::kWhole && p.checkpoints == nullptr)
    return launch_width<false>(p, pass, block_v, stream);
  return launch_width<true>(p, pass, block_v, stream);
}

// Phase B: the X_j ring as deep as the device's shared memory per block allows (three
// stages on sm_90 / sm_100, two on sm_120's 99 KB).
inline LaunchStatus launch_combine(const FwdParams &p, cudaStream_t stream) {
  int smem_optin = 0, smem_sm = 0;
  cudaError_t err = shared_memory_limits(smem_optin, smem_sm);
  if (err != cudaSuccess) return {err, "combine_kernel device query"};
  int stages = kCombineMaxStages;
  while (stages > 2 && combine_smem_bytes(stages) > smem_optin) --stages;
  const int smem = combine_smem_bytes(stages);
  err = cudaFuncSetAttribute(combine_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (err != cudaSuccess) return {err, "combine_kernel shared-memory attribute"};
  const int64_t ctas = p.num_seqs * p.heads * kCombineCtasPerHead;
  combine_kernel<<<static_cast<unsigned>(ctas), kCombineThreads, smem, stream>>>(p, stages);
  return launch_status("combine_kernel launch");
}

// Prefixes (varlen) -> K1 over all chunks -> K2: one pass over whole sequences, or the
// segment pass, the combine and the rerun (design §4.1, §6.2).
inline LaunchStatus launch_fwd(const FwdParams &p, cudaStream_t stream) {
  if (p.cu_seqlens != nullptr) {
    prefix_kernel<<<1, kPrefixThreads, 0, stream>>>(p);
    const LaunchStatus st = launch_status("prefix_kernel launch");
    if (st.error != cudaSuccess) return st;
  }
  prepare_kernel<<<dim3(static_cast<unsigned>(p.prepare_tiles), static_cast<unsigned>(p.heads)),
                   kPrepareThreads, 0, stream>>>(p);
  LaunchStatus st = launch_status("prepare_kernel launch");
  if (st.error != cudaSuccess) return st;
  if (p.segment_chunks == 0) return launch_pass(p, ChainPass::kWhole, p.chain_block_v, stream);
  st = launch_pass(p, ChainPass::kSegment, p.segment_block_v, stream);
  if (st.error != cudaSuccess) return st;
  st = launch_combine(p, stream);
  if (st.error != cudaSuccess) return st;
  return launch_pass(p, ChainPass::kRerun, p.chain_block_v, stream);
}

inline LaunchStatus launch_probe_unary(int op, const float *x, float *y, int64_t count,
                                       cudaStream_t stream) {
  const int64_t blocks = std::min<int64_t>(ceil_div(count, kProbeThreads), 65535);
  probe_unary_kernel<<<static_cast<unsigned>(blocks), kProbeThreads, 0, stream>>>(op, x, y, count);
  return launch_status("probe_unary_kernel launch");
}

inline LaunchStatus launch_probe_mma(int op, const void *a, const void *b, void *c, int64_t batch,
                                     int64_t m, int64_t n, int64_t k, cudaStream_t stream) {
  const int64_t blocks = ceil_div(batch * (m / 16) * (n / 8), kProbeThreads / 32);
  const auto *A = static_cast<const uint16_t *>(a);
  const auto *B = static_cast<const uint16_t *>(b);
  if (op == FLASH_KDA_PROBE_MMA_F16_F16)
    probe_mma_kernel<true>
        <<<static_cast<unsigned>(blocks), kProbeThreads, 0, stream>>>(A, B, c, batch, m, n, k);
  else
    probe_mma_kernel<false>
        <<<static_cast<unsigned>(blocks), kProbeThreads, 0, stream>>>(A, B, c, batch, m, n, k);
  return launch_status("probe_mma_kernel launch");
}

}  // namespace flash_kda::FLASH_KDA_ARCH

// Exports this TU's table as flash_kda::table_<arch>; api.cpp declares the same symbol.
#define FLASH_KDA_DEFINE_ARCH_TABLE(NAME, CC)                    \
  namespace flash_kda {                                          \
  extern const ArchTable FLASH_KDA_TABLE_SYMBOL(FLASH_KDA_ARCH); \
  const ArchTable FLASH_KDA_TABLE_SYMBOL(FLASH_KDA_ARCH) = {     \
      NAME,                                                      \
      CC,                                                        \
      FLASH_KDA_FEATURE_FWD | FLASH_KDA_FEATURE_PROBES,          \
      &FLASH_KDA_ARCH::launch_fwd,                               \
      &FLASH_KDA_ARCH::launch_probe_unary,                       \
      &FLASH_KDA_ARCH::launch_probe_mma};                        \
  }
