// SPDX-License-Identifier: MIT
// launch.cuh: the launch sequence of one forward (design §4.1, §4.2, §6.2), issued through a
// LaunchSink (launches.h: the caller's stream, or a graph replay), and the probe launches; no
// allocation, no synchronisation. Included once per arch TU, inside that arch's namespace;
// FLASH_KDA_DEFINE_ARCH_TABLE then exports the table.
#pragma once
#ifndef FLASH_KDA_ARCH
#error "define FLASH_KDA_ARCH (the arch namespace, e.g. sm90a) before including kda headers"
#endif

#include <cuda.h>          // CUtensorMap (header only: libcuda is reached through the runtime)
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <mutex>
#include <string>
#include <utility>

#include <flash_kda/flash_kda.h>

#include "arch/table.h"
#include "launches.h"
#include "kda/prepare.cuh"
#include "kda/probes.cuh"
#include "kda/combine.cuh"
#include "kda/config.h"
#include "kda/empty.cuh"
#include "kda/recurrence.cuh"
#include "kda/recurrence_wg.cuh"
#include "plan.h"

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

// What one CTA of a kernel holds on an SM: the registers of its fullest sub-partition
// (an SM's register file is four of regs_sm / 4; a CTA's warps are spread over them, so
// ceil(warps / 4) land on one; registers are allocated in units of 8 a thread), shared
// memory (static, dynamic and the 1 KB the system reserves) and threads. On the H200
// the exact <1, 4> pass (5 warps of 192 registers) left room for 3 K1 CTAs (4 warps of
// 40), not the 6 that the SM's total registers suggest: with 4 its CTAs waited for K1's.
constexpr int kReservedSmem = 1024;  // shared memory the system reserves for each CTA

struct Footprint {
  int sub_partition_regs, smem, threads;
  int static_smem;  // of the kernel itself (smem counts it)
};

// What the runtime says about a kernel on a device, asked once (a call reads it for every
// pass it configures): its registers a thread and static shared memory; and the dynamic
// shared-memory limit (cudaFuncAttributeMaxDynamicSharedMemorySize) last set for it, so that
// a launch sets the limit only when it asks for another value than the launch before: each
// launch still runs with the limit set to its own request, as when every launch set it, without
// the runtime call (~1-2 us) for a repeated call. Like DeviceFacts it assumes the device's
// context lives as long as the process (a cudaDeviceReset, which PyTorch never makes, would
// reset the limits behind it).
struct KernelFacts {
  int device;
  const void *kernel;
  int num_regs, static_smem, smem_limit;
};

class KernelFactsTable {
 public:
  // The facts of `kernel` on the current device, its shared-memory limit set to `smem` bytes
  // (0: left as it is).
  cudaError_t get(const void *kernel, int smem, KernelFacts &out) {
    int device = 0;
    cudaError_t err = cudaGetDevice(&device);
    if (err != cudaSuccess) return err;
    const std::lock_guard<std::mutex> lock(lock_);
    KernelFacts *entry = find(device, kernel);
    KernelFacts fresh{device, kernel, 0, 0, 0};
    KernelFacts &facts = entry != nullptr ? *entry : fresh;
    if (entry == nullptr || facts.kernel == nullptr) {
      cudaFuncAttributes attr;
      err = cudaFuncGetAttributes(&attr, kernel);
      if (err != cudaSuccess) return err;
      facts = {device, kernel, attr.numRegs, static_cast<int>(attr.sharedSizeBytes), 0};
    }
    if (smem > 0 && smem != facts.smem_limit) {
      err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
      if (err != cudaSuccess) return err;
      facts.smem_limit = smem;
    }
    out = facts;
    return cudaSuccess;
  }

 private:
  static constexpr int kSlots = 1024;  // kernels x devices; a full table asks every call
  // The slot of (device, kernel), claimed when free; nullptr when the table is full.
  KernelFacts *find(int device, const void *kernel) {
    const uintptr_t h = reinterpret_cast<uintptr_t>(kernel) / 16 + static_cast<uintptr_t>(device);
    for (int i = 0; i < kSlots; ++i) {
      KernelFacts &slot = slots_[(h + i) % kSlots];
      if (slot.kernel == kernel && slot.device == device) return &slot;
      if (slot.kernel == nullptr) {
        slot.device = device;
        return &slot;  // facts.kernel == nullptr: get() fills it
      }
    }
    return nullptr;
  }
  std::mutex lock_;
  KernelFacts slots_[kSlots] = {};
};

inline KernelFactsTable &kernel_facts() {
  static KernelFactsTable table;
  return table;
}

// cudaFuncSetAttribute(kernel, MaxDynamicSharedMemorySize, smem) unless that is the value set last.
inline cudaError_t allow_smem(const void *kernel, int smem) {
  KernelFacts facts;
  return kernel_facts().get(kernel, smem, facts);
}

inline cudaError_t footprint(const void *kernel, int threads, int dynamic_smem, Footprint &f) {
  KernelFacts facts;
  const cudaError_t err = kernel_facts().get(kernel, 0, facts);
  if (err != cudaSuccess) return err;
  const int warps = (threads + 31) / 32;
  f.sub_partition_regs = (warps + 3) / 4 * 32 * ((facts.num_regs + 7) / 8 * 8);
  f.static_smem = facts.static_smem;
  f.smem = f.static_smem + dynamic_smem + kReservedSmem;
  f.threads = warps * 32;
  return cudaSuccess;
}

// What the launches read about the current device: its attributes, and K1's occupancy and
// footprint (a property of the module) for 16- and 32-token records. Queried once per
// device and remembered (they do not change while the process runs): ~10 runtime queries
// fewer a call. The 32-token K1's dynamic shared-memory limit is raised here, once. Under
// simulated limits (TestSwitches, simulate) the fields are the simulated device's and
// `real` the device's own.
struct DeviceLimits {
  int sms, regs_sm, smem_optin, smem_sm, threads_sm;
};

// The K1 kernels a call can run (prepare.cuh K1Variant): 16- and 32-token records of FlashKDA's
// contract, the same with the beta forms or the stable inverse, and those of the unbounded gates
// (design §2.5).
enum K1Kind {
  kK1Bounded16 = 0,
  kK1Bounded32 = 1,
  kK1Forms16 = 2,
  kK1Forms32 = 3,
  kK1Unbounded16 = 4,
  kK1Unbounded32 = 5,
  kK1Kinds = 6
};

struct DeviceFacts {
  int sms, regs_sm, smem_optin, smem_sm, threads_sm;
  int k1_alone[kK1Kinds];    // prepare_overlap_kernel CTAs per SM by itself, by K1Kind
  int k1_leaving[kK1Kinds];  // its leaving form's (K1Place::kLeaving), by itself
  int k1_prepare[kK1Kinds];  // prepare_kernel CTAs per SM by itself
  Footprint k1[kK1Kinds];    // what one prepare_overlap_kernel CTA holds
  DeviceLimits real;
  bool simulated;
  int plan_sms;  // the plan's SM count: sms, or a simulated count above the device's
};

// K1 of a kind: its kernels (one record per CTA, an fp32 g's own where the kind has one and
// the call asks for it: prepare.cuh GateLoad; beside the pass; leaving the pass's SMs, the
// beside form where the kind has no leaving form of its own; the lead of K1 leaving them),
// threads and dynamic shared memory.
struct K1Launch {
  const void *kernel, *overlap, *leaving, *lead;
  int threads, smem;
  const char *name, *overlap_name, *leaving_name, *lead_name;
};

