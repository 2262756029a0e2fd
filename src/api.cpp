// SPDX-License-Identifier: MIT
// api.cpp: the C ABI (flash_kda.h) and the test entry points (flash_kda_testing.h). Checks
// arguments (args.h, docs/api.md), finds the arch table for the caller's compute capability,
// plans the call (plan.h, remembered per plan input), fills FwdParams and launches.
// Host-only; every export is a noexcept shim that turns failures into a status and a
// thread-local message.
#include <flash_kda/flash_kda.h>
#include <flash_kda/flash_kda_testing.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "arch/table.h"
#include "args.h"
#include "call_cache.h"
#include "costs.h"
#include "kda/config.h"
#include "kda/workspace.h"
#include "plan.h"
#include "replay.h"

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

// The ABI 3 prefix of flash_kda_fwd_plan_info: what an older caller passes.
constexpr size_t kPlanInfoV3Bytes = offsetof(flash_kda_fwd_plan_info, chunk_tokens);

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

// The facts of the device a call is planned for: the reference device overrides->device
// (costs.h, no GPU asked), else the current device's through `table` (launch.cuh
// plan_device, under the test switches). The plan spreads the work over sim_sms SMs where a
// test sets it, else over the caller's num_sms. FLASH_KDA_OK, or the failure recorded.
flash_kda_status device_for(const char *fn, int32_t cc, const flash_kda_fwd_args &a,
                            const flash_kda_testing_overrides &o, PlanDevice &d) {
  if (o.device != FLASH_KDA_TESTING_DEVICE_CURRENT) {
    for (const ReferenceDevice &r : kReferenceDevices)
      if (r.id == o.device) d = r.facts;
  } else {
    const ArchTable *table = nullptr;
    flash_kda_status st = find_table(fn, cc, table);
    if (st == FLASH_KDA_OK) st = check_driver(fn);
    if (st != FLASH_KDA_OK) return st;
    const LaunchStatus query = table->plan_device(switches_of(o), d);
    if (query.error != cudaSuccess) return launch_result(fn, query);
  }
  d.sms = o.sim_sms > 0 ? o.sim_sms : a.num_sms;
  return FLASH_KDA_OK;
}

// flash_kda_fwd_plan with overrides: the plan info of the checked arguments.
flash_kda_status plan_call(const char *fn, int32_t cc, const flash_kda_fwd_args *args,
                           const flash_kda_testing_overrides *overrides,
                           flash_kda_fwd_plan_info *out) {
  if (out == nullptr ||
      (out->struct_size != sizeof(flash_kda_fwd_plan_info) && out->struct_size != kPlanInfoV3Bytes))
    return fail(FLASH_KDA_INVALID_ARGUMENT, fn,
                "plan must not be NULL and plan->struct_size must be " +
                    std::to_string(sizeof(flash_kda_fwd_plan_info)) + " (or " +
                    std::to_string(kPlanInfoV3Bytes) + ", ABI 3)");
  flash_kda_fwd_args a;
  flash_kda_testing_overrides o;
  std::string err = read_args(args, a);
  if (err.empty()) err = read_overrides(overrides, o);
  if (err.empty()) err = check_call(a, o);
  if (!err.empty()) return fail(FLASH_KDA_INVALID_ARGUMENT, fn, err);
  PlanDevice device{};
  if (has_tokens(a)) {
    const flash_kda_status st = device_for(fn, cc, a, o, device);
    if (st != FLASH_KDA_OK) return st;
  }
  Plan plan{};
  err = check_plan(a, o, device, plan);
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
}

// The launch of a call that passed every check: its params (strides from its facts) laid
// out by the plan, under the test switches, on `stream` with the table's kernels.
flash_kda_status launch_checked(const char *fn, const flash_kda_fwd_args &a,
                                const flash_kda_testing_overrides &o, const KnownCall &known,
                                void *stream) {
  FwdParams params{};
  fill_params(a, known.plan, known.facts, params);
  params.test = switches_of(o);
  if (o.wait_limit_ns > 0) params.wait_limit_ns = static_cast<uint64_t>(o.wait_limit_ns);
  if (params.test.record != nullptr) params.test.record->count = 0;
  params.stable_inverse = known.stable_inverse;
  const auto s = static_cast<cudaStream_t>(stream);
  if (known.id != 0) return launch_result(fn, launch_known(known.id, *known.table, params, s));
  LaunchSink sink(s);
  return launch_result(fn, known.table->fwd(params, sink));
}

