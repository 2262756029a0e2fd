// SPDX-License-Identifier: MIT
// api.cpp: the C ABI (flash_kda.h). Checks arguments (docs/api.md), finds the arch table
// for the caller's compute capability, plans the call (plan.h), fills FwdParams and
// launches. Host-only; every export is a noexcept shim that turns failures into a status
// and a thread-local message.
#include <flash_kda/flash_kda.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "arch/table.h"
#include "costs.h"
#include "kda/config.h"
#include "kda/workspace.h"
#include "plan.h"

namespace flash_kda {

// The tables of this build, listed by CMake (arch_list.inc: one FLASH_KDA_ARCH_ENTRY each).
#define FLASH_KDA_ARCH_ENTRY(arch) extern const ArchTable FLASH_KDA_TABLE_SYMBOL(arch);
#include "arch_list.inc"
#undef FLASH_KDA_ARCH_ENTRY

namespace {

#define FLASH_KDA_ARCH_ENTRY(arch) &FLASH_KDA_TABLE_SYMBOL(arch),
const ArchTable *const kTables[] = {
#include "arch_list.inc"
    nullptr};
#undef FLASH_KDA_ARCH_ENTRY
constexpr int kNumTables = static_cast<int>(sizeof(kTables) / sizeof(kTables[0])) - 1;

// The ABI 1 prefix of flash_kda_fwd_args: what an older caller passes.
constexpr size_t kArgsV1Bytes = offsetof(flash_kda_fwd_args, q_strides);

thread_local std::string g_last_error;

// Records "<fn>: <message>" and returns status.
flash_kda_status fail(flash_kda_status status, const char *fn, const std::string &message) {
  g_last_error = std::string(fn) + ": " + message;
  return status;
}

std::string arch_names() {
  std::string names;
  for (int i = 0; i < kNumTables; ++i) names += (i ? ", " : "") + std::string(kTables[i]->name);
  return names.empty() ? std::string("none") : names;
}

flash_kda_status find_table(const char *fn, int32_t cc, const ArchTable *&table) {
  for (int i = 0; i < kNumTables; ++i) {
    if (kTables[i]->compute_capability == cc) {
      table = kTables[i];
      return FLASH_KDA_OK;
    }
  }
  return fail(
      FLASH_KDA_UNSUPPORTED_DEVICE, fn,
      "no kernel for sm_" + std::to_string(cc) + " in this build (has " + arch_names() + ")");
}

// A driver older than the runtime linked into the library cannot run its kernels: say so
// before launching rather than fail at the first launch.
flash_kda_status check_driver(const char *fn) {
  static const int driver = [] {
    int v = 0;
    return cudaDriverGetVersion(&v) == cudaSuccess ? v : 0;
  }();
  if (driver / 1000 >= CUDART_VERSION / 1000) return FLASH_KDA_OK;
  return fail(FLASH_KDA_UNSUPPORTED_DEVICE, fn,
              "the CUDA driver supports CUDA " + std::to_string(driver / 1000) + "." +
                  std::to_string(driver % 1000 / 10) + ", this library was built with CUDA " +
                  std::to_string(CUDART_VERSION / 1000) + "." +
                  std::to_string(CUDART_VERSION % 1000 / 10) +
                  " and needs a driver of that major version");
}

flash_kda_status launch_result(const char *fn, const LaunchStatus &st) {
  if (st.error == cudaSuccess) return FLASH_KDA_OK;
  return fail(FLASH_KDA_CUDA_ERROR, fn,
              std::string(st.stage) + " failed: " + cudaGetErrorName(st.error));
}

bool aligned(const void *p, uintptr_t bytes) {
  return (reinterpret_cast<uintptr_t>(p) & (bytes - 1)) == 0;
}

// Round-to-nearest-even fp32 -> bf16 (finite inputs), design §3.2 step 6: sb = bf(fp32(scale)).
uint32_t bf16_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}

// The caller's struct, zero-extended to this header's layout (flash_kda.h: an older caller
// passes only the ABI 1 prefix). "" or what is wrong.
std::string read_args(const flash_kda_fwd_args *in, flash_kda_fwd_args &a) {
  std::memset(&a, 0, sizeof(a));
  if (in == nullptr) return "args must not be NULL";
  if (in->struct_size < kArgsV1Bytes || in->struct_size > sizeof(flash_kda_fwd_args))
    return "args->struct_size must be in [" + std::to_string(kArgsV1Bytes) + ", " +
           std::to_string(sizeof(flash_kda_fwd_args)) + "], got " + std::to_string(in->struct_size);
  std::memcpy(&a, in, in->struct_size);
  return "";
}

ProblemSizes sizes_of(const flash_kda_fwd_args &a) {
  const bool varlen = a.cu_seqlens != nullptr;
  return {a.batch, a.seqlen, a.heads, a.num_seqs, varlen, a.checkpoint_every, a.max_seqlen};
}

PlanRequest request_of(const flash_kda_fwd_args &a) {
  return {a.mode, a.block_v, a.segment_chunks, a.overlap, a.chunk_tokens};
}

// The facts of the device a call runs on (the table's query, under the test switches); the
// caller's num_sms, where given, is the SM count the plan spreads the work over, unless a
// test simulates one. "" or what failed.
std::string device_of(const ArchTable &table, const TestSwitches &t, int32_t num_sms,
                      PlanDevice &d) {
  const LaunchStatus st = table.plan_device(t, d);
  if (st.error != cudaSuccess)
    return std::string(st.stage) + " failed: " + cudaGetErrorName(st.error);
  if (num_sms > 0 && t.sms <= 0) d.sms = num_sms;
  return "";
}

// The facts of a reference device (costs.h) with `num_sms` multiprocessors: the plan of
// flash_kda_fwd_plan, which has no device.
PlanDevice reference_device(const char *name, int32_t num_sms) {
  for (const ReferenceDevice &r : kReferenceDevices)
    if (std::strcmp(r.name, name) == 0) {
      PlanDevice d = r.facts;
      d.sms = num_sms;
      return d;
    }
  return PlanDevice{};
}

// The ABI 3 prefix of flash_kda_fwd_plan_info: what an older caller passes.
constexpr size_t kPlanInfoV3Bytes = offsetof(flash_kda_fwd_plan_info, chunk_tokens);

// head_dim, sizes and the request: what the plan needs besides a device. "" or what is wrong.
std::string check_plan_args(const flash_kda_fwd_args &a) {
  if (a.head_dim != kHeadDim) return "head_dim must be 128, got " + std::to_string(a.head_dim);
  if (a.block_v == 0 && a.num_sms < 1)
    return "num_sms must be >= 1 when block_v is 0, got " + std::to_string(a.num_sms);
  std::string err = check_sizes(sizes_of(a));
  return err.empty() ? check_request(sizes_of(a), request_of(a)) : err;
}

// The plan on `device` of checked arguments (check_plan_args). "" or what is wrong.
std::string plan_on(const flash_kda_fwd_args &a, const PlanDevice &device, Plan &plan) {
  return make_plan(sizes_of(a), request_of(a), device, plan);
}

// The strides of an activation (elements): zeros mean contiguous. Every stride of a
// dimension longer than one must be positive and, for 16-byte vector loads and tensor
// copies, a multiple of `multiple`.
std::string check_strides(const char *name, const flash_kda_strides &in,
                          const flash_kda_fwd_args &a, int64_t row, int64_t multiple,
                          Strides &out) {
  if (in.batch == 0 && in.token == 0 && in.head == 0) {
    out = {a.seqlen * a.heads * row, a.heads * row, row};
    return "";
  }
  out = {in.batch, in.token, in.head};
  const int64_t strides[3] = {in.batch, in.token, in.head};
  const int64_t dims[3] = {a.batch, a.seqlen, a.heads};
  const int64_t limit = int64_t{1} << 39;  // tensor copies take byte strides below 2^40
  for (int i = 0; i < 3; ++i) {
    if (dims[i] == 1) continue;
    if (strides[i] <= 0 || strides[i] % multiple != 0 || strides[i] >= limit)
      return std::string(name) + " strides must be positive multiples of " +
             std::to_string(multiple) + " below 2^39 elements, got (" + std::to_string(in.batch) +
             ", " + std::to_string(in.token) + ", " + std::to_string(in.head) + ")";
  }
  return "";
}

std::string check_state(const char *name, const void *ptr, int32_t dtype) {
  if (dtype != FLASH_KDA_DTYPE_NONE && dtype != FLASH_KDA_DTYPE_BF16 &&
      dtype != FLASH_KDA_DTYPE_FP32)
    return std::string(name) + " dtype must be NONE, BF16 or FP32, got " + std::to_string(dtype);
  if ((dtype == FLASH_KDA_DTYPE_NONE) != (ptr == nullptr))
    return std::string(name) + " pointer and dtype disagree (NULL iff NONE)";
  if (ptr != nullptr && !aligned(ptr, 16)) return std::string(name) + " must be 16-byte aligned";
  return "";
}

std::string check_index_dtype(const char *name, int32_t dtype, bool none_ok) {
  if (dtype == FLASH_KDA_DTYPE_INT32 || dtype == FLASH_KDA_DTYPE_INT64 ||
      (none_ok && dtype == FLASH_KDA_DTYPE_NONE))
    return "";
  return std::string(name) + " dtype must be INT32 or INT64, got " + std::to_string(dtype);
}

// Pointers, strides, states, pool, checkpoints and values (docs/api.md); fills the
// arch-independent part of p. "" or what is wrong.
std::string check_tensors(const flash_kda_fwd_args &a, FwdParams &p) {
  const void *required[] = {a.q, a.k, a.v, a.g, a.out, a.A_log, a.dt_bias, a.workspace};
  const char *names[] = {"q", "k", "v", "g", "out", "A_log", "dt_bias", "workspace"};
  for (int i = 0; i < 8; ++i) {
    if (required[i] == nullptr) return std::string(names[i]) + " must not be NULL";
    if (!aligned(required[i], 16)) return std::string(names[i]) + " must be 16-byte aligned";
  }
  if (a.beta == nullptr) return "beta must not be NULL";
  if (!aligned(a.beta, 2)) return "beta must be 2-byte aligned";
  const flash_kda_strides *in[] = {&a.q_strides, &a.k_strides, &a.v_strides, &a.g_strides,
                                   &a.out_strides};
  Strides *out[] = {&p.q_strides, &p.k_strides, &p.v_strides, &p.g_strides, &p.out_strides};
  const char *act[] = {"q", "k", "v", "g", "out"};
  for (int i = 0; i < 5; ++i) {
    std::string err = check_strides(act[i], *in[i], a, kHeadDim, 8, *out[i]);
    if (!err.empty()) return err;
  }
  std::string err = check_strides("beta", a.beta_strides, a, 1, 1, p.beta_strides);
  if (err.empty()) err = check_state("initial_state", a.initial_state, a.initial_state_dtype);
  if (err.empty()) err = check_state("final_state", a.final_state, a.final_state_dtype);
  if (err.empty()) err = check_state("checkpoints", a.checkpoints, a.checkpoints_dtype);
  if (!err.empty()) return err;
  if (a.initial_state_dtype != FLASH_KDA_DTYPE_NONE &&
      a.final_state_dtype != FLASH_KDA_DTYPE_NONE && a.initial_state_dtype != a.final_state_dtype)
    return "initial_state and final_state must have the same dtype";
  if (a.cu_seqlens != nullptr) {
    err = check_index_dtype("cu_seqlens", a.cu_seqlens_dtype, true);
    if (err.empty() && !aligned(a.cu_seqlens, 8)) err = "cu_seqlens must be 8-byte aligned";
    if (!err.empty()) return err;
  }
  if (a.state_indices != nullptr) {
    err = check_index_dtype("state_indices", a.state_indices_dtype, false);
    if (!err.empty()) return err;
    if (!aligned(a.state_indices, 8)) return "state_indices must be 8-byte aligned";
    if (a.state_pool_size < 1 || a.state_pool_size > kMaxSeqs)
      return "state_pool_size must be in [1, 2^30] with state_indices, got " +
             std::to_string(a.state_pool_size);
  } else if (a.state_indices_dtype != FLASH_KDA_DTYPE_NONE) {
    return "state_indices is NULL but state_indices_dtype is " +
           std::to_string(a.state_indices_dtype);
  }
  if (a.checkpoints != nullptr &&
      (a.checkpoint_every <= 0 || a.checkpoint_slots < 0 || a.checkpoint_slots > kMaxTokens))
    return "checkpoints need checkpoint_every > 0 and checkpoint_slots in [0, 2^31), got " +
           std::to_string(a.checkpoint_every) + " and " + std::to_string(a.checkpoint_slots);
  const float scale = static_cast<float>(a.scale);
  if (!std::isfinite(a.scale) || !std::isfinite(scale) ||
      ((bf16_bits(scale) >> 7) & 0xffu) == 0xffu)
    return "scale must be finite in bfloat16 (|scale| < 3.39e38), got " + std::to_string(a.scale);
  if (!(a.lower_bound >= -5.0 && a.lower_bound <= 0.0))
    return "lower_bound must be in [-5, 0], got " + std::to_string(a.lower_bound);
  return "";
}

Dtype dtype_or(int32_t d, Dtype none) {
  return d == FLASH_KDA_DTYPE_NONE ? none : static_cast<Dtype>(d);
}

// The pointers and sizes of a checked call, laid out by its plan.
void fill_params(const flash_kda_fwd_args &a, const Plan &plan, FwdParams &p) {
  p.q = static_cast<const uint16_t *>(a.q);
  p.k = static_cast<const uint16_t *>(a.k);
  p.v = static_cast<const uint16_t *>(a.v);
  p.g = static_cast<const uint16_t *>(a.g);
  p.beta = static_cast<const uint16_t *>(a.beta);
  p.out = static_cast<uint16_t *>(a.out);
  p.A_log = a.A_log;
  p.dt_bias = a.dt_bias;
  p.initial_state = a.initial_state;
  p.final_state = a.final_state;
  p.initial_dtype = static_cast<Dtype>(a.initial_state_dtype);
  p.final_dtype = static_cast<Dtype>(a.final_state_dtype);
  p.state_indices = a.state_indices;
  p.index_dtype = dtype_or(a.state_indices_dtype, Dtype::kNone);
  p.pool_size = a.state_indices != nullptr ? a.state_pool_size : a.num_seqs;
  p.has_initial_state = a.has_initial_state;
  p.checkpoints = a.checkpoints;
  p.checkpoint_dtype = static_cast<Dtype>(a.checkpoints_dtype);
  p.checkpoint_chunks = a.checkpoints != nullptr ? a.checkpoint_every / plan.chunk_tokens : 0;
  p.checkpoint_slots = a.checkpoints != nullptr ? a.checkpoint_slots : 0;
  p.cu_seqlens = a.cu_seqlens;
  p.cu_seqlens_dtype = dtype_or(a.cu_seqlens_dtype, Dtype::kInt64);
  p.batch = a.batch;
  p.seqlen = a.seqlen;
  p.total_tokens = a.batch * a.seqlen;
  p.heads = a.heads;
  p.num_seqs = a.num_seqs;
  uint8_t *base = static_cast<uint8_t *>(a.workspace);
  p.records = base;
  p.chunk_shift = plan.chunk_tokens == 32 ? 5 : 4;
  p.tiles_per_head = tiles_per_head(p.total_tokens, a.num_seqs, plan.chunk_tokens);
  const int64_t chunks = ceil_div(a.seqlen, plan.chunk_tokens);  // per sequence, batched mode
  p.prepare_tiles = a.cu_seqlens != nullptr ? p.tiles_per_head : a.num_seqs * chunks;
  // K1's order beside the pass (design §4.7): the sequences of one wave of the pass together.
  p.order_group = plan.overlap_group;
  p.prepare_items =
      static_cast<int32_t>(std::min<int64_t>(chunks * a.num_seqs * a.heads, INT32_MAX));
  p.ready = plan.overlap_min_ctas > 0 ? reinterpret_cast<uint32_t *>(base + plan.ready) : nullptr;
  p.overlap_min_ctas = plan.overlap_min_ctas;
  p.overlap_max_ctas = plan.overlap_max_ctas;
  p.leave_sms = 0;  // the launch decides (launch.cuh plan_overlap)
  p.leave_after = plan.overlap_lead;
  p.sync = reinterpret_cast<OverlapSync *>(base + plan.overlap_sync);
  p.tile_prefix = reinterpret_cast<int32_t *>(base + plan.tile_prefix);
  p.segment_prefix = reinterpret_cast<int32_t *>(base + plan.segment_prefix);
  p.checkpoint_prefix = reinterpret_cast<int32_t *>(base + plan.checkpoint_prefix);
  p.seq_order = plan.longest_first ? p.segment_prefix : nullptr;
  p.segment_chunks = plan.segment_chunks;
  p.max_segments = plan.max_segments;
  p.segment_states = reinterpret_cast<uint16_t *>(base + plan.segment_states);
  p.segment_starts = reinterpret_cast<uint16_t *>(base + plan.segment_starts);
  p.gate_scale = static_cast<float>(a.lower_bound * 1.4426950408889634);  // design §3.2 step 1
  p.scale_bf16 = bf16_bits(static_cast<float>(a.scale));
  p.chain_block_v = plan.block_v;
  p.segment_block_v = plan.segment_block_v;
  p.wait_limit_ns = kWaitLimitNs;
}

}  // namespace
}  // namespace flash_kda