// The names of K1's kernels as the source writes the instantiation ("prepare_kernel<1,
// RecordOrder::kFragments>"; FlashKDA's variant and the beside placement, the defaults,
// unnamed), built once.
template <int kBlocks, RecordOrder kOrder, K1Variant kVariant>
const std::string *k1_names() {
  // the order and variant (prepare_lead_kernel's arguments: it has no block count)
  static const std::string form =
      (kOrder == RecordOrder::kTiles ? "RecordOrder::kTiles" : "RecordOrder::kFragments") +
      std::string(kVariant == K1Variant::kBoundedForms ? ", K1Variant::kBoundedForms"
                  : kVariant == K1Variant::kUnbounded  ? ", K1Variant::kUnbounded"
                                                       : "");
  static const std::string args = std::to_string(kBlocks) + ", " + form;
  static const std::string names[5] = {
      "prepare_kernel<" + args + ">", "prepare_overlap_kernel<" + args + ">",
      "prepare_overlap_kernel<" + args + ", K1Place::kLeaving>",
      "prepare_lead_kernel<" + form + ">", "prepare_kernel<" + args + ", GateLoad::kBeforeWait>"};
  return names;
}

// Whether K1 of kBlocks and kVariant has a kernel of its own for an fp32 g (one record per
// CTA, GateLoad::kBeforeWait): the 16-token unbounded K1 on sm_90a, where it was measured.
template <int kBlocks, K1Variant kVariant>
constexpr bool has_fp32_g_form() {
  return kVariant == K1Variant::kUnbounded && kBlocks == 1 && FLASH_KDA_CC == 90;
}

template <int kBlocks, RecordOrder kOrder, K1Variant kVariant>
K1Launch k1_kernels(bool fp32_g = false) {
  const std::string *names = k1_names<kBlocks, kOrder, kVariant>();
  const void *kernel = reinterpret_cast<const void *>(prepare_kernel<kBlocks, kOrder, kVariant>);
  const char *name = names[0].c_str();
  if constexpr (has_fp32_g_form<kBlocks, kVariant>()) {
    if (fp32_g) {
      kernel = reinterpret_cast<const void *>(
          prepare_kernel<kBlocks, kOrder, kVariant, GateLoad::kBeforeWait>);
      name = names[4].c_str();
    }
  }
  const void *const overlap =
      reinterpret_cast<const void *>(prepare_overlap_kernel<kBlocks, kOrder, kVariant>);
  const void *leaving = overlap;
  const char *leaving_name = names[1].c_str();
  const void *lead = nullptr;  // 16-token records only (prepare.cuh prepare_lead_kernel)
  if constexpr (kBlocks == 1)
    lead = reinterpret_cast<const void *>(prepare_lead_kernel<kOrder, kVariant>);
  if constexpr (has_leaving_form<kBlocks, kVariant>()) {
    leaving = reinterpret_cast<const void *>(
        prepare_overlap_kernel<kBlocks, kOrder, kVariant, K1Place::kLeaving>);
    leaving_name = names[2].c_str();
  }
  return {kernel,
          overlap,
          leaving,
          lead,
          K1Shape<kBlocks>::kThreads,
          K1Shape<kBlocks>::kDynamicSmem,
          name,
          names[1].c_str(),
          leaving_name,
          names[3].c_str()};
}

// The 16-token K1 of a variant in `order` (fp32_g: K1 first for an fp32 g, k1_kernels).
template <K1Variant kVariant>
K1Launch k1_kernels16(RecordOrder order, bool fp32_g = false) {
#if FLASH_KDA_CC == 90
  if (order == RecordOrder::kTiles) return k1_kernels<1, RecordOrder::kTiles, kVariant>(fp32_g);
#endif
  return k1_kernels<1, RecordOrder::kFragments, kVariant>(fp32_g);
}

// K1 of a kind in `order`; fp32_g: a call with an fp32 g (the kind's own K1-first kernel for
// it, where it has one).
inline K1Launch k1_launch(int kind, RecordOrder order = RecordOrder::kFragments,
                          bool fp32_g = false) {
  constexpr RecordOrder kFrags = RecordOrder::kFragments;
  switch (kind) {
    case kK1Bounded32:
      return k1_kernels<2, kFrags, K1Variant::kBounded>();
    case kK1Forms32:
      return k1_kernels<2, kFrags, K1Variant::kBoundedForms>();
    case kK1Forms16:
      return k1_kernels16<K1Variant::kBoundedForms>(order);
    case kK1Unbounded16:
      return k1_kernels16<K1Variant::kUnbounded>(order, fp32_g);
    case kK1Unbounded32:
      return k1_kernels<2, kFrags, K1Variant::kUnbounded>();
    default:
      return k1_kernels16<K1Variant::kBounded>(order);
  }
}

// Chunks of the call, in 16-token blocks (1 or 2).
inline int chunk_blocks(const FwdParams &p) {
  return p.chunk_shift == 5 ? 2 : 1;
}

// The K1 kind of a call: FlashKDA's kernels for FlashKDA's contract (an fp32 g comes with the
// log-decay gate only).
inline int k1_kind(const FwdParams &p) {
  const bool forms = p.beta_prob || p.beta_fp32 || p.stable_inverse;
  const bool unbounded = p.gate != Gate::kLowerBound;
  if (chunk_blocks(p) == 2) return unbounded ? kK1Unbounded32 : forms ? kK1Forms32 : kK1Bounded32;
  if (unbounded) return kK1Unbounded16;
  return forms ? kK1Forms16 : kK1Bounded16;
}

inline cudaError_t query_device_facts(int device, DeviceFacts &f) {
  f.simulated = false;
  const std::pair<int *, cudaDeviceAttr> attrs[] = {
      {&f.sms, cudaDevAttrMultiProcessorCount},
      {&f.regs_sm, cudaDevAttrMaxRegistersPerMultiprocessor},
      {&f.smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin},
      {&f.smem_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor},
      {&f.threads_sm, cudaDevAttrMaxThreadsPerMultiProcessor}};
  for (const auto &[value, attr] : attrs) {
    const cudaError_t err = cudaDeviceGetAttribute(value, attr, device);
    if (err != cudaSuccess) return err;
  }
  for (int kind = 0; kind < kK1Kinds; ++kind) {
    const K1Launch k1 = k1_launch(kind);
    const bool own_leaving = k1.leaving != k1.overlap;  // else the beside form leaves too
    for (const void *kernel :
         {k1.kernel, k1.overlap, own_leaving ? k1.leaving : nullptr, k1.lead}) {
      if (k1.smem == 0 || kernel == nullptr) continue;
      const cudaError_t err = allow_smem(kernel, k1.smem);
      if (err != cudaSuccess) return err;
    }
    cudaError_t err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&f.k1_alone[kind], k1.overlap,
                                                                    k1.threads, k1.smem);
    f.k1_leaving[kind] = f.k1_alone[kind];
    if (err == cudaSuccess && own_leaving)
      err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&f.k1_leaving[kind], k1.leaving,
                                                          k1.threads, k1.smem);
    if (err == cudaSuccess)
      err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&f.k1_prepare[kind], k1.kernel,
                                                          k1.threads, k1.smem);
    if (err == cudaSuccess) err = footprint(k1.overlap, k1.threads, k1.smem, f.k1[kind]);
    if (err != cudaSuccess) return err;
  }
  f.real = {f.sms, f.regs_sm, f.smem_optin, f.smem_sm, f.threads_sm};
  f.plan_sms = f.sms;
  return cudaSuccess;
}

