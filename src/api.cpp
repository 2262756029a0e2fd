// SPDX-License-Identifier: MIT
// api.cpp: the C ABI (flash_kda.h). Checks arguments (spec §1.5), finds the arch table
// for the caller's compute capability, fills FwdParams and launches. Host-only; every
// export is a noexcept shim that turns failures into a status and a thread-local message.
#include <flash_kda/flash_kda.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>

#include "arch/table.h"
#include "kda/workspace.h"

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

std::string cc_name(int32_t cc) {
  return "sm_" + std::to_string(cc);
}

flash_kda_status find_table(const char *fn, int32_t cc, const ArchTable *&table) {
  for (int i = 0; i < kNumTables; ++i) {
    if (kTables[i]->compute_capability == cc) {
      table = kTables[i];
      return FLASH_KDA_OK;
    }
  }
  return fail(FLASH_KDA_UNSUPPORTED_DEVICE, fn,
              "no kernel for " + cc_name(cc) + " in this build (has " + arch_names() + ")");
}

flash_kda_status launch_result(const char *fn, const LaunchStatus &st) {
  if (st.error == cudaSuccess) return FLASH_KDA_OK;
  return fail(FLASH_KDA_CUDA_ERROR, fn,
              std::string(st.stage) + " failed: " + cudaGetErrorName(st.error));
}

bool aligned16(const void *p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

// Round-to-nearest-even fp32 -> bf16 (finite inputs), spec §3.2 step 6: sb = bf(fp32(scale)).
uint32_t bf16_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}

int32_t pick_block_v(int64_t pairs, int32_t num_sms) {
  for (int32_t bv : {32, 64, 128})
    if (pairs * (kHeadDim / bv) <= num_sms) return bv;
  return 128;
}