using flash_kda::fail;

extern "C" {

int32_t flash_kda_abi_version(void) noexcept {
  return FLASH_KDA_ABI_VERSION;
}

const char *flash_kda_last_error(void) noexcept {
  return flash_kda::g_last_error.c_str();
}

int32_t flash_kda_num_archs(void) noexcept {
  return flash_kda::kNumTables;
}

flash_kda_status flash_kda_arch_info(int32_t index, flash_kda_arch_desc *info) noexcept {
  const char *fn = "flash_kda_arch_info";
  if (info == nullptr) return fail(FLASH_KDA_INVALID_ARGUMENT, fn, "info must not be NULL");
  if (index < 0 || index >= flash_kda::kNumTables)
    return fail(FLASH_KDA_INVALID_ARGUMENT, fn,
                "index must be in [0, " + std::to_string(flash_kda::kNumTables) + "), got " +
                    std::to_string(index));
  const flash_kda::ArchTable *t = flash_kda::kTables[index];
  info->name = t->name;
  info->compute_capability = t->compute_capability;
  info->features = t->features;
  return FLASH_KDA_OK;
}

flash_kda_status flash_kda_cuda_versions(int32_t *runtime_version,
                                         int32_t *driver_version) noexcept {
  const char *fn = "flash_kda_cuda_versions";
  if (runtime_version == nullptr || driver_version == nullptr)
    return fail(FLASH_KDA_INVALID_ARGUMENT, fn,
                "runtime_version and driver_version must not be NULL");
  int driver = 0;
  if (cudaDriverGetVersion(&driver) != cudaSuccess) driver = 0;
  *runtime_version = CUDART_VERSION;
  *driver_version = driver;
  return FLASH_KDA_OK;
}

int64_t flash_kda_record_bytes(void) noexcept {
  return flash_kda::kRecordBytes;
}

int64_t flash_kda_workspace_size(int64_t total_tokens, int64_t heads, int64_t num_seqs) noexcept {
  return flash_kda::exact_workspace_bytes(total_tokens, heads, num_seqs);
}

int32_t flash_kda_pick_block_v(int64_t num_seqs, int64_t heads, int32_t num_sms) noexcept {
  if (num_seqs < 1 || heads < 1 || num_seqs > flash_kda::kMaxSeqs || heads > flash_kda::kMaxHeads)
    return -1;
  return flash_kda::pick_block_v(num_seqs * heads, num_sms);
}

flash_kda_status flash_kda_fwd_plan(const flash_kda_fwd_args *args,
                                    flash_kda_fwd_plan_info *out) noexcept {
  const char *fn = "flash_kda_fwd_plan";
  try {
    if (out == nullptr || (out->struct_size != sizeof(flash_kda_fwd_plan_info) &&
                           out->struct_size != flash_kda::kPlanInfoV3Bytes))
      return fail(FLASH_KDA_INVALID_ARGUMENT, fn,
                  "plan must not be NULL and plan->struct_size must be " +
                      std::to_string(sizeof(flash_kda_fwd_plan_info)) + " (or " +
                      std::to_string(flash_kda::kPlanInfoV3Bytes) + ", ABI 3)");
    flash_kda_fwd_args a;
    std::string err = flash_kda::read_args(args, a);
    flash_kda::Plan plan{};
    if (err.empty()) err = flash_kda::check_plan_args(a);
    if (err.empty())
      err = flash_kda::plan_on(a, flash_kda::reference_device("h200", a.num_sms), plan);
    if (!err.empty()) return fail(FLASH_KDA_INVALID_ARGUMENT, fn, err);
    out->block_v = plan.block_v;
    out->segment_chunks = plan.segment_chunks;
    out->segment_block_v = plan.segment_block_v;
    out->max_segments = plan.max_segments;
    out->workspace_bytes = plan.workspace_bytes;
    out->overlap_min_ctas = plan.overlap_min_ctas;
    out->overlap_max_ctas = plan.overlap_max_ctas;
    if (out->struct_size == sizeof(flash_kda_fwd_plan_info)) {
      out->chunk_tokens = plan.chunk_tokens;
      out->overlap_lead = plan.overlap_lead;
    }
    return FLASH_KDA_OK;
  } catch (...) {
    return fail(FLASH_KDA_INTERNAL, fn, "unexpected C++ exception");
  }
}

flash_kda_status flash_kda_fwd(int32_t compute_capability, const flash_kda_fwd_args *args,
                               void *stream) noexcept {
  const char *fn = "flash_kda_fwd";
  try {
    flash_kda_fwd_args a;
    std::string err = flash_kda::read_args(args, a);
    if (!err.empty()) return fail(FLASH_KDA_INVALID_ARGUMENT, fn, err);
    const flash_kda::ArchTable *table = nullptr;
    flash_kda_status st = flash_kda::find_table(fn, compute_capability, table);
    if (st != FLASH_KDA_OK) return st;
    flash_kda::Plan plan{};
    flash_kda::FwdParams params{};
    err = flash_kda::check_plan_args(a);
    if (err.empty()) err = flash_kda::check_tensors(a, params);
    if (!err.empty()) return fail(FLASH_KDA_INVALID_ARGUMENT, fn, err);
    st = flash_kda::check_driver(fn);
    if (st != FLASH_KDA_OK) return st;
    flash_kda::PlanDevice device{};
    err = flash_kda::device_of(*table, params.test, a.num_sms, device);
    if (!err.empty()) return fail(FLASH_KDA_CUDA_ERROR, fn, err);
    err = flash_kda::plan_on(a, device, plan);
    if (err.empty() && a.workspace_bytes < plan.workspace_bytes)
      err = "workspace must hold " + std::to_string(plan.workspace_bytes) + " bytes, got " +
            std::to_string(a.workspace_bytes);
    if (!err.empty()) return fail(FLASH_KDA_INVALID_ARGUMENT, fn, err);
    flash_kda::fill_params(a, plan, params);
    return flash_kda::launch_result(fn, table->fwd(params, static_cast<cudaStream_t>(stream)));
  } catch (...) {
    return fail(FLASH_KDA_INTERNAL, fn, "unexpected C++ exception");
  }
}

flash_kda_status flash_kda_probe_unary_op(int32_t compute_capability, int32_t op, const float *x,
                                          float *y, int64_t count, void *stream) noexcept {
  const char *fn = "flash_kda_probe_unary_op";
  try {
    const flash_kda::ArchTable *table = nullptr;
    flash_kda_status st = flash_kda::find_table(fn, compute_capability, table);
    if (st != FLASH_KDA_OK) return st;
    if (op < FLASH_KDA_PROBE_EX2 || op > FLASH_KDA_PROBE_RSQRT)
      return fail(FLASH_KDA_INVALID_ARGUMENT, fn,
                  "op must be EX2, SIGMOID or RSQRT, got " + std::to_string(op));
    if (count < 0 || count > flash_kda::kMaxTokens * 128)
      return fail(FLASH_KDA_INVALID_ARGUMENT, fn,
                  "count must be in [0, 2^38), got " + std::to_string(count));
    if (count == 0) return FLASH_KDA_OK;
    if (x == nullptr || y == nullptr)
      return fail(FLASH_KDA_INVALID_ARGUMENT, fn, "x and y must not be NULL");
    return flash_kda::launch_result(
        fn, table->probe_unary(op, x, y, count, static_cast<cudaStream_t>(stream)));
  } catch (...) {
    return fail(FLASH_KDA_INTERNAL, fn, "unexpected C++ exception");
  }
}

flash_kda_status flash_kda_probe_mma_op(int32_t compute_capability, int32_t op, const void *a,
                                        const void *b, void *c, int64_t batch, int64_t m, int64_t n,
                                        int64_t k, void *stream) noexcept {
  const char *fn = "flash_kda_probe_mma_op";
  try {
    const flash_kda::ArchTable *table = nullptr;
    flash_kda_status st = flash_kda::find_table(fn, compute_capability, table);
    if (st != FLASH_KDA_OK) return st;
    if (op != FLASH_KDA_PROBE_MMA_BF16_F32 && op != FLASH_KDA_PROBE_MMA_F16_F16)
      return fail(FLASH_KDA_INVALID_ARGUMENT, fn,
                  "op must be MMA_BF16_F32 or MMA_F16_F16, got " + std::to_string(op));
    if (batch < 1 || m < 16 || n < 8 || k < 16 || m % 16 || n % 8 || k % 16)
      return fail(FLASH_KDA_INVALID_ARGUMENT, fn,
                  "need batch >= 1 and m, n, k positive multiples of 16, 8, 16; got " +
                      std::to_string(batch) + ", " + std::to_string(m) + ", " + std::to_string(n) +
                      ", " + std::to_string(k));
    int64_t tiles = 0;
    if (__builtin_mul_overflow(batch, (m / 16) * (n / 8), &tiles) || m > (int64_t{1} << 24) ||
        n > (int64_t{1} << 24) || k > (int64_t{1} << 24) || tiles > (int64_t{1} << 33))
      return fail(FLASH_KDA_INVALID_ARGUMENT, fn, "too many 16x8 tiles for one launch");
    if (a == nullptr || b == nullptr || c == nullptr)
      return fail(FLASH_KDA_INVALID_ARGUMENT, fn, "a, b and c must not be NULL");
    if ((reinterpret_cast<uintptr_t>(a) | reinterpret_cast<uintptr_t>(b) |
         reinterpret_cast<uintptr_t>(c)) &
        3u)
      return fail(FLASH_KDA_INVALID_ARGUMENT, fn, "a, b and c must be 4-byte aligned");
    return flash_kda::launch_result(
        fn, table->probe_mma(op, a, b, c, batch, m, n, k, static_cast<cudaStream_t>(stream)));
  } catch (...) {
    return fail(FLASH_KDA_INTERNAL, fn, "unexpected C++ exception");
  }
}

}  // extern "C"