// CTAs of footprint f (on the simulated device) that `d` holds an SM by its limits, at most
// `real`, what the device itself holds.
inline int resident_on(const DeviceFacts &d, const Footprint &f, int real) {
  const int by_regs = d.regs_sm >= d.real.regs_sm ? real : real * d.regs_sm / d.real.regs_sm;
  return std::min({real, by_regs, d.smem_sm / f.smem, d.threads_sm / f.threads});
}

// Simulated limits (TestSwitches): the facts clamped to the smaller device, and K1's CTAs
// per SM as that device's occupancy gives them. The SM count the launch sizes its grids by
// stays at most the device's (more cannot be resident at once); the plan takes the
// simulated count (plan_sms).
inline void simulate(const TestSwitches &t, DeviceFacts &d) {
  if (!t.simulated()) return;
  d.simulated = true;
  const auto clamp = [](int &value, int limit) {
    if (limit > 0) value = std::min(value, limit);
  };
  if (t.sms > 0) d.plan_sms = t.sms;
  clamp(d.sms, t.sms);
  clamp(d.regs_sm, t.regs_sm);
  clamp(d.smem_optin, t.smem_optin);
  clamp(d.smem_sm, t.smem_sm);
  clamp(d.threads_sm, t.threads_sm);
  for (int b = 0; b < kK1Kinds; ++b) {  // every K1 kernel: the same threads and shared memory
    for (int *ctas : {&d.k1_alone[b], &d.k1_leaving[b], &d.k1_prepare[b]}) {
      *ctas = resident_on(d, d.k1[b], *ctas);
      clamp(*ctas, t.k1_ctas_sm);
    }
  }
}

// A value per device: devices 0..63 are queried on first use and remembered (a failed query
// is not), others on every call. query(value) returns a status whose value-initialised form
// (cudaSuccess, {cudaSuccess, nullptr}) is success; ok(status) tells it.
template <typename T>
class PerDevice {
 public:
  template <typename Query, typename Ok>
  auto get(int device, T &out, Query query, Ok ok) -> decltype(query(out)) {
    if (device < 0 || device >= kRemembered) return query(out);
    if (!known_[device].load(std::memory_order_acquire)) {
      const std::lock_guard<std::mutex> lock(filling_);
      if (!known_[device].load(std::memory_order_relaxed)) {
        const auto status = query(values_[device]);
        if (!ok(status)) return status;
        known_[device].store(true, std::memory_order_release);
      }
    }
    out = values_[device];
    return {};
  }

 private:
  static constexpr int kRemembered = 64;
  std::atomic<bool> known_[kRemembered] = {};
  T values_[kRemembered] = {};
  std::mutex filling_;
};

// The current device's facts, remembered per device (PerDevice); then the simulated limits
// of `t`, if any.
inline cudaError_t device_facts(const TestSwitches &t, DeviceFacts &out) {
  static PerDevice<DeviceFacts> facts;
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess)
    err = facts.get(
        device, out, [&](DeviceFacts &f) { return query_device_facts(device, f); },
        [](cudaError_t e) { return e == cudaSuccess; });
  if (err == cudaSuccess) simulate(t, out);
  return err;
}

// Dynamic shared memory for a launch of `kernel` that asks for `dynamic` bytes on the
// simulated device (as is without simulated limits): scaled by the device's shared memory
// per SM over the simulated one's, so that the kernels a simulated SM holds at once, alone
// or together, are the ones this SM holds, and never more of this kernel than the simulated
// device holds alone. At most the device's opt-in limit, whose attribute it sets. -1 where
// the kernel does not fit the simulated device at all.
inline int padded_smem(const DeviceFacts &d, const void *kernel, int threads, int dynamic) {
  if (!d.simulated) return dynamic;
  Footprint f;
  int real = 0;
  if (footprint(kernel, threads, dynamic, f) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&real, kernel, threads, dynamic) != cudaSuccess)
    return -1;
  const int n = resident_on(d, f, real);
  if (n < 1 || f.smem - kReservedSmem > d.smem_optin) return -1;
  const int64_t scaled = int64_t{f.smem} * d.real.smem_sm / d.smem_sm;
  const int64_t alone = n < real ? d.real.smem_sm / (n + 1) + 128 : 0;
  const int64_t total =
      std::min<int64_t>(std::max(scaled, alone) - kReservedSmem, d.real.smem_optin);
  const int padded = std::max(dynamic, static_cast<int>(total) - f.static_smem);
  if (allow_smem(kernel, padded) != cudaSuccess) return -1;
  return padded;
}

// v as a 5-D tensor (8 columns, tokens, 16 column groups, heads, batch) with the caller's
// strides, for K2's tensor copies: one box is the [chunk tokens, p.block_v columns] tile of
// one head, landed as [p.block_v / 8 groups][chunk tokens][8 columns] (recurrence.cuh
// value_offset); tokens past the end of a batch row read as zeros.
inline cudaError_t make_value_map(const FwdParams &p, CUtensorMap *map) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr) return cudaErrorNotSupported;
  const Strides &s = p.v_strides;
  const cuuint64_t dims[5] = {kValueGroup, static_cast<cuuint64_t>(p.seqlen),
                              kHeadDim / kValueGroup, static_cast<cuuint64_t>(p.heads),
                              static_cast<cuuint64_t>(p.batch)};
  // Byte strides of dimensions 1..4; a dimension of extent 1 is never stepped, so any
  // valid stride does (api.cpp accepts any value there).
  auto bytes = [](int64_t elems, int64_t extent) {
    return static_cast<cuuint64_t>(extent > 1 ? 2 * elems : 2 * kHeadDim);
  };
  const cuuint64_t strides[4] = {bytes(s.token, p.seqlen), 2 * kValueGroup, bytes(s.head, p.heads),
                                 bytes(s.batch, p.batch)};
  const cuuint32_t box[5] = {kValueGroup, static_cast<cuuint32_t>(kChunk * chunk_blocks(p)),
                             static_cast<cuuint32_t>(p.block_v / kValueGroup), 1, 1};
  const cuuint32_t unit[5] = {1, 1, 1, 1, 1};
  const CUresult res =
      encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 5, const_cast<uint16_t *>(p.v), dims, strides,
             box, unit, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return res == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

// One recurrence pass as launched: the instantiation, its grid and block, its shared
// memory (ring depth from the device's limit) and what it holds on an SM.
struct PassLaunch {
  const void *kernel;
  int64_t ctas;
  int threads;
  int smem;  // dynamic shared memory (on the simulated device, under simulated limits)
  FwdParams params;
  RecordOrder records = RecordOrder::kFragments;  // the order K1 must write them in
  int resident;                                   // CTAs per SM it is compiled for
  int32_t kind = kLaunchedRecurrence;             // or kLaunchedWarpgroup
  PassCode code = PassCode::kPlain;               // the instantiation's
  const char *name = "";                          // the instantiation (record_launch)
  CUtensorMap value_map;                          // seal_pass
  int launch_smem = 0;                            // seal_pass: padded under simulated limits
};

