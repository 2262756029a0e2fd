// SPDX-License-Identifier: MIT
// plan_cache.cpp: a direct-mapped table of plans (plan_cache.h) behind one mutex.
#include "plan_cache.h"

#include <cstdint>
#include <cstring>
#include <mutex>

namespace flash_kda {
namespace {

// Every input of make_plan, without padding bytes, so that keys compare as bytes: the
// sizes, the request and the device's facts (plan.h plan_device_words).
struct PlanKey {
  int64_t batch, seqlen, heads, num_seqs, max_seqlen;
  int32_t checkpoint_every, varlen;
  int32_t mode, block_v, segment_chunks, overlap, chunk_tokens, gate;
  int32_t device[kPlanDeviceWords];
};
static_assert(sizeof(PlanKey) == 5 * 8 + (8 + kPlanDeviceWords) * 4,
              "PlanKey must have no padding");
// A new input of make_plan must join PlanKey (and key_of): the sizes of the three structs as
// PlanKey was written for them.
static_assert(sizeof(ProblemSizes) == 48 && sizeof(PlanRequest) == 24 && sizeof(PlanDevice) == 96,
              "ProblemSizes, PlanRequest or PlanDevice changed: add the new field to PlanKey");

struct Entry {
  bool used;
  PlanKey key;
  Plan plan;
};

constexpr int kEntries = 256;  // distinct calls remembered (serving: one per token count)
Entry g_entries[kEntries];
std::mutex g_lock;

PlanKey key_of(const ProblemSizes &z, const PlanRequest &r, const PlanDevice &d) {
  PlanKey key = {z.batch,
                 z.seqlen,
                 z.heads,
                 z.num_seqs,
                 z.max_seqlen,
                 z.checkpoint_every,
                 z.varlen ? 1 : 0,
                 r.mode,
                 r.block_v,
                 r.segment_chunks,
                 r.overlap,
                 r.chunk_tokens,
                 r.gate,
                 {}};
  plan_device_words(d, key.device);
  return key;
}

// FNV-1a over the key's bytes.
uint32_t slot_of(const PlanKey &key) {
  const auto *bytes = reinterpret_cast<const unsigned char *>(&key);
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < sizeof(key); ++i) h = (h ^ bytes[i]) * 1099511628211ull;
  return static_cast<uint32_t>((h ^ (h >> 32)) % kEntries);
}

}  // namespace

std::string cached_plan(const ProblemSizes &sizes, const PlanRequest &request,
                        const PlanDevice &device, Plan &plan) {
  const PlanKey key = key_of(sizes, request, device);
  Entry &entry = g_entries[slot_of(key)];
  {
    const std::lock_guard<std::mutex> lock(g_lock);
    if (entry.used && std::memcmp(&entry.key, &key, sizeof(key)) == 0) {
      plan = entry.plan;
      return "";
    }
  }
  std::string err = make_plan(sizes, request, device, plan);
  if (!err.empty()) return err;
  const std::lock_guard<std::mutex> lock(g_lock);
  entry = {true, key, plan};
  return "";
}

}  // namespace flash_kda
