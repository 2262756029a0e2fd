// SPDX-License-Identifier: MIT
// args.cpp: the checks of flash_kda_fwd_args (args.h, docs/api.md) and FwdParams.
#include "args.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kda/config.h"
#include "kda/workspace.h"
#include "plan_cache.h"

namespace flash_kda {
namespace {

// The ABI 1 prefix of flash_kda_fwd_args: the least an older caller passes.
constexpr size_t kArgsV1Bytes = offsetof(flash_kda_fwd_args, q_strides);

std::string str(int64_t x) {
  return std::to_string(x);
}

// Round-to-nearest-even fp32 -> bf16 (finite inputs), design §3.2 step 6: sb = bf(fp32(scale)).
uint32_t bf16_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}

int64_t element_bytes(int32_t dtype) {
  switch (dtype) {
    case FLASH_KDA_DTYPE_BF16:
      return 2;
    case FLASH_KDA_DTYPE_FP32:
    case FLASH_KDA_DTYPE_INT32:
      return 4;
    default:
      return 8;  // INT64, and NONE for cu_seqlens (ABI 1: int64)
  }
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
      return std::string(name) + " strides must be positive multiples of " + str(multiple) +
             " below 2^39 elements, got (" + str(in.batch) + ", " + str(in.token) + ", " +
             str(in.head) + ")";
  }
  return "";
}

// A state-like tensor of `elements` elements: NULL iff NONE (or NULL without elements).
std::string check_state(const char *name, const void *ptr, int32_t dtype, int64_t elements) {
  if (dtype != FLASH_KDA_DTYPE_NONE && dtype != FLASH_KDA_DTYPE_BF16 &&
      dtype != FLASH_KDA_DTYPE_FP32)
    return std::string(name) + " dtype must be NONE, BF16 or FP32, got " + str(dtype);
  if ((dtype == FLASH_KDA_DTYPE_NONE && ptr != nullptr) ||
      (dtype != FLASH_KDA_DTYPE_NONE && ptr == nullptr && elements > 0))
    return std::string(name) + " pointer and dtype disagree (NULL iff NONE)";
  return "";
}

std::string check_index_dtype(const char *name, int32_t dtype, bool none_ok) {
  if (dtype == FLASH_KDA_DTYPE_INT32 || dtype == FLASH_KDA_DTYPE_INT64 ||
      (none_ok && dtype == FLASH_KDA_DTYPE_NONE))
    return "";
  return std::string(name) + " dtype must be INT32 or INT64, got " + str(dtype);
}

// The gate and beta forms (flash_kda_gate, flash_kda_beta), their element types and the gate
// parameters they take.
std::string check_forms(const flash_kda_fwd_args &a) {
  if (a.gate < FLASH_KDA_GATE_LOWER_BOUND || a.gate > FLASH_KDA_GATE_LOG_DECAY)
    return "gate must be LOWER_BOUND (0), SOFTPLUS (1) or LOG_DECAY (2), got " + str(a.gate);
  const bool log_decay = a.gate == FLASH_KDA_GATE_LOG_DECAY;
  if (a.g_dtype != FLASH_KDA_DTYPE_NONE && a.g_dtype != FLASH_KDA_DTYPE_BF16 &&
      !(log_decay && a.g_dtype == FLASH_KDA_DTYPE_FP32))
    return "g_dtype must be NONE or BF16 (FP32 with gate LOG_DECAY), got " + str(a.g_dtype);
  if (a.beta_form != FLASH_KDA_BETA_LOGIT && a.beta_form != FLASH_KDA_BETA_PROBABILITY)
    return "beta_form must be LOGIT (0) or PROBABILITY (1), got " + str(a.beta_form);
  if (a.beta_dtype != FLASH_KDA_DTYPE_NONE && a.beta_dtype != FLASH_KDA_DTYPE_BF16 &&
      a.beta_dtype != FLASH_KDA_DTYPE_FP32)
    return "beta_dtype must be NONE, BF16 or FP32, got " + str(a.beta_dtype);
  if (log_decay) {
    if (a.A_log != nullptr || a.dt_bias != nullptr)
      return "A_log and dt_bias must be NULL with gate LOG_DECAY (g is the log decay itself)";
    return "";
  }
  if (a.A_log == nullptr) return "A_log must not be NULL";
  if (a.dt_bias == nullptr) return "dt_bias must not be NULL";
  if (a.gate == FLASH_KDA_GATE_LOWER_BOUND && !(a.lower_bound >= -5.0 && a.lower_bound <= 0.0))
    return "lower_bound must be in [-5, 0], got " + std::to_string(a.lower_bound);
  return "";
}

