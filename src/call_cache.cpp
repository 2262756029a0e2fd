// SPDX-License-Identifier: MIT
// call_cache.cpp: the known calls (call_cache.h), a small table behind one mutex, replaced
// round robin.
#include "call_cache.h"

#include <cstring>
#include <mutex>

namespace flash_kda {
namespace {

constexpr int kEntries = 16;  // signatures remembered (one per layer shape of a serving step)

struct Entry {
  bool used;
  CallSignature signature;
  KnownCall known;
};

Entry g_entries[kEntries];
int g_next = 0;
uint64_t g_ids = 0;
std::mutex g_lock;

const void *presence(const void *p) { return p != nullptr ? reinterpret_cast<const void *>(1) : nullptr; }

}  // namespace

CallSignature signature_of(const flash_kda_fwd_args &a, int32_t compute_capability, int32_t device) {
  CallSignature s;
  std::memset(&s, 0, sizeof(s));  // padding included, so that signatures compare as bytes
  std::memcpy(&s.shape, &a, sizeof(a));
  flash_kda_fwd_args &f = s.shape;
  f.q = presence(a.q);
  f.k = presence(a.k);
  f.v = presence(a.v);
  f.g = presence(a.g);
  f.beta = presence(a.beta);
  f.out = const_cast<void *>(presence(a.out));
  f.A_log = static_cast<const float *>(presence(a.A_log));
  f.dt_bias = static_cast<const float *>(presence(a.dt_bias));
  f.initial_state = presence(a.initial_state);
  f.final_state = const_cast<void *>(presence(a.final_state));
  f.cu_seqlens = presence(a.cu_seqlens);
  f.state_indices = presence(a.state_indices);
  f.has_initial_state = static_cast<const uint8_t *>(presence(a.has_initial_state));
  f.checkpoints = const_cast<void *>(presence(a.checkpoints));
  f.workspace = nullptr;
  f.workspace_bytes = 0;
  s.compute_capability = compute_capability;
  s.device = device;
  return s;
}

bool known_call(const CallSignature &signature, KnownCall &known) {
  const std::lock_guard<std::mutex> lock(g_lock);
  for (const Entry &e : g_entries)
    if (e.used && std::memcmp(&e.signature, &signature, sizeof(signature)) == 0) {
      known = e.known;
      return true;
    }
  return false;
}

void remember_call(const CallSignature &signature, const KnownCall &known) {
  const std::lock_guard<std::mutex> lock(g_lock);
  for (Entry &e : g_entries)
    if (e.used && std::memcmp(&e.signature, &signature, sizeof(signature)) == 0) return;
  Entry &e = g_entries[g_next];
  g_next = (g_next + 1) % kEntries;
  e.used = true;
  e.signature = signature;
  e.known = known;
  e.known.id = ++g_ids;
}

}  // namespace flash_kda