// The argument checks of flash_kda_fwd (spec §1.5); on success fills `p`.
flash_kda_status check_fwd_args(const char *fn, const flash_kda_fwd_args &a, FwdParams &p) {
  auto bad = [&](const std::string &msg) { return fail(FLASH_KDA_INVALID_ARGUMENT, fn, msg); };
  if (a.head_dim != kHeadDim) return bad("head_dim must be 128, got " + std::to_string(a.head_dim));
  if (a.batch < 1 || a.seqlen < 1 || a.heads < 1)
    return bad("batch, seqlen and heads must be >= 1, got " + std::to_string(a.batch) + ", " +
               std::to_string(a.seqlen) + ", " + std::to_string(a.heads));
  if (a.heads > 65535) return bad("heads must be <= 65535, got " + std::to_string(a.heads));
  const void *required[] = {a.q, a.k, a.v, a.g, a.beta, a.out, a.A_log, a.dt_bias, a.workspace};
  const char *names[] = {"q", "k", "v", "g", "beta", "out", "A_log", "dt_bias", "workspace"};
  for (int i = 0; i < 9; ++i) {
    if (required[i] == nullptr) return bad(std::string(names[i]) + " must not be NULL");
    if (!aligned16(required[i])) return bad(std::string(names[i]) + " must be 16-byte aligned");
  }
  const bool varlen = a.cu_seqlens != nullptr;
  if (varlen && a.batch != 1)
    return bad("batch must be 1 when cu_seqlens is given, got " + std::to_string(a.batch));
  if (a.num_seqs < 1 || (!varlen && a.num_seqs != a.batch))
    return bad("num_seqs must be batch (batched) or numel(cu_seqlens) - 1 >= 1, got " +
               std::to_string(a.num_seqs));
  const int32_t dtypes[2] = {a.initial_state_dtype, a.final_state_dtype};
  const void *states[2] = {a.initial_state, a.final_state};
  const char *state_names[2] = {"initial_state", "final_state"};
  for (int i = 0; i < 2; ++i) {
    if (dtypes[i] < FLASH_KDA_DTYPE_NONE || dtypes[i] > FLASH_KDA_DTYPE_FP32)
      return bad(std::string(state_names[i]) + " dtype must be NONE, BF16 or FP32, got " +
                 std::to_string(dtypes[i]));
    if ((dtypes[i] == FLASH_KDA_DTYPE_NONE) != (states[i] == nullptr))
      return bad(std::string(state_names[i]) + " pointer and dtype disagree (NULL iff NONE)");
    if (states[i] != nullptr && !aligned16(states[i]))
      return bad(std::string(state_names[i]) + " must be 16-byte aligned");
  }
  if (dtypes[0] != FLASH_KDA_DTYPE_NONE && dtypes[1] != FLASH_KDA_DTYPE_NONE &&
      dtypes[0] != dtypes[1])
    return bad("initial_state and final_state must have the same dtype");
  if (!std::isfinite(a.scale)) return bad("scale must be finite");
  if (!(a.lower_bound >= -5.0 && a.lower_bound < 0.0))
    return bad("lower_bound must be in [-5, 0), got " + std::to_string(a.lower_bound));
  if (a.block_v != 0 && a.block_v != 32 && a.block_v != 64 && a.block_v != 128)
    return bad("block_v must be 0, 32, 64 or 128, got " + std::to_string(a.block_v));
  if (a.block_v == 0 && a.num_sms < 1)
    return bad("num_sms must be >= 1 when block_v is 0, got " + std::to_string(a.num_sms));

  const int64_t total = a.batch * a.seqlen;
  if (total >= (int64_t{1} << 31))  // K2's tensor copies address tokens with int32
    return bad("batch * seqlen must be below 2^31, got " + std::to_string(total));
  const int64_t tiles = tiles_per_head(total, a.num_seqs);
  if (total > (int64_t{1} << 40) / a.heads || tiles >= (int64_t{1} << 31))
    return bad("problem too large: batch * seqlen * heads must stay below 2^40");
  const int64_t need = workspace_bytes(total, a.heads, a.num_seqs);
  if (a.workspace_bytes < need)
    return bad("workspace must hold " + std::to_string(need) + " bytes, got " +
               std::to_string(a.workspace_bytes));

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
  p.initial_dtype = a.initial_state_dtype;
  p.final_dtype = a.final_state_dtype;
  p.cu_seqlens = a.cu_seqlens;
  p.records = static_cast<uint8_t *>(a.workspace);
  p.tile_prefix =
      reinterpret_cast<int32_t *>(p.records + prefix_offset(total, a.heads, a.num_seqs));
  p.seqlen = a.seqlen;
  p.total_tokens = total;
  p.heads = a.heads;
  p.num_seqs = a.num_seqs;
  p.tiles_per_head = tiles;
  p.prepare_tiles = varlen ? tiles : a.num_seqs * ceil_div(a.seqlen, kChunk);
  p.gate_scale = static_cast<float>(a.lower_bound * 1.4426950408889634);  // spec §3.2 step 1
  p.scale_bf16 = bf16_bits(static_cast<float>(a.scale));
  p.block_v = a.block_v != 0 ? a.block_v : pick_block_v(a.num_seqs * a.heads, a.num_sms);
  return FLASH_KDA_OK;
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

int64_t flash_kda_workspace_size(int64_t total_tokens, int64_t heads, int64_t num_seqs) noexcept {
  if (total_tokens < 0 || heads < 1 || num_seqs < 1) return -1;
  if (total_tokens > (int64_t{1} << 40) / heads) return -1;
  return flash_kda::workspace_bytes(total_tokens, heads, num_seqs);
}

int32_t flash_kda_pick_block_v(int64_t num_seqs, int64_t heads, int32_t num_sms) noexcept {
  return flash_kda::pick_block_v(num_seqs * heads, num_sms);
}

flash_kda_status flash_kda_fwd(int32_t compute_capability, const flash_kda_fwd_args *args,
                               void *stream) noexcept {
  const char *fn = "flash_kda_fwd";
  try {
    if (args == nullptr) return fail(FLASH_KDA_INVALID_ARGUMENT, fn, "args must not be NULL");
    if (args->struct_size < sizeof(flash_kda_fwd_args))
      return fail(FLASH_KDA_INVALID_ARGUMENT, fn,
                  "args->struct_size must be >= " + std::to_string(sizeof(flash_kda_fwd_args)) +
                      ", got " + std::to_string(args->struct_size));
    const flash_kda::ArchTable *table = nullptr;
    flash_kda_status st = flash_kda::find_table(fn, compute_capability, table);
    if (st != FLASH_KDA_OK) return st;
    flash_kda::FwdParams params{};
    st = flash_kda::check_fwd_args(fn, *args, params);
    if (st != FLASH_KDA_OK) return st;
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
    if (count < 0)
      return fail(FLASH_KDA_INVALID_ARGUMENT, fn,
                  "count must be >= 0, got " + std::to_string(count));
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
    if (batch * (m / 16) * (n / 8) > (int64_t{1} << 31) * 4)
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