// Bytes of an element of g and of beta.
int64_t g_bytes(const flash_kda_fwd_args &a) {
  return a.g_dtype == FLASH_KDA_DTYPE_FP32 ? 4 : 2;
}

int64_t beta_bytes(const flash_kda_fwd_args &a) {
  return a.beta_dtype == FLASH_KDA_DTYPE_FP32 ? 4 : 2;
}

// The activations and beta: present when the call has tokens; their strides (16-byte vectors:
// multiples of 8 bf16 or 4 fp32 elements).
std::string check_activations(const flash_kda_fwd_args &a, PointerFacts &f) {
  const bool tokens = a.batch > 0 && a.seqlen > 0;
  const void *ptrs[] = {a.q, a.k, a.v, a.g, a.out};
  const flash_kda_strides *in[] = {&a.q_strides, &a.k_strides, &a.v_strides, &a.g_strides,
                                   &a.out_strides};
  Strides *out[] = {&f.q_strides, &f.k_strides, &f.v_strides, &f.g_strides, &f.out_strides};
  const char *names[] = {"q", "k", "v", "g", "out"};
  for (int i = 0; i < 5; ++i) {
    if (tokens && ptrs[i] == nullptr) return std::string(names[i]) + " must not be NULL";
    const int64_t multiple = i == 3 ? 16 / g_bytes(a) : 8;
    std::string err = check_strides(names[i], *in[i], a, kHeadDim, multiple, *out[i]);
    if (!err.empty()) return err;
  }
  if (tokens && a.beta == nullptr) return "beta must not be NULL";
  return check_strides("beta", a.beta_strides, a, 1, 1, f.beta_strides);
}

// Bytes from the first to past the last element of a [B, T, H, row] view of `bytes`-byte
// elements (bf16 unless given); -1 when they exceed the address space (strides no tensor can
// have).
int64_t strided_bytes(const flash_kda_fwd_args &a, const Strides &s, int64_t row,
                      int64_t bytes = 2) {
  if (a.batch == 0 || a.seqlen == 0) return 0;
  int64_t span = row, term = 0;
  const int64_t steps[3][2] = {
      {a.batch - 1, s.batch}, {a.seqlen - 1, s.token}, {a.heads - 1, s.head}};
  for (const auto &step : steps) {
    if (__builtin_mul_overflow(step[0], step[1], &term) ||
        __builtin_add_overflow(span, term, &span))
      return -1;
  }
  return span > (int64_t{1} << 56) ? -1 : bytes * span;
}

// The arguments whose pointers check_pointers reads, in PointerFacts order: the outputs
// first (kWriters), then everything a call reads.
constexpr const char *kPointerNames[kPointerArgs] = {
    "out", "final_state", "checkpoints", "workspace", "q", "k", "v", "g", "beta",
    "A_log", "dt_bias", "initial_state", "cu_seqlens", "state_indices", "has_initial_state"};
constexpr int kWriters = 4, kWorkspaceArg = 3, kInitialArg = 11;

