// SPDX-License-Identifier: MIT
// launch.cuh: the launch sequence of one forward (spec §4.1, §4.2) and the probe launches,
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

// v as a 3-D tensor (128 columns, heads, tokens) for K2's tensor copies: one box is the
// [16 tokens, block_v columns] tile of one head; tokens past the end read as zeros.
inline cudaError_t make_value_map(const FwdParams &p, CUtensorMap *map) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr) return cudaErrorNotSupported;
  const cuuint64_t dims[3] = {kHeadDim, static_cast<cuuint64_t>(p.heads),
                              static_cast<cuuint64_t>(p.total_tokens)};
  const cuuint64_t strides[2] = {2 * kHeadDim, static_cast<cuuint64_t>(p.heads) * 2 * kHeadDim};
  const cuuint32_t box[3] = {static_cast<cuuint32_t>(p.block_v), 1, kChunk};
  const cuuint32_t unit[3] = {1, 1, 1};
  const CUresult res =
      encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<uint16_t *>(p.v), dims, strides,
             box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return res == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

template <int kNB, int kWarps>
LaunchStatus launch_recurrence(FwdParams p, cudaStream_t stream) {
  int device = 0, smem_optin = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess)
    err = cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  if (err != cudaSuccess) return {err, "recurrence_kernel device query"};
  p.stages = std::min(kMaxStages, (smem_optin - kBarrierBytes) / stage_bytes(p.block_v));
  if (p.stages < 2)
    return {cudaErrorInvalidConfiguration, "recurrence_kernel ring (too little shared memory)"};
  const int smem = recurrence_smem_bytes(p.block_v, p.stages);
  const cudaError_t attr = cudaFuncSetAttribute(recurrence_kernel<kNB, kWarps>,
                                                cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (attr != cudaSuccess) return {attr, "recurrence_kernel shared-memory attribute"};
  CUtensorMap value_map;
  err = make_value_map(p, &value_map);
  if (err != cudaSuccess) return {err, "recurrence_kernel tensor map of v"};
  const int64_t ctas = p.num_seqs * p.heads * (kHeadDim / p.block_v);
  recurrence_kernel<kNB, kWarps>
      <<<static_cast<unsigned>(ctas), 32 * (kWarps + 1), smem, stream>>>(p, value_map);
  return launch_status("recurrence_kernel launch");
}

// Tile prefix (varlen) -> K1 over all chunks -> K2 over (sequence, head, slice).
// K2 instantiations <kNB, kWarps> by block_v, chosen on the H200 with
// benchmarks/bench_fwd.py --block-v (whole-forward medians, ms):
//   32  -> <1, 4> latency schedule. T=8192: H=6 0.329, H=24 0.412.
//   64  -> <1, 8> streamed. H=48 0.672 (<2, 4> latency schedule: 0.707; 8x1024 H=8:
//          0.111 vs 0.118).
//   128 -> <2, 8> streamed. H=96 1.064 (<4, 4>: 1.140, <1, 16>: 1.268); T=32768 H=96
//          4.15 (4.40); varlen six sequences H=96 1.04 (1.10).
// Three instantiations instead of the style's two: each width's best shape differs and
// the benchmarks above show the gain.
inline LaunchStatus launch_fwd(const FwdParams &p, cudaStream_t stream) {
  if (p.cu_seqlens != nullptr) {
    tile_prefix_kernel<<<1, kPrefixThreads, 0, stream>>>(p);
    const LaunchStatus st = launch_status("tile_prefix_kernel launch");
    if (st.error != cudaSuccess) return st;
  }
  prepare_kernel<<<dim3(static_cast<unsigned>(p.prepare_tiles), static_cast<unsigned>(p.heads)),
                   kPrepareThreads, 0, stream>>>(p);
  const LaunchStatus st = launch_status("prepare_kernel launch");
  if (st.error != cudaSuccess) return st;
  switch (p.block_v) {
    case 32:
      return launch_recurrence<1, 4>(p, stream);
    case 64:
      return launch_recurrence<1, 8>(p, stream);
    case 128:
      return launch_recurrence<2, 8>(p, stream);
    default:
      return {cudaErrorInvalidValue, "recurrence_kernel block_v"};
  }
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