// flash_kda_fwd with overrides: every check that needs no device, then the device's facts,
// the plan and the workspace, then the launches (none for a call without sequences; only
// the state copy for one without tokens).
flash_kda_status forward(const char *fn, int32_t compute_capability, const flash_kda_fwd_args *args,
                         const flash_kda_testing_overrides *overrides, void *stream) {
  flash_kda_fwd_args a;
  flash_kda_testing_overrides o;
  std::string err = read_args(args, a);
  if (err.empty()) err = read_overrides(overrides, o);
  if (err.empty() && o.device != FLASH_KDA_TESTING_DEVICE_CURRENT)
    err =
        "overrides->device plans for a reference device: flash_kda_testing_fwd runs the current "
        "one";
#ifndef FLASH_KDA_DEBUG_WAITS
  if (err.empty() && o.stall != 0)
    err = "overrides->stall needs a library built with FLASH_KDA_DEBUG_WAITS=ON (its kernels "
          "carry the planted stall and the bounded waits that end it), got stall " +
          std::to_string(o.stall) + " in a release build";
#endif
  if (!err.empty()) return fail(FLASH_KDA_INVALID_ARGUMENT, fn, err);
  // A signature met before (the product entry only: test overrides always take every check)
  // runs the checks of its pointers, then launches with what the others found then.
  CallSignature signature{};
  const bool cacheable = overrides == nullptr && has_tokens(a);
  int device_index = -1;
  if (cacheable && cudaGetDevice(&device_index) == cudaSuccess) {
    signature = signature_of(a, compute_capability, device_index);
    KnownCall known{};
    if (known_call(signature, known)) {
      err = check_pointers(a, known.facts);
      if (err.empty()) err = check_workspace(a, known.plan);
      if (!err.empty()) return fail(FLASH_KDA_INVALID_ARGUMENT, fn, err);
      return launch_checked(fn, a, o, known, stream);
    }
  }
  const ArchTable *table = nullptr;
  flash_kda_status st = find_table(fn, compute_capability, table);
  if (st != FLASH_KDA_OK) return st;
  PointerFacts facts{};
  err = check_call(a, o);
  if (err.empty()) err = check_tensors(a, facts);
  if (err.empty()) err = check_pointers(a, facts);
  if (!err.empty()) return fail(FLASH_KDA_INVALID_ARGUMENT, fn, err);
  if (!default_forms(a) && !(table->features & FLASH_KDA_FEATURE_GATE_FORMS) &&
      o.unvalidated_forms != 1)
    return fail(FLASH_KDA_UNSUPPORTED_DEVICE, fn,
                std::string("gate ") + std::to_string(a.gate) + ", beta_form " +
                    std::to_string(a.beta_form) + ", g_dtype " + std::to_string(a.g_dtype) +
                    ", beta_dtype " + std::to_string(a.beta_dtype) + ": the kernels of the " +
                    "non-default gate and beta forms are built but not yet validated on " +
                    table->name + " (FLASH_KDA_FEATURE_GATE_FORMS)");
  if (a.num_seqs == 0) return FLASH_KDA_OK;
  st = check_driver(fn);
  if (st != FLASH_KDA_OK) return st;
  PlanDevice device{};
  if (has_tokens(a)) {
    st = device_for(fn, compute_capability, a, o, device);
    if (st != FLASH_KDA_OK) return st;
  }
  Plan plan{};
  err = check_plan(a, o, device, plan);
  if (err.empty()) err = check_workspace(a, plan);
  if (!err.empty()) return fail(FLASH_KDA_INVALID_ARGUMENT, fn, err);
  // AUTO mode's stable inverse where the table enables it, or the test entry point asks
  const bool stable = o.stable_inverse == 0
                          ? (table->features & FLASH_KDA_FEATURE_STABLE_INVERSE) != 0
                          : o.stable_inverse == 1;
  const KnownCall known{table, a.mode == FLASH_KDA_MODE_AUTO && stable, plan, facts, 0};
  if (cacheable && device_index >= 0) remember_call(signature, known);
  return launch_checked(fn, a, o, known, stream);
}