// Each argument's span and the alignment its pointer needs (what check_pointers reads), from
// the sizes, dtypes and strides: 16 bytes for the activations' vector loads, the gate
// parameters and the states, the element for beta, 8 for the index tensors.
std::string derive_spans(const flash_kda_fwd_args &a, PointerFacts &f) {
  const int64_t state = a.heads * kHeadDim * kHeadDim;
  const int64_t slots = a.state_indices != nullptr ? a.state_pool_size : a.num_seqs;
  const auto bytes = [](const void *ptr, int64_t n) { return ptr == nullptr ? 0 : n; };
  const int64_t spans[kPointerArgs] = {
      strided_bytes(a, f.out_strides, kHeadDim),
      bytes(a.final_state, slots * state * element_bytes(a.final_state_dtype)),
      bytes(a.checkpoints, a.checkpoint_slots * state * element_bytes(a.checkpoints_dtype)),
      0,  // the workspace: the call's workspace_bytes
      strided_bytes(a, f.q_strides, kHeadDim),
      strided_bytes(a, f.k_strides, kHeadDim),
      strided_bytes(a, f.v_strides, kHeadDim),
      strided_bytes(a, f.g_strides, kHeadDim, g_bytes(a)),
      strided_bytes(a, f.beta_strides, 1, beta_bytes(a)),
      bytes(a.A_log, 4 * a.heads),
      bytes(a.dt_bias, 4 * kHeadDim * a.heads),
      bytes(a.initial_state, slots * state * element_bytes(a.initial_state_dtype)),
      bytes(a.cu_seqlens, (a.num_seqs + 1) * element_bytes(a.cu_seqlens_dtype)),
      bytes(a.state_indices, a.num_seqs * element_bytes(a.state_indices_dtype)),
      bytes(a.has_initial_state, a.num_seqs)};
  const int32_t align[kPointerArgs] = {16, 16, 16, 16, 16, 16, 16, 16,
                                       static_cast<int32_t>(beta_bytes(a)),
                                       16, 16, 16, 8, 8, 1};
  for (int i = 0; i < kPointerArgs; ++i) {
    if (spans[i] < 0)
      return std::string(kPointerNames[i]) + " strides reach beyond the address space";
    f.bytes[i] = spans[i];
    f.align[i] = align[i];
  }
  return "";
}

}  // namespace

// Each pointer's alignment, and that no output (out, final_state, checkpoints, workspace)
// overlaps a later argument of the list (docs/api.md), except final_state at initial_state
// itself (in place).
std::string check_pointers(const flash_kda_fwd_args &a, const PointerFacts &f) {
  const void *const ptrs[kPointerArgs] = {
      a.out, a.final_state, a.checkpoints, a.workspace, a.q, a.k, a.v, a.g, a.beta,
      a.A_log, a.dt_bias, a.initial_state, a.cu_seqlens, a.state_indices, a.has_initial_state};
  uintptr_t base[kPointerArgs];
  int64_t span[kPointerArgs];
  for (int i = 0; i < kPointerArgs; ++i) {
    base[i] = reinterpret_cast<uintptr_t>(ptrs[i]);
    if (base[i] & static_cast<uintptr_t>(f.align[i] - 1))
      return std::string(kPointerNames[i]) + " must be " + str(f.align[i]) + "-byte aligned";
    span[i] = f.bytes[i];
  }
  span[kWorkspaceArg] = a.workspace == nullptr ? 0 : std::max<int64_t>(a.workspace_bytes, 0);
  for (int w = 0; w < kWriters; ++w) {
    if (span[w] == 0) continue;
    for (int o = w + 1; o < kPointerArgs; ++o) {
      if (span[o] == 0 || base[w] >= base[o] + span[o] || base[o] >= base[w] + span[w]) continue;
      const bool in_place = w == 1 && o == kInitialArg && base[w] == base[o];
      if (!in_place)
        return std::string(kPointerNames[w]) + " must not overlap " + kPointerNames[o] +
               " in memory";
    }
  }
  return "";
}