// A test's record of what a call launched (TestSwitches::record): the kernel's name as the
// source writes it (recurrence_kernel<1, 8, kGeneral, 1>) and what it was launched with.
inline void record_launch(const FwdParams &p, const char *name, LaunchedKernel k) {
  LaunchRecord *r = p.test.record;
  if (r == nullptr || r->count >= kMaxLaunches) return;
  std::snprintf(k.name, sizeof(k.name), "%s", name);
  r->kernels[r->count++] = k;
}

inline const char *code_name(PassCode code) {
  constexpr const char *kNames[] = {"kPlain", "kGeneral", "kStates", "kRerun"};
  return kNames[static_cast<int>(code)];
}

// "recurrence_kernel<1, 8, kGeneral, 1>": an instantiation's name, built once.
template <int kA, int kB, PassCode kCode, int kD = 0>
const char *instantiation_name(const char *kernel) {
  static const std::string name = std::string(kernel) + "<" + std::to_string(kA) + ", " +
                                  std::to_string(kB) + ", " + code_name(kCode) +
                                  (kD > 0 ? ", " + std::to_string(kD) : std::string()) + ">";
  return name.c_str();
}

// CTAs of pass `pass` at width block_v: units (sequences, or segments) x heads x column
// slices (the segment pass has 256 columns: values and transition).
inline int64_t pass_ctas(const FwdParams &p, ChainPass pass, int block_v) {
  const int64_t units = pass == ChainPass::kWhole ? p.num_seqs : p.max_segments;
  const int columns = pass == ChainPass::kSegment ? 2 * kHeadDim : kHeadDim;
  return units * p.heads * (columns / block_v);
}

// Pass `pass` of a kernel on recurrence.cuh's ring (recurrence_kernel, the warpgroup pass)
// of width block_v and chunks of `blocks` 16-token blocks: the ring as deep as lets
// `resident` CTAs share an SM (1 KB per CTA is reserved), the grid (units x heads x column
// slices) and the kernel's shared-memory attribute. The CTA asks for enough shared memory
// that no more than `resident` share an SM: a ring capped at kMaxStages (~90-110 KB) let
// two CTAs of a one-an-SM pass share an SM, where the block scheduler put them as the SMs
// came free while the kernel before drained, and their two chains ran at half speed while
// other SMs stayed idle.
inline LaunchStatus configure_ring_pass(const FwdParams &p, ChainPass pass, int block_v, int blocks,
                                        int resident, const void *kernel, int threads,
                                        PassLaunch &out) {
  DeviceFacts device;
  const cudaError_t err = device_facts(p.test, device);
  if (err != cudaSuccess) return {err, "recurrence_kernel device query"};
  out.params = p;
  out.resident = resident;
  out.params.pass = pass;
  out.params.block_v = block_v;
  const int per_cta = std::min(device.smem_optin, device.smem_sm / resident - kReservedSmem);
  out.params.stages =
      std::min(kMaxStages / blocks, (per_cta - kBarrierBytes) / stage_bytes(block_v, blocks));
  if (out.params.stages < 2)
    return {cudaErrorInvalidConfiguration, "recurrence_kernel ring (too little shared memory)"};
  out.kernel = kernel;
  const int exclusive =
      std::min(device.smem_optin, device.smem_sm / (resident + 1) - kReservedSmem + 128);
  out.smem = std::max(recurrence_smem_bytes(block_v, out.params.stages, blocks), exclusive);
  out.threads = threads;
  out.ctas = pass_ctas(p, pass, block_v);
  const cudaError_t attr = allow_smem(out.kernel, out.smem);
  if (attr != cudaSuccess) return {attr, "recurrence_kernel shared-memory attribute"};
  return {cudaSuccess, nullptr};
}

// Pass `pass` of recurrence_kernel<kNB, kWarps, kCode, kBlocks>.
template <int kNB, int kWarps, PassCode kCode, int kBlocks>
LaunchStatus configure_recurrence(const FwdParams &p, ChainPass pass, PassLaunch &out) {
  out.code = kCode;
  out.name = instantiation_name<kNB, kWarps, kCode, kBlocks>("recurrence_kernel");
  return configure_ring_pass(
      p, pass, 8 * kNB * kWarps, kBlocks, resident_ctas(kNB, kWarps, kCode, kBlocks),
      reinterpret_cast<const void *>(recurrence_kernel<kNB, kWarps, kCode, kBlocks>),
      32 * (kWarps + 1), out);
}

// The pass at the width the plan chose; the widths and which of them are built for 32-token
// chunks are config.h's (the plan never asks for one that is not).
template <PassCode kCode, int kBlocks>
LaunchStatus configure_width(const FwdParams &p, ChainPass pass, int block_v, PassLaunch &out) {
  constexpr RecurrenceShape s0 = kRecurrenceShapes[0], s1 = kRecurrenceShapes[1],
                            s2 = kRecurrenceShapes[2];
  static_assert(kNumRecurrenceShapes == 3, "one case per config.h instantiation");
  if (block_v == s0.block_v) {
    if constexpr (instantiated(s0, kCode, kBlocks))
      return configure_recurrence<s0.nb, s0.warps, kCode, kBlocks>(p, pass, out);
  } else if (block_v == s1.block_v) {
    if constexpr (instantiated(s1, kCode, kBlocks))
      return configure_recurrence<s1.nb, s1.warps, kCode, kBlocks>(p, pass, out);
  } else if (block_v == s2.block_v) {
    if constexpr (instantiated(s2, kCode, kBlocks))
      return configure_recurrence<s2.nb, s2.warps, kCode, kBlocks>(p, pass, out);
  }
  return {cudaErrorInvalidValue,
          "recurrence_kernel (no instantiation for this block_v, pass and chunk)"};
}

// The pass for the call's chunk length (16 or 32 tokens).
template <PassCode kCode>
LaunchStatus configure_chunk(const FwdParams &p, ChainPass pass, int block_v, PassLaunch &out) {
  if (chunk_blocks(p) == 2) return configure_width<kCode, 2>(p, pass, block_v, out);
  return configure_width<kCode, 1>(p, pass, block_v, out);
}

// K1 CTAs (prepare_overlap_kernel) that fit on an SM beside one CTA of `pass`: by the
// registers of the fullest sub-partition, shared memory and threads, at most as many as K1
// runs by itself.
inline LaunchStatus k1_fit_beside(const PassLaunch &pass, const DeviceFacts &d, int kind,
                                  int &fit) {
  const Footprint &k1 = d.k1[kind];
  Footprint k2;
  const cudaError_t err = footprint(pass.kernel, pass.threads, pass.smem, k2);
  if (err != cudaSuccess) return {err, "recurrence_kernel attributes"};
  fit = std::min({d.k1_alone[kind],
                  (d.regs_sm / 4 - k2.sub_partition_regs) / k1.sub_partition_regs,
                  (d.smem_sm - k2.smem) / k1.smem, (d.threads_sm - k2.threads) / k1.threads});
  return {cudaSuccess, nullptr};
}