// The facts of flash_kda_testing_device_facts.
flash_kda_status device_facts_call(const char *fn, int32_t cc,
                                   const flash_kda_testing_overrides *overrides,
                                   flash_kda_testing_device *out) {
  flash_kda_testing_overrides o;
  std::string err = read_overrides(overrides, o);
  if (err.empty() && (out == nullptr || out->struct_size != sizeof(flash_kda_testing_device)))
    err = "facts must not be NULL and facts->struct_size must be " +
          std::to_string(sizeof(flash_kda_testing_device));
  if (!err.empty()) return fail(FLASH_KDA_INVALID_ARGUMENT, fn, err);
  flash_kda_fwd_args a{};
  a.num_sms = 0;
  PlanDevice d{};
  const flash_kda_status st = device_for(fn, cc, a, o, d);
  if (st != FLASH_KDA_OK) return st;
  if (o.device == FLASH_KDA_TESTING_DEVICE_CURRENT && o.sim_sms <= 0) {
    int device = 0, sms = 0;
    if (cudaGetDevice(&device) == cudaSuccess &&
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) == cudaSuccess)
      d.sms = sms;
  } else if (o.sim_sms <= 0) {
    for (const ReferenceDevice &r : kReferenceDevices)
      if (r.id == o.device) d.sms = r.facts.sms;
  }
  static_assert(sizeof(flash_kda_testing_device) == 4 * (1 + kPlanDeviceWords),
                "flash_kda_testing_device is struct_size and plan.h plan_device_words");
  int32_t words[kPlanDeviceWords];
  plan_device_words(d, words);
  std::memcpy(&out->compute_capability, words, sizeof(words));
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

flash_kda_status flash_kda_fwd_plan(int32_t compute_capability, const flash_kda_fwd_args *args,
                                    flash_kda_fwd_plan_info *plan) noexcept {
  try {
    return flash_kda::plan_call("flash_kda_fwd_plan", compute_capability, args, nullptr, plan);
  } catch (...) {
    return fail(FLASH_KDA_INTERNAL, "flash_kda_fwd_plan", "unexpected C++ exception");
  }
}

flash_kda_status flash_kda_fwd(int32_t compute_capability, const flash_kda_fwd_args *args,
                               void *stream) noexcept {
  try {
    return flash_kda::forward("flash_kda_fwd", compute_capability, args, nullptr, stream);
  } catch (...) {
    return fail(FLASH_KDA_INTERNAL, "flash_kda_fwd", "unexpected C++ exception");
  }
}

// ---- flash_kda_testing.h: the same checks, plan and launches with forced plan parts ----

int32_t flash_kda_testing_version(void) noexcept {
  return FLASH_KDA_TESTING_VERSION;
}

flash_kda_status flash_kda_testing_plan(int32_t compute_capability, const flash_kda_fwd_args *args,
                                        const flash_kda_testing_overrides *overrides,
                                        flash_kda_fwd_plan_info *plan) noexcept {
  try {
    return flash_kda::plan_call("flash_kda_testing_plan", compute_capability, args, overrides,
                                plan);
  } catch (...) {
    return fail(FLASH_KDA_INTERNAL, "flash_kda_testing_plan", "unexpected C++ exception");
  }
}

flash_kda_status flash_kda_testing_device_facts(int32_t compute_capability,
                                                const flash_kda_testing_overrides *overrides,
                                                flash_kda_testing_device *facts) noexcept {
  try {
    return flash_kda::device_facts_call("flash_kda_testing_device_facts", compute_capability,
                                        overrides, facts);
  } catch (...) {
    return fail(FLASH_KDA_INTERNAL, "flash_kda_testing_device_facts", "unexpected C++ exception");
  }
}

flash_kda_status flash_kda_testing_fwd(int32_t compute_capability, const flash_kda_fwd_args *args,
                                       const flash_kda_testing_overrides *overrides,
                                       void *stream) noexcept {
  try {
    return flash_kda::forward("flash_kda_testing_fwd", compute_capability, args, overrides, stream);
  } catch (...) {
    return fail(FLASH_KDA_INTERNAL, "flash_kda_testing_fwd", "unexpected C++ exception");
  }
}

int64_t flash_kda_testing_replays(void) noexcept {
  return flash_kda::replayed_calls();
}

int32_t flash_kda_testing_set_replays(int32_t on) noexcept {
  return flash_kda::set_replays(on != 0) ? 1 : 0;
}

flash_kda_status flash_kda_probe_unary_op(int32_t compute_capability, int32_t op, const float *x,
                                          float *y, int64_t count, void *stream) noexcept {
  const char *fn = "flash_kda_probe_unary_op";
  try {
    const flash_kda::ArchTable *table = nullptr;
    flash_kda_status st = flash_kda::find_table(fn, compute_capability, table);
    if (st != FLASH_KDA_OK) return st;
    if (op < FLASH_KDA_PROBE_EX2 || op > FLASH_KDA_PROBE_LG2)
      return fail(FLASH_KDA_INVALID_ARGUMENT, fn,
                  "op must be EX2, SIGMOID, RSQRT or LG2, got " + std::to_string(op));
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