std::string read_args(const flash_kda_fwd_args *in, flash_kda_fwd_args &a) {
  std::memset(&a, 0, sizeof(a));
  if (in == nullptr) return "args must not be NULL";
  if (in->struct_size < kArgsV1Bytes || in->struct_size > sizeof(flash_kda_fwd_args))
    return "args->struct_size must be in [" + str(kArgsV1Bytes) + ", " +
           str(sizeof(flash_kda_fwd_args)) + "], got " + str(in->struct_size);
  std::memcpy(&a, in, in->struct_size);
  const int32_t retired[] = {a.reserved0, a.reserved1, a.reserved2, a.reserved3};
  const char *names[] = {"block_v", "segment_chunks", "overlap", "chunk_tokens"};
  for (int i = 0; i < 4; ++i) {
    if (retired[i] != 0)
      return "args->reserved" + str(i) + " must be 0, got " + str(retired[i]) + " (ABI 5's " +
             names[i] + ": plan overrides are in flash_kda_testing.h since ABI 6)";
  }
  return "";
}

std::string read_overrides(const flash_kda_testing_overrides *in, flash_kda_testing_overrides &o) {
  std::memset(&o, 0, sizeof(o));
  if (in == nullptr) return "";
  if (in->struct_size < sizeof(uint32_t) || in->struct_size > sizeof(o))
    return "overrides->struct_size must be in [4, " + str(sizeof(o)) + "], got " +
           str(in->struct_size);
  std::memcpy(&o, in, in->struct_size);
  if (o.unvalidated_forms != 0 && o.unvalidated_forms != 1)
    return "overrides->unvalidated_forms must be 0 or 1, got " + str(o.unvalidated_forms);
  if (o.stable_inverse < -1 || o.stable_inverse > 1)
    return "overrides->stable_inverse must be -1, 0 or 1, got " + str(o.stable_inverse);
  return "";
}

namespace {

ProblemSizes sizes_of(const flash_kda_fwd_args &a) {
  return {a.batch,     a.seqlen, a.heads, a.num_seqs, a.cu_seqlens != nullptr, a.checkpoint_every,
          a.max_seqlen};
}

PlanRequest request_of(const flash_kda_fwd_args &a, const flash_kda_testing_overrides &o) {
  return {a.mode, o.block_v, o.segment_chunks, o.overlap, o.chunk_tokens, a.gate};
}

}  // namespace

std::string check_call(const flash_kda_fwd_args &a, const flash_kda_testing_overrides &o) {
  if (a.head_dim != kHeadDim) return "head_dim must be 128, got " + str(a.head_dim);
  std::string err = check_sizes(sizes_of(a));
  if (!err.empty() || !has_tokens(a)) return err;
  if (o.block_v == 0 && a.num_sms < 1)
    return "num_sms must be >= 1 when block_v is 0, got " + str(a.num_sms);
  if (o.device < FLASH_KDA_TESTING_DEVICE_CURRENT || o.device > FLASH_KDA_TESTING_DEVICE_SM120)
    return "overrides->device must be a flash_kda_testing_device_id, got " + str(o.device);
  return check_request(sizes_of(a), request_of(a, o));
}

std::string check_plan(const flash_kda_fwd_args &a, const flash_kda_testing_overrides &o,
                       const PlanDevice &device, Plan &plan) {
  if (!has_tokens(a)) {
    plan = Plan{};
    plan.chunk_tokens = kChunk;
    return "";
  }
  return cached_plan(sizes_of(a), request_of(a, o), device, plan);
}

TestSwitches switches_of(const flash_kda_testing_overrides &o) {
  TestSwitches t{};
  t.generic = o.generic_passes;
  t.sms = o.sim_sms;
  t.smem_optin = o.sim_smem_optin;
  t.smem_sm = o.sim_smem_sm;
  t.threads_sm = o.sim_threads_sm;
  t.regs_sm = o.sim_regs_sm;
  t.k1_ctas_sm = o.sim_k1_ctas_sm;
  t.stall = o.stall;
  t.record = o.launches;
  return t;
}