// Whether the call's passes run on sm_90a's warpgroup MMA (design §4.9): 16-token chunks, no
// checkpoints, and every pass of the call at block_v 64 or 128, unless a test asks for the
// other arches' passes (TestSwitches::generic). All or none: the segment pass and the rerun
// read the same records, which K1 writes in one order.
inline bool warpgroup_passes(const FwdParams &p) {
  const auto wide = [](int block_v) { return block_v == 64 || block_v == 128; };
  return FLASH_KDA_CC == 90 && !p.test.generic && chunk_blocks(p) == 1 &&
         p.checkpoints == nullptr && wide(p.chain_block_v) &&
         (p.segment_chunks == 0 || wide(p.segment_block_v));
}

#if FLASH_KDA_CC == 90
// The pass of code kCode on the warpgroup MMA (recurrence_wg.cuh): kGroups warpgroups of 64
// value columns, kResident CTAs per SM, records in tile order.
template <int kGroups, int kResident, PassCode kCode>
LaunchStatus configure_warpgroup(const FwdParams &p, PassLaunch &out) {
  out.records = RecordOrder::kTiles;
  out.kind = kLaunchedWarpgroup;
  out.code = kCode;
  out.name = instantiation_name<kGroups, kResident, kCode>("warpgroup_recurrence_kernel");
  return configure_ring_pass(
      p, fixed_pass(kCode), 64 * kGroups, 1, kResident,
      reinterpret_cast<const void *>(warpgroup_recurrence_kernel<kGroups, kResident, kCode>),
      warpgroup_threads(kGroups), out);
}

// The warpgroup pass at block_v 64 in one of its two register forms (design §4.9): alone on
// its SM (194 registers), or two CTAs an SM (168) where its grid is more than one wave, or
// where K1 overlaps it with more CTAs beside each pass CTA (the plan's overlap_min_ctas)
// than fit beside the first form and no more than fit beside the second (two and four on
// the H200).
template <PassCode kCode>
LaunchStatus configure_warpgroup_64(const FwdParams &p, PassLaunch &out) {
  DeviceFacts d;
  const cudaError_t err = device_facts(p.test, d);
  if (err != cudaSuccess) return {err, "recurrence_kernel device query"};
  if (pass_ctas(p, fixed_pass(kCode), 64) > d.sms) return configure_warpgroup<1, 2, kCode>(p, out);
  LaunchStatus st = configure_warpgroup<1, 1, kCode>(p, out);
  if (st.error != cudaSuccess) return st;
  if (p.ready == nullptr || p.overlap_min_ctas < 1 || p.overlap_max_ctas < 1) return st;
  int fit = 0;
  st = k1_fit_beside(out, d, k1_kind(p), fit);
  if (st.error != cudaSuccess || fit >= p.overlap_min_ctas) return st;
  PassLaunch shared;
  st = configure_warpgroup<1, 2, kCode>(p, shared);
  if (st.error == cudaSuccess) st = k1_fit_beside(shared, d, k1_kind(p), fit);
  if (st.error == cudaSuccess && fit >= p.overlap_min_ctas) out = shared;
  return st;
}

// The pass `kCode` at block_v 64 or 128.
template <PassCode kCode>
LaunchStatus configure_warpgroup_width(const FwdParams &p, int block_v, PassLaunch &out) {
  if (block_v == 64) return configure_warpgroup_64<kCode>(p, out);
  return configure_warpgroup<2, 1, kCode>(p, out);
}
#endif

// The instantiation of a pass (config.h: PassCode): the whole-sequence pass without
// checkpoints and the segment pass have their own, the rerun and checkpoints the general one.
// On sm_90a every pass runs on the warpgroup MMA where warpgroup_passes says so (the same
// bits, design §4.9).
inline LaunchStatus configure_pass(const FwdParams &p, ChainPass pass, int block_v,
                                   PassLaunch &out) {
#if FLASH_KDA_CC == 90
  if (warpgroup_passes(p)) {
    if (pass == ChainPass::kSegment)
      return configure_warpgroup_width<PassCode::kStates>(p, block_v, out);
    if (pass == ChainPass::kRerun)
      return configure_warpgroup_width<PassCode::kRerun>(p, block_v, out);
    return configure_warpgroup_width<PassCode::kPlain>(p, block_v, out);
  }
#endif
  if (pass == ChainPass::kSegment) return configure_chunk<PassCode::kStates>(p, pass, block_v, out);
  if (pass == ChainPass::kWhole && p.checkpoints == nullptr)
    return configure_chunk<PassCode::kPlain>(p, pass, block_v, out);
  return configure_chunk<PassCode::kGeneral>(p, pass, block_v, out);
}

// The last of a pass's configuration, once its shared memory is final (plan_overlap may
// raise it): v's tensor map and the shared memory it is launched with (padded under
// simulated limits).
inline LaunchStatus seal_pass(PassLaunch &pass) {
  cudaError_t err = make_value_map(pass.params, &pass.value_map);
  if (err != cudaSuccess) return {err, "recurrence_kernel tensor map of v"};
  DeviceFacts d;
  err = device_facts(pass.params.test, d);
  if (err != cudaSuccess) return {err, "recurrence_kernel device query"};
  pass.launch_smem = padded_smem(d, pass.kernel, pass.threads, pass.smem);
  if (pass.launch_smem < 0)
    return {cudaErrorInvalidConfiguration, "recurrence_kernel simulated residency"};
  return {cudaSuccess, nullptr};
}

// Launches a configured pass. `programmatic`: the pass may start while the previous
// kernel still runs: K1 beside it (design §4.7), or its CTAs wait for the previous kernel's
// end (wait_prerequisites, design §4.1).
inline LaunchStatus launch_pass(PassLaunch &pass, bool programmatic, LaunchSink &sink) {
  void *args[] = {&pass.params, &pass.value_map};
  const cudaError_t launch =
      sink.kernel(pass.kernel, dim3(static_cast<unsigned>(pass.ctas)), dim3(pass.threads),
                  pass.launch_smem, args, programmatic);
  if (launch != cudaSuccess) return {launch, "recurrence_kernel launch"};
  record_launch(pass.params, pass.name,
                {{},
                 pass.kind,
                 static_cast<int32_t>(pass.code),
                 chunk_blocks(pass.params),
                 pass.params.block_v,
                 pass.params.stages,
                 pass.resident,
                 pass.launch_smem,
                 static_cast<int32_t>(pass.records),
                 pass.ctas});
  return launch_status("recurrence_kernel launch");
}

// The segment states as a 2-D tensor [max_segments x heads x 256 rows][128 columns] for the
// combine's tensor copies: a box is `rows` rows of one 64-column half (128 bytes), landed with
// the 128-byte swizzle (combine.cuh swizzled_offset).
// Its rows are addressed by int32 coordinates (combine.cuh segment_row): a call with 2^31 rows
// or more (512 GB of segment states) is refused rather than addressed wrongly.
inline cudaError_t make_segment_map(const FwdParams &p, int rows, CUtensorMap *map) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr) return cudaErrorNotSupported;
  const int64_t total_rows = p.max_segments * p.heads * 2 * kHeadDim;
  if (total_rows > INT32_MAX) return cudaErrorInvalidValue;
  const cuuint64_t dims[2] = {kHeadDim, static_cast<cuuint64_t>(total_rows)};
  const cuuint64_t strides[1] = {2 * kHeadDim};
  const cuuint32_t box[2] = {kHalfCols, static_cast<cuuint32_t>(rows)};
  const cuuint32_t unit[2] = {1, 1};
  const CUresult res =
      encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, p.segment_states, dims, strides, box, unit,
             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return res == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