std::string check_tensors(const flash_kda_fwd_args &a, PointerFacts &facts) {
  const std::string forms = check_forms(a);
  if (!forms.empty()) return forms;
  std::string err = check_activations(a, facts);
  const int64_t slots = a.state_indices != nullptr ? a.state_pool_size : a.num_seqs;
  const int64_t state = a.heads * kHeadDim * kHeadDim;
  if (err.empty())
    err = check_state("initial_state", a.initial_state, a.initial_state_dtype, slots * state);
  if (err.empty())
    err = check_state("final_state", a.final_state, a.final_state_dtype, slots * state);
  if (err.empty())
    err =
        check_state("checkpoints", a.checkpoints, a.checkpoints_dtype, a.checkpoint_slots * state);
  if (!err.empty()) return err;
  if (a.initial_state_dtype != FLASH_KDA_DTYPE_NONE &&
      a.final_state_dtype != FLASH_KDA_DTYPE_NONE && a.initial_state_dtype != a.final_state_dtype)
    return "initial_state and final_state must have the same dtype";
  if (a.cu_seqlens != nullptr) {
    err = check_index_dtype("cu_seqlens", a.cu_seqlens_dtype, true);
    if (!err.empty()) return err;
  }
  if (a.state_indices != nullptr) {
    err = check_index_dtype("state_indices", a.state_indices_dtype, false);
    if (!err.empty()) return err;
    if (a.state_pool_size < 1 || a.state_pool_size > kMaxSeqs)
      return "state_pool_size must be in [1, 2^30] with state_indices, got " +
             str(a.state_pool_size);
  } else if (a.state_indices_dtype != FLASH_KDA_DTYPE_NONE) {
    return "state_indices is NULL but state_indices_dtype is " + str(a.state_indices_dtype);
  }
  if (a.checkpoints != nullptr &&
      (a.checkpoint_every <= 0 || a.checkpoint_slots < 0 || a.checkpoint_slots > kMaxTokens))
    return "checkpoints need checkpoint_every > 0 and checkpoint_slots in [0, 2^31), got " +
           str(a.checkpoint_every) + " and " + str(a.checkpoint_slots);
  const float scale = static_cast<float>(a.scale);
  if (!std::isfinite(a.scale) || !std::isfinite(scale) ||
      ((bf16_bits(scale) >> 7) & 0xffu) == 0xffu)
    return "scale must be finite in bfloat16 (|scale| < 3.39e38), got " + std::to_string(a.scale);
  return derive_spans(a, facts);
}

std::string check_workspace(const flash_kda_fwd_args &a, const Plan &plan) {
  if (plan.workspace_bytes > 0 && a.workspace == nullptr) return "workspace must not be NULL";
  if (a.workspace_bytes < plan.workspace_bytes)
    return "workspace must hold " + str(plan.workspace_bytes) + " bytes, got " +
           str(a.workspace_bytes);
  return "";
}

namespace {

Dtype dtype_or(int32_t d, Dtype none) {
  return d == FLASH_KDA_DTYPE_NONE ? none : static_cast<Dtype>(d);
}

}  // namespace

void fill_params(const flash_kda_fwd_args &a, const Plan &plan, const PointerFacts &facts,
                 FwdParams &p) {
  p.q_strides = facts.q_strides;
  p.k_strides = facts.k_strides;
  p.v_strides = facts.v_strides;
  p.g_strides = facts.g_strides;
  p.beta_strides = facts.beta_strides;
  p.out_strides = facts.out_strides;
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
  p.gate = static_cast<Gate>(a.gate);
  p.g_fp32 = a.g_dtype == FLASH_KDA_DTYPE_FP32;
  p.beta_fp32 = a.beta_dtype == FLASH_KDA_DTYPE_FP32;
  p.beta_prob = a.beta_form == FLASH_KDA_BETA_PROBABILITY;
  p.stable_inverse = 0;  // the caller's choice (api.cpp forward)
}

}  // namespace flash_kda