// Whether two stages of 16-row combine CTAs fit a block's shared memory (sm_120's 99 KB
// hold them exactly).
inline bool combine_wide(const DeviceFacts &d) {
  return combine_smem_bytes(16, 2) <= d.smem_optin;
}

// The combine (phase B) as launched: config.h's rows per CTA (combine_wide), the ring as deep
// as the device's shared memory per block allows (three stages on sm_90 / sm_100, two on
// sm_120), the tensor maps of X_j's 128 rows and of the CTA's rows of S^_j.
struct CombineLaunch {
  const void *kernel;
  int rows, stages, smem;
  int64_t ctas;
  CUtensorMap xmap, smap;
};

inline LaunchStatus configure_combine(const FwdParams &p, CombineLaunch &c) {
  DeviceFacts device;
  cudaError_t err = device_facts(p.test, device);
  if (err != cudaSuccess) return {err, "combine_kernel device query"};
  c.rows = combine_rows(p.num_seqs * p.heads, device.sms, combine_wide(device));
  c.stages = kCombineMaxStages;
  while (c.stages > 2 && combine_smem_bytes(c.rows, c.stages) > device.smem_optin) --c.stages;
  c.kernel = reinterpret_cast<const void *>(c.rows == 8 ? combine_kernel<8> : combine_kernel<16>);
  const int bytes = combine_smem_bytes(c.rows, c.stages);
  err = allow_smem(c.kernel, bytes);
  if (err != cudaSuccess) return {err, "combine_kernel shared-memory attribute"};
  c.smem = padded_smem(device, c.kernel, kCombineThreads, bytes);
  if (c.smem < 0) return {cudaErrorInvalidConfiguration, "combine_kernel shared memory"};
  c.ctas = p.num_seqs * p.heads * (kHeadDim / c.rows);
  err = make_segment_map(p, kHeadDim, &c.xmap);
  if (err == cudaSuccess) err = make_segment_map(p, c.rows, &c.smap);
  if (err != cudaSuccess) return {err, "combine_kernel tensor maps of the segment states"};
  return {cudaSuccess, nullptr};
}

inline LaunchStatus launch_combine(const FwdParams &p, CombineLaunch &c, LaunchSink &sink) {
  FwdParams params = p;
  void *args[] = {&params, &c.stages, &c.xmap, &c.smap};
  const cudaError_t err = sink.kernel(c.kernel, dim3(static_cast<unsigned>(c.ctas)),
                                      dim3(kCombineThreads), c.smem, args,
                                      true);  // it waits for the segment pass
  if (err != cudaSuccess) return {err, "combine_kernel launch"};
  record_launch(p, c.rows == 8 ? "combine_kernel<8>" : "combine_kernel<16>",
                {{}, kLaunchedCombine, 0, 1, c.rows, c.stages, 1, c.smem, 0, c.ctas});
  return launch_status("combine_kernel launch");
}

// Whether K1 leaving the pass's SMs runs its kind's leaving form (K1Place::kLeaving): not
// with an fp32 g, whose K1 its bytes bound there (H200, T=8192 H=48 and 96, T=32768 H=96:
// ten CTAs an SM 0.3-2.4% slower than eight, 2026-12-03).
inline bool leaving_form(const FwdParams &p) {
  return !p.g_fp32;
}

// Where K1 leaves the pass's SMs after a lead of at least this many waves of K1 on every SM,
// the lead is a grid of its own (prepare_lead_kernel, one item a CTA) before the overlap
// kernel, whose CTAs then take the items after it (design §4.7). H200 (2026-12-03, three
// machines), T=8192 H=96: softplus 0.5-2.9% faster, the fp32 log decay 0-3.5%, the bounded
// gate -0.6% to +0.2%; T=32768 H=96 within 1.8% either way for every gate. Leads of 4,185
// records (T=1024 at H=96, and 4 x 1024 at H=24) ran 1-1.4% slower as a grid (the kernel
// boundary in a 0.1 ms call), so shorter leads keep the overlap kernel's own.
constexpr int kLeadGridWaves = 4;

// Whether K1 overlaps the first recurrence pass (design §4.7), and if so with how many
// K1 CTAs per SM in its first grid (`keep`): as many as leave room on every SM for one CTA
// of the pass (`beside`), so that the pass's CTAs become resident beside K1's at once, and
// at most the plan's overlap_max_ctas. The plan says how many must fit for the overlap to
// pay. A pass of more than one wave starts its later CTAs as earlier ones end, beside the
// same K1 CTAs. (Keeping all of K1's CTAs on the SMs the pass does not use, and letting
// the surplus on its SMs exit while the pass could still share those SMs with K1, was
// tried: on the H200 the pass then waited for K1's end.) Where the plan has K1 leave the
// pass's SMs (overlap_max_ctas 0) and the pass leaves SMs free, K1 starts on every SM
// (keep = as many CTAs of its leaving form as an SM holds) and `leave_sms` is the pass's CTA
// count; the pass asks for all of an SM's shared memory, so that it starts only on SMs K1
// has left (prepare_overlap_kernel).
inline LaunchStatus plan_overlap(const FwdParams &p, const DeviceFacts &d, PassLaunch &first,
                                 int &keep, int &leave_sms) {
  keep = leave_sms = 0;
  if (p.ready == nullptr || p.overlap_min_ctas < 1) return {cudaSuccess, nullptr};
  const int kind = k1_kind(p);
  int beside = 0;
  const LaunchStatus st = k1_fit_beside(first, d, kind, beside);
  if (st.error != cudaSuccess) return st;
  if (p.overlap_max_ctas == 0 && first.ctas < d.sms) {
    keep = leaving_form(p) ? d.k1_leaving[kind] : d.k1_alone[kind];
    leave_sms = static_cast<int>(first.ctas);
    first.smem = d.smem_optin;
    const cudaError_t err = allow_smem(first.kernel, first.smem);
    if (err != cudaSuccess) return {err, "recurrence_kernel shared-memory attribute"};
  } else if (beside >= p.overlap_min_ctas) {
    keep = std::min(beside, p.overlap_max_ctas);  // 0 (leave, no SM free): K1 first
  }
  return {cudaSuccess, nullptr};
}

// K1 as launched (design §4.1, §4.7): first (prepare_kernel, one record per CTA), or beside
// the first pass (prepare_overlap_kernel, `keep` CTAs an SM taking items from a counter), then
// `extra` more CTAs on the SMs the pass leaves free. `params.ready` is null where K1 runs
// first.
struct K1Config {
  const void *kernel;
  const char *name;
  dim3 grid;
  int threads, smem, keep;
  int64_t extra;
  int extra_smem, extra_resident;
  const void *lead;  // prepare_lead_kernel where params.lead_items > 0
  const char *lead_name;
  int lead_smem;
  FwdParams params;
};

inline LaunchStatus configure_k1(const FwdParams &p, PassLaunch &first, K1Config &k1) {
  DeviceFacts d;
  const cudaError_t err = device_facts(p.test, d);
  if (err != cudaSuccess) return {err, "prepare_kernel device query"};
  int leave_sms = 0;
  const LaunchStatus st = plan_overlap(p, d, first, k1.keep, leave_sms);
  if (st.error != cudaSuccess) return st;
  const int kind = k1_kind(p), alone = d.k1_alone[kind];
  const bool overlap = k1.keep > 0;
  k1.params = p;
  k1.params.leave_sms = leave_sms;
  if (!overlap) k1.params.ready = first.params.ready = nullptr;
  const K1Launch shape = k1_launch(kind, first.records, p.g_fp32);
  const bool leaving = leave_sms > 0, own_form = leaving && leaving_form(p);
  k1.kernel = own_form ? shape.leaving : overlap ? shape.overlap : shape.kernel;
  k1.name = own_form ? shape.leaving_name : overlap ? shape.overlap_name : shape.name;
  k1.threads = shape.threads;
  const int64_t lead =
      leaving && shape.lead != nullptr ? std::min(p.leave_after, p.prepare_items) : 0;
  const int lead_waves = d.k1_prepare[kind] * d.sms * kLeadGridWaves;
  k1.params.lead_items = lead >= lead_waves ? static_cast<int32_t>(lead) : 0;
  k1.lead = shape.lead;
  k1.lead_name = shape.lead_name;
  k1.lead_smem =
      k1.params.lead_items > 0 ? padded_smem(d, shape.lead, shape.threads, shape.smem) : 0;
  k1.grid = overlap ? dim3(static_cast<unsigned>(k1.keep * d.sms))
                    : dim3(static_cast<unsigned>(p.prepare_tiles), static_cast<unsigned>(p.heads));
  k1.smem = padded_smem(d, k1.kernel, shape.threads, shape.smem);
  // More K1 CTAs, launched once every pass CTA is resident, fill the SMs the pass leaves
  // free (on its own SMs `keep` CTAs already leave no room) and share K1's counter.
  k1.extra = overlap && !leaving && first.ctas < d.sms && alone > k1.keep
                 ? int64_t{alone - k1.keep} * (d.sms - first.ctas)
                 : 0;
  k1.extra_smem = k1.smem;
  k1.extra_resident = alone;
  if (k1.smem < 0 || k1.lead_smem < 0)
    return {cudaErrorInvalidConfiguration, "prepare_kernel simulated residency"};
  return {cudaSuccess, nullptr};
}

// K1, the first pass beside K1 or after it, and the extra K1 grid. The extra grid is best
// effort: the first grid's CTAs take every item whether it runs or not, so a failed launch of
// it (cleared: launch errors are not sticky) leaves the call correct.
inline LaunchStatus launch_first(K1Config &k1, PassLaunch &first, LaunchSink &sink) {
  const FwdParams &p = k1.params;
  const bool overlap = p.ready != nullptr;
  if (overlap) {
    const size_t bytes = static_cast<size_t>(ready_bytes(p.heads, p.tiles_per_head));
    const cudaError_t err = sink.zero(p.ready, bytes);
    if (err != cudaSuccess) return {err, "ready flags (memset)"};
  }
  void *args[] = {&k1.params};
  if (overlap && p.lead_items > 0) {  // the lead first: items [0, lead_items), one a CTA
    const cudaError_t err = sink.kernel(k1.lead, dim3(static_cast<unsigned>(p.lead_items)),
                                        dim3(k1.threads), k1.lead_smem, args, false);
    if (err != cudaSuccess) return {err, "prepare_lead_kernel launch"};
    record_launch(p, k1.lead_name,
                  {{},
                   kLaunchedPrepare,
                   1,
                   chunk_blocks(p),
                   0,
                   0,
                   0,
                   k1.lead_smem,
                   static_cast<int32_t>(first.records),
                   p.lead_items});
    const LaunchStatus st = launch_status("prepare_lead_kernel launch");
    if (st.error != cudaSuccess) return st;
  }
  cudaError_t err = sink.kernel(k1.kernel, k1.grid, dim3(k1.threads), k1.smem, args, false);
  if (err != cudaSuccess) return {err, "prepare_kernel launch"};
  record_launch(p, k1.name,
                {{},
                 overlap ? kLaunchedPrepareOverlap : kLaunchedPrepare,
                 0,
                 chunk_blocks(p),
                 0,
                 0,
                 k1.keep,
                 k1.smem,
                 static_cast<int32_t>(first.records),
                 int64_t{k1.grid.x} * k1.grid.y});
  LaunchStatus st = launch_status("prepare_kernel launch");
  if (st.error == cudaSuccess) st = launch_pass(first, true, sink);  // beside K1, or after it
  if (st.error != cudaSuccess || k1.extra == 0) return st;
  err = sink.kernel(k1.kernel, dim3(static_cast<unsigned>(k1.extra)), dim3(k1.threads),
                    k1.extra_smem, args, true);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return {cudaSuccess, nullptr};
  }
  record_launch(p, k1.name,
                {{},
                 kLaunchedPrepareOverlap,
                 1,
                 chunk_blocks(p),
                 0,
                 0,
                 k1.extra_resident,
                 k1.extra_smem,
                 static_cast<int32_t>(first.records),
                 k1.extra});
  return {cudaSuccess, nullptr};
}

// The segments' passes after the first (design §6.2): the combine and the rerun. The rerun
// reads the combine's starts, so it must wait for the combine's end, which a pass does only
// without ready flags (wait_prerequisites): segmented calls never overlap K1 (plan.cpp
// can_overlap), so K1 runs first.
inline LaunchStatus configure_after_segments(const K1Config &k1, CombineLaunch &combine,
                                             PassLaunch &rerun) {
  if (k1.params.ready != nullptr)
    return {cudaErrorInvalidValue, "recurrence_kernel rerun beside K1"};
  FwdParams after = k1.params;
  after.test.stall = 0;  // the first pass's only
  LaunchStatus st = configure_combine(after, combine);
  if (st.error == cudaSuccess)
    st = configure_pass(after, ChainPass::kRerun, after.chain_block_v, rerun);
  if (st.error == cudaSuccess) st = seal_pass(rerun);
  return st;
}

// Prefixes (varlen) -> K1 over all chunks -> K2: one pass over whole sequences, or the
// segment pass, the combine and the rerun (design §4.1, §6.2); a call without tokens copies
// the states alone. Every launch is configured
// before the first one, so that a configuration the device cannot run launches nothing:
// where this returns an error, no kernel has written out, final_state or checkpoints (only
// the last pass writes them, and its launch is the last).
inline LaunchStatus launch_fwd(const FwdParams &p, LaunchSink &sink) {
  FwdParams params = p;  // the by-value kernel parameter of the prefix and state kernels
  void *args[] = {&params};
  if (p.total_tokens == 0) {  // every sequence empty: the states alone (empty.cuh)
    if (p.final_state == nullptr) return {cudaSuccess, nullptr};
    const cudaError_t err = sink.kernel(
        reinterpret_cast<const void *>(empty_states_kernel),
        dim3(static_cast<unsigned>(p.num_seqs), static_cast<unsigned>(p.heads)),
        dim3(kEmptyThreads), 0, args, false);
    if (err != cudaSuccess) return {err, "empty_states_kernel launch"};
    record_launch(p, "empty_states_kernel", {{}, 0, 0, 0, 0, 0, 0, 0, 0, p.num_seqs * p.heads});
    return launch_status("empty_states_kernel launch");
  }
  const bool segmented = p.segment_chunks > 0;
  PassLaunch first, rerun;
  CombineLaunch combine;
  K1Config k1;
  LaunchStatus st = configure_pass(p, segmented ? ChainPass::kSegment : ChainPass::kWhole,
                                   segmented ? p.segment_block_v : p.chain_block_v, first);
  if (st.error == cudaSuccess) st = configure_k1(p, first, k1);
  if (st.error == cudaSuccess) st = seal_pass(first);
  if (st.error == cudaSuccess && segmented) st = configure_after_segments(k1, combine, rerun);
  if (st.error != cudaSuccess) return st;
  if (p.cu_seqlens != nullptr) {
    const cudaError_t err = sink.kernel(reinterpret_cast<const void *>(prefix_kernel), dim3(1),
                                        dim3(kPrefixThreads), 0, args, false);
    st = err != cudaSuccess ? LaunchStatus{err, "prefix_kernel launch"}
                            : launch_status("prefix_kernel launch");
    if (st.error != cudaSuccess) return st;
    record_launch(p, "prefix_kernel", {{}, kLaunchedPrefix, 0, 0, 0, 0, 1, 0, 0, 1});
  }
  st = launch_first(k1, first, sink);
  if (st.error != cudaSuccess || !segmented) return st;
  st = launch_combine(k1.params, combine, sink);
  if (st.error != cudaSuccess) return st;
  return launch_pass(rerun, true, sink);
}

// ---------------------------------------------------------------- the plan's facts

// K1 CTAs that fit beside one CTA of the whole-sequence pass of width block_v for chunks of
// `blocks` 16-token blocks, as the launch would configure it for a call of one head (one
// wave), the most of the forms it may pick (sm_90a's block_v 64 warpgroup pass: two); 0
// where no such pass is built. K1 is FlashKDA's (the bounded gate's forms hold as much) or
// the unbounded gates' (design §2.5).
inline LaunchStatus k1_beside_whole(const TestSwitches &t, const DeviceFacts &d, int block_v,
                                    int blocks, bool unbounded, int &fit) {
  fit = 0;
  if (!instantiated(*recurrence_shape(block_v), PassCode::kPlain, blocks))
    return {cudaSuccess, nullptr};
  FwdParams p{};
  p.test = t;
  p.chunk_shift = blocks == 2 ? 5 : 4;
  p.num_seqs = p.heads = 1;
  p.chain_block_v = block_v;
  p.gate = unbounded ? Gate::kSoftplus : Gate::kLowerBound;
  const int kind = k1_kind(p);
  PassLaunch pass;
  LaunchStatus st = configure_pass(p, ChainPass::kWhole, block_v, pass);
  if (st.error == cudaSuccess) st = k1_fit_beside(pass, d, kind, fit);
#if FLASH_KDA_CC == 90
  if (st.error == cudaSuccess && block_v == 64 && warpgroup_passes(p)) {
    int shared_fit = 0;
    st = configure_warpgroup<1, 2, PassCode::kPlain>(p, pass);
    if (st.error == cudaSuccess) st = k1_fit_beside(pass, d, kind, shared_fit);
    fit = std::max(fit, shared_fit);
  }
#endif
  return st;
}

inline LaunchStatus query_plan_device(const TestSwitches &t, PlanDevice &out) {
  DeviceFacts d;
  const cudaError_t err = device_facts(t, d);
  if (err != cudaSuccess) return {err, "device query"};
  out = PlanDevice{};
  out.cc = FLASH_KDA_CC;
  out.generic = FLASH_KDA_CC != 90 || t.generic != 0;
  out.sms = d.plan_sms;
  out.smem_optin = d.smem_optin;
  out.smem_sm = d.smem_sm;
  out.threads_sm = d.threads_sm;
  out.regs_sm = d.regs_sm;
  out.combine_wide = combine_wide(d);
  for (int b = 0; b < 2; ++b) {  // FlashKDA's K1 for 16- and 32-token records
    const int kind = b == 0 ? kK1Bounded16 : kK1Bounded32;
    out.k1_alone[b] = d.k1_prepare[kind];
    out.k1_overlap[b] = d.k1_alone[kind];
    for (int i = 0; i < kNumRecurrenceShapes; ++i) {
      const int block_v = kRecurrenceShapes[i].block_v;
      LaunchStatus st = k1_beside_whole(t, d, block_v, b + 1, false, out.k1_beside[b][i]);
      if (st.error == cudaSuccess)
        st = k1_beside_whole(t, d, block_v, b + 1, true, out.k1_beside_unbounded[b][i]);
      if (st.error != cudaSuccess) return st;
    }
  }
  return {cudaSuccess, nullptr};
}

// The current device's facts for the plan (plan.h PlanDevice): remembered per device
// (PerDevice) without test switches (a call asks for them: the K1 fits cost ~20 runtime
// queries), else queried.
inline LaunchStatus plan_device(const TestSwitches &t, PlanDevice &out) {
  static PerDevice<PlanDevice> facts;
  int device = 0;
  const cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return {err, "device query"};
  if (t.any()) return query_plan_device(t, out);
  return facts.get(
      device, out, [&](PlanDevice &f) { return query_plan_device(t, f); },
      [](const LaunchStatus &st) { return st.error == cudaSuccess; });
}

inline LaunchStatus launch_probe_unary(int op, const float *x, float *y, int64_t count,
                                       cudaStream_t stream) {
  const int64_t blocks = std::min<int64_t>(ceil_div(count, kProbeThreads), 65535);
  if (op == FLASH_KDA_PROBE_LG2)
    probe_lg2_kernel<<<static_cast<unsigned>(blocks), kProbeThreads, 0, stream>>>(x, y, count);
  else
    probe_unary_kernel<<<static_cast<unsigned>(blocks), kProbeThreads, 0, stream>>>(op, x, y,
                                                                                    count);
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

// The kernels beyond FlashKDA's that an arch's table runs by default: those whose GPU tests
// have passed on a GPU of that arch (tests/test_gates_gpu.py on an H200, 2026-12-01): the gate
// and beta forms and AUTO mode's stable inverse on sm_90a. Elsewhere they are built and run
// only through the test entry point (docs/dispatch.md).
namespace flash_kda {
constexpr uint32_t validated_features(int compute_capability) {
  return compute_capability == 90 ? FLASH_KDA_FEATURE_GATE_FORMS | FLASH_KDA_FEATURE_STABLE_INVERSE
                                  : 0u;
}
}  // namespace flash_kda

// Exports this TU's table as flash_kda::table_<arch>; api.cpp declares the same symbol.
#define FLASH_KDA_DEFINE_ARCH_TABLE(NAME, CC)                    \
  namespace flash_kda {                                          \
  extern const ArchTable FLASH_KDA_TABLE_SYMBOL(FLASH_KDA_ARCH); \
  const ArchTable FLASH_KDA_TABLE_SYMBOL(FLASH_KDA_ARCH) = {     \
      NAME,                                                      \
      CC,                                                        \
      FLASH_KDA_FEATURE_FWD | FLASH_KDA_FEATURE_PROBES | validated_features(CC),   \
      &FLASH_KDA_ARCH::launch_fwd,                               \
      &FLASH_KDA_ARCH::plan_device,                              \
      &FLASH_KDA_ARCH::launch_probe_unary,                       \
      &FLASH_KDA_ARCH::launch_probe_mma};                        \
  }
