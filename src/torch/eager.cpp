// SPDX-License-Identifier: MIT
// libflash_kda_torch: the eager call of a known signature in C (docs/dispatch.md, "The eager
// launch"). It makes two Python functions (METH_FASTCALL), launch and learn, that take
// flash_kda.fwd's tensors and scalars in slot order (python/flash_kda/_eager.py) and read each
// tensor through torch's C functions (torch/csrc/inductor/aoti_torch/c/shim.h): no torch op,
// no dispatcher, no argument boxing between Python and the launch.
//
// The package validates a call of a new signature completely in Python and then hands this
// library the call's flash_kda_fwd_args (a learn call, the same tensors). A later call of the
// same signature (every shape, stride, dtype, device and flag equal; any data pointers) is
// then read here, in a few hundred nanoseconds: its tensors' pointers are patched into the
// learned arguments and flash_kda_fwd runs them, whose own checks (NULL, alignment, overlap)
// run on every call. A call of a learned signature's family (the same but for its token
// count, its number of sequences and max_seqlen: a varlen serving step; batch 1) is checked
// here for what those sizes change (family_args), planned by flash_kda_fwd_plan and then
// learned itself. Anything else (a signature not learned, a gate parameter or index tensor
// that the Python path would copy to align it, no workspace for the stream) returns kMiss
// and the Python path runs the call.
//
// A tensor's handle for torch's C functions is the address of an at::Tensor, which is one
// pointer to its TensorImpl; Tensor._cdata gives that pointer, so a handle here is the address
// of a word holding it (the tensor stays alive: the caller holds it, and the GIL is held
// throughout). The package checks this reading once against a probe tensor's metadata
// (flash_kda_torch_probe) before it uses the functions.
//
// No link dependency: torch's and the interpreter's C functions are looked up once in the
// process (dlopen RTLD_NOLOAD, dlsym), and flash_kda_fwd and flash_kda_fwd_plan are passed in
// by address, so this library loads in any process and does nothing until
// flash_kda_torch_attach succeeds.
#include <dlfcn.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <utility>
#include <vector>

#include "flash_kda/flash_kda.h"

#define FLASH_KDA_TORCH_API extern "C" __attribute__((visibility("default")))

namespace {

using Value = uint64_t;  // a scalar's 64 bits (a double's bit pattern, an int64)
using Handle = void *;   // torch's AtenTensorHandle: an at::Tensor's address
using PyObj = void;      // the interpreter's PyObject
using FastFn = PyObj *(*)(PyObj *, PyObj *const *, intptr_t);  // a METH_FASTCALL function
using FwdFn = flash_kda_status (*)(int32_t, const flash_kda_fwd_args *, void *);
using PlanFn = flash_kda_status (*)(int32_t, const flash_kda_fwd_args *, flash_kda_fwd_plan_info *);

// The arguments of launch and learn in order (_eager.SLOTS): the tensors of flash_kda.fwd in
// its order (None or a torch.Tensor), then its scalars; then launch's kInference (whether
// inference mode is on) or learn's kLearned.
enum Slot : int {
  kQ, kK, kV, kG, kBeta, kOut,  // tensors
  kALog, kDtBias, kInitial, kFinal, kCuSeqlens, kIndices, kHasInitial, kCheckpoints,  // Tensor?
  kScale,            // float
  kLowerBound,       // float: 0 for None (see forms)
  kCheckpointEvery,  // int: 0 for None
  kMaxSeqlen,        // int: 0 for None
  kForms,            // int: _eager.forms() (gate, beta, mode, which of the three above are None)
  kSlots,
  kInference = kSlots,  // launch: True where torch.is_inference_mode_enabled()
  kLearned = kSlots,    // learn: the address of a Learned
};
constexpr int kTensors = kScale;
// the floating-point tensors, none of which may require grad in grad mode, and the outputs,
// which must not be inference tensors outside inference mode (the Python path raises for
// either; an index tensor cannot require grad)
constexpr Slot kFloats[] = {kQ, kK, kV, kG, kBeta, kOut, kALog, kDtBias, kInitial, kFinal, kCheckpoints};
constexpr Slot kOutputs[] = {kOut, kFinal, kCheckpoints};
constexpr const char *kSlotNames =
    "q,k,v,g,beta,out,A_log,dt_bias,initial_state,final_state,cu_seqlens,ssm_state_indices,"
    "has_initial_state,checkpoints,scale,lower_bound,checkpoint_every,max_seqlen,forms";

constexpr int64_t kMiss = -1;
constexpr int kMaxDims = 4;
// Per tensor: present, dtype, device type, device index, dim, sizes, strides; then the
// scalars and whether final_state is initial_state.
constexpr int kTensorWords = 5 + 2 * kMaxDims;
constexpr int kSizeWord = 5, kStrideWord = 5 + kMaxDims;  // a tensor's sizes[0], strides[0]
constexpr int kKeyWords = kTensors * kTensorWords + (kSlots - kScale) + 1;
constexpr int kRecords = 64;  // signatures kept (the Python records' bound)
constexpr int kMethFastcall = 0x0080;  // Python's METH_FASTCALL

// torch's C functions (torch/csrc/inductor/aoti_torch/c/shim.h, stable/c/shim.h).
struct Torch {
  int32_t (*data_ptr)(Handle, void **);
  int32_t (*dim)(Handle, int64_t *);
  int32_t (*sizes)(Handle, int64_t **);
  int32_t (*strides)(Handle, int64_t **);
  int32_t (*dtype)(Handle, int32_t *);
  int32_t (*device_type)(Handle, int32_t *);
  int32_t (*device_index)(Handle, int32_t *);
  int32_t (*device_type_cuda)();
  bool (*grad_mode)();
  // libtorch_cuda
  int32_t (*current_stream)(int32_t, void **);
  int32_t (*current_device)(int32_t *);
  int32_t (*create_guard)(int32_t, void **);
  int32_t (*delete_guard)(void *);
  // libcuda (cuda.h): CUresult cuStreamIsCapturing(CUstream, CUstreamCaptureStatus *)
  int32_t (*is_capturing)(void *, int32_t *);
};

// The interpreter's C functions (Python's stable ABI) and the objects the package passes
// (borrowed: the package keeps them alive).
struct Python {
  PyObj *(*get_attr)(PyObj *, PyObj *);                   // PyObject_GetAttr
  PyObj *(*call_method)(PyObj *, PyObj *, ...);           // PyObject_CallMethodObjArgs
  PyObj *(*type_of)(PyObj *);                             // PyObject_Type
  void *(*as_pointer)(PyObj *);                           // PyLong_AsVoidPtr
  long long (*as_int)(PyObj *);                           // PyLong_AsLongLong
  double (*as_double)(PyObj *);                           // PyFloat_AsDouble
  PyObj *(*from_int)(long long);                          // PyLong_FromLongLong
  PyObj *(*error)();                                      // PyErr_Occurred
  void (*clear_error)();                                  // PyErr_Clear
  void (*decref)(PyObj *);                                // Py_DecRef
  PyObj *(*new_function)(void *, PyObj *, PyObj *);       // PyCFunction_NewEx
  PyObj *none, *true_, *tensor, *parameter;               // None, True, torch.Tensor, torch.nn.Parameter
  PyObj *cdata, *requires_grad, *is_inference;            // the attribute names
};

// Python's PyMethodDef.
struct MethodDef {
  const char *name;
  FastFn fn;
  int flags;
  const char *doc;
};

Torch torch_fns{};
Python py{};
FwdFn fwd_fn = nullptr;
PlanFn plan_fn = nullptr;
int32_t cuda_type = -1;

// What the package passes with a learn call: the validated call's arguments (pointers
// included; they are replaced per call), the device's arch and index and the workspace the
// plan needs.
struct Learned {
  const flash_kda_fwd_args *args;
  int32_t compute_capability;
  int32_t device;
  int64_t workspace_bytes;
};

struct Record {
  bool used = false;
  bool has_family = false;  // batch 1: calls of other token and sequence counts may follow it
  int64_t key[kKeyWords];
  int64_t family[kKeyWords];  // family_of(key)
  flash_kda_fwd_args args;
  int32_t compute_capability, device;
  int64_t workspace_bytes;
};

struct Workspace {
  int32_t device;
  void *stream, *ptr;
  int64_t bytes;
};

std::mutex lock;
Record records[kRecords];
// Each record's hash and its family's, apart, so that a lookup reads eight cache lines
// rather than one of every record.
uint64_t hashes[kRecords], family_hashes[kRecords];
int next_victim = 0;
std::vector<Workspace> workspaces;
std::atomic<int64_t> launches{0};  // calls this library launched (for the tests)

// One argument's torch.Tensor (exactly: a subclass must see torch's dispatch, so the Python
// path takes it) as its TensorImpl; false for anything else. Clears any error it raised.
bool tensor_of(PyObj *obj, void *&impl) {
  PyObj *type = py.type_of(obj);
  const bool plain = type == py.tensor || type == py.parameter;
  py.decref(type);
  if (!plain) return false;
  PyObj *cdata = py.get_attr(obj, py.cdata);
  impl = cdata != nullptr ? py.as_pointer(cdata) : nullptr;
  if (cdata != nullptr) py.decref(cdata);
  if (py.error() != nullptr) py.clear_error();
  return impl != nullptr;
}

// Whether obj.<name> (an attribute, or with `call` a method without arguments) is True.
bool is_true(PyObj *obj, PyObj *name, bool call) {
  PyObj *v = call ? py.call_method(obj, name, static_cast<PyObj *>(nullptr)) : py.get_attr(obj, name);
  const bool yes = v == py.true_;
  if (v != nullptr) py.decref(v);
  if (py.error() != nullptr) py.clear_error();
  return yes;
}

// A call's arguments in slot order: each tensor's handle (nullptr for None) and the scalars.
// `ok` false for an argument the Python path must take: not a plain tensor, a tensor that
// requires grad in grad mode, an inference tensor to write outside inference mode, or a
// scalar of another type.
struct Args {
  void *impl[kTensors] = {};     // the tensors' TensorImpls
  Handle tensors[kTensors] = {};  // &impl[i]: an at::Tensor's address, or nullptr for None
  Value scalars[kSlots - kScale] = {};
  bool ok = false;
  Args(PyObj *const *a, bool inference_mode) {
    for (int i = 0; i < kTensors; ++i) {
      if (a[i] == py.none) continue;
      if (!tensor_of(a[i], impl[i])) return;
      tensors[i] = &impl[i];
    }
    if (torch_fns.grad_mode())
      for (Slot i : kFloats)
        if (tensors[i] != nullptr && is_true(a[i], py.requires_grad, false)) return;
    if (!inference_mode)
      for (Slot i : kOutputs)
        if (tensors[i] != nullptr && is_true(a[i], py.is_inference, true)) return;
    for (int i = kScale; i < kSlots; ++i) {
      if (i == kScale || i == kLowerBound) {
        const double d = py.as_double(a[i]);
        std::memcpy(&scalars[i - kScale], &d, sizeof(d));
      } else {
        const long long n = py.as_int(a[i]);
        std::memcpy(&scalars[i - kScale], &n, sizeof(n));
      }
    }
    ok = py.error() == nullptr;
    if (!ok) py.clear_error();
  }
  void *ptr(int slot) const {
    void *p = nullptr;
    if (tensors[slot] != nullptr) torch_fns.data_ptr(tensors[slot], &p);
    return p;
  }
};

// The signature of a call: every word that the Python validation's signature reads
// (python/flash_kda/_validate.py: signature), pointers aside. False for a tensor of more than
// kMaxDims dimensions (never valid: the Python path says why).
bool key_of(const Args &a, int64_t *key) {
  int64_t *w = key;
  for (int i = 0; i < kTensors; ++i) {
    Handle t = a.tensors[i];
    if (t == nullptr) {
      for (int j = 0; j < kTensorWords; ++j) *w++ = 0;
      continue;
    }
    int64_t dim = 0, *sizes = nullptr, *strides = nullptr;
    int32_t dtype = 0, type = 0, index = 0;
    torch_fns.dim(t, &dim);
    if (dim > kMaxDims) return false;
    torch_fns.sizes(t, &sizes);
    torch_fns.strides(t, &strides);
    torch_fns.dtype(t, &dtype);
    torch_fns.device_type(t, &type);
    torch_fns.device_index(t, &index);
    *w++ = 1;
    *w++ = dtype;
    *w++ = type;
    *w++ = index;
    *w++ = dim;
    for (int d = 0; d < kMaxDims; ++d) *w++ = d < dim ? sizes[d] : 0;
    for (int d = 0; d < kMaxDims; ++d) *w++ = d < dim ? strides[d] : 0;
  }
  for (Value v : a.scalars) *w++ = static_cast<int64_t>(v);
  *w++ = a.tensors[kInitial] != nullptr && a.ptr(kInitial) == a.ptr(kFinal);  // in place
  return w - key == kKeyWords;
}

// FNV-1a over the key's words in four interleaved lanes (independent multiply chains).
uint64_t hash_of(const int64_t *key) {
  constexpr uint64_t kPrime = 0x100000001b3ULL;
  uint64_t h[4] = {0xcbf29ce484222325ULL, 0x84222325cbf29ce4ULL, 0x9e3779b97f4a7c15ULL,
                   0xc2b2ae3d27d4eb4fULL};
  int i = 0;
  for (; i + 4 <= kKeyWords; i += 4)
    for (int j = 0; j < 4; ++j) h[j] = (h[j] ^ static_cast<uint64_t>(key[i + j])) * kPrime;
  for (; i < kKeyWords; ++i) h[0] = (h[0] ^ static_cast<uint64_t>(key[i])) * kPrime;
  return ((h[0] * kPrime ^ h[1]) * kPrime ^ h[2]) * kPrime ^ h[3];
}

// ---- families: a learned signature's calls of other sizes

// The tensors [B, T, ...] whose token count a family leaves free, and those [N, ...] (N + 1 for
// cu_seqlens; the pool's slots or the checkpoints' for those) whose first size it leaves free.
constexpr Slot kTokenTensors[] = {kQ, kK, kV, kG, kBeta, kOut};
constexpr Slot kSequenceTensors[] = {kInitial,   kFinal,      kCuSeqlens,
                                     kIndices,   kHasInitial, kCheckpoints};
constexpr int kMaxSeqlenWord = kTensors * kTensorWords + (kMaxSeqlen - kScale);

const int64_t *words(const int64_t *key, int slot) { return key + slot * kTensorWords; }

// The family of a key: the key with the words that a call of another token count, number of
// sequences or max_seqlen changes set to 0 (family_args checks those words of a member). Only
// for calls of batch 1, whose batch stride means nothing: the words of every other dimension,
// dtypes, devices and flags stay.
bool family_of(const int64_t *key, int64_t *family) {
  if (words(key, kQ)[kSizeWord] != 1) return false;
  std::memcpy(family, key, sizeof(int64_t) * kKeyWords);
  for (Slot t : kTokenTensors) {
    family[t * kTensorWords + kSizeWord + 1] = 0;  // T
    family[t * kTensorWords + kStrideWord] = 0;    // the batch stride
  }
  for (Slot t : kSequenceTensors) family[t * kTensorWords + kSizeWord] = 0;
  family[kMaxSeqlenWord] = 0;
  return true;
}

// A [B, T, H, 128] tensor's elements at distinct addresses (_layout.no_self_overlap): sorted by
// stride, each stride of a dimension longer than one exceeds the span of the smaller ones.
bool no_self_overlap(const int64_t *w) {
  int64_t order[kMaxDims][2];  // (stride, size) of the dimensions longer than one
  int n = 0;
  for (int d = 0; d < kMaxDims; ++d)
    if (w[kSizeWord + d] > 1) {
      order[n][0] = w[kStrideWord + d];
      order[n++][1] = w[kSizeWord + d];
    }
  for (int i = 1; i < n; ++i)  // insertion sort by stride
    for (int j = i; j > 0 && order[j][0] < order[j - 1][0]; --j)
      std::swap(order[j], order[j - 1]);
  int64_t span = 0;
  for (int i = 0; i < n; ++i) {
    if (order[i][0] <= span) return false;
    span += order[i][0] * (order[i][1] - 1);
  }
  return true;
}

// (batch, token, head) strides of the C ABI for an activation or beta: 0 for a dimension of
// extent one (_layout.activation_strides; the library checks the others).
flash_kda_strides abi_strides(const int64_t *w) {
  int64_t s[3];
  for (int d = 0; d < 3; ++d) s[d] = w[kSizeWord + d] == 1 ? 0 : w[kStrideWord + d];
  return {s[0], s[1], s[2]};
}

// A member of the family of `base`'s arguments (the Python validation passed `base`; this
// call's key equals base's but for the words family_of frees): true with `args` set to base's
// arguments for this call's sizes, after the checks of the validation that read those words
// (the library checks the sizes' ranges, strides and overlap); false where one fails (a miss:
// the Python path reports it). States, checkpoints and index tensors must keep their
// contiguous layout for the new first size, out must not overlap itself.
bool family_args(const int64_t *key, flash_kda_fwd_args &args) {
  const int64_t *q = words(key, kQ);
  const int64_t T = q[kSizeWord + 1], H = q[kSizeWord + 2];
  for (Slot t : kTokenTensors)
    if (words(key, t)[kSizeWord + 1] != T) return false;
  if (T < 1 || !no_self_overlap(words(key, kOut))) return false;
  const int64_t *cu = words(key, kCuSeqlens);
  const int64_t N = cu[0] ? cu[kSizeWord] - 1 : 1;
  const bool pool = words(key, kIndices)[0] != 0;
  if (N < 1 || (cu[0] && cu[kStrideWord] != 1)) return false;
  for (Slot t : {kIndices, kHasInitial}) {
    const int64_t *w = words(key, t);
    if (w[0] && (w[kSizeWord] != N || (N > 1 && w[kStrideWord] != 1))) return false;
  }
  const int64_t state_strides[kMaxDims] = {H * 128 * 128, 128 * 128, 128, 1};
  int64_t slots = -1;  // the states' first size (N, or the pool's)
  for (Slot t : {kInitial, kFinal, kCheckpoints}) {
    const int64_t *w = words(key, t);
    if (!w[0]) continue;
    if (std::memcmp(w + kStrideWord, state_strides, sizeof(state_strides)) != 0) return false;
    if (t == kCheckpoints) {
      if (w[kSizeWord] < 1) return false;  // no slots: the Python path passes NULL
      continue;
    }
    if (slots >= 0 && w[kSizeWord] != slots) return false;
    slots = w[kSizeWord];
  }
  if (slots >= 0 && !pool && slots != N) return false;
  const int64_t max_seqlen = key[kMaxSeqlenWord];
  if (max_seqlen < 0 || max_seqlen > T) return false;
  args.seqlen = T;
  args.num_seqs = N;
  args.max_seqlen = static_cast<int32_t>(max_seqlen);
  args.state_pool_size = pool ? slots : 0;
  args.checkpoint_slots = words(key, kCheckpoints)[0] ? words(key, kCheckpoints)[kSizeWord] : 0;
  flash_kda_strides *strides[] = {&args.q_strides, &args.k_strides,    &args.v_strides,
                                  &args.g_strides, &args.beta_strides, &args.out_strides};
  for (int i = 0; i < 6; ++i) *strides[i] = abi_strides(words(key, kTokenTensors[i]));
  return true;
}

// ---- the records

void copy_out(const Record &base, Record &out) {
  out.args = base.args;
  out.compute_capability = base.compute_capability;
  out.device = base.device;
  out.workspace_bytes = base.workspace_bytes;
}

// The slot of the record learned for a key, else -1. The lock is held.
int slot_of(uint64_t hash, const int64_t *key) {
  for (int i = 0; i < kRecords; ++i)
    if (hashes[i] == hash && records[i].used &&
        std::memcmp(records[i].key, key, sizeof(records[i].key)) == 0)
      return i;
  return -1;
}

// The learned record of a key (copied out under the lock), else a record of its family as
// the base of the call (`member` true; the family is computed only after no record matched);
// false for neither.
bool find(uint64_t hash, const int64_t *key, Record &out, bool &member) {
  {
    std::lock_guard<std::mutex> guard(lock);
    const int slot = slot_of(hash, key);
    if (slot >= 0) {
      copy_out(records[slot], out);
      member = false;
      return true;
    }
  }
  int64_t family[kKeyWords];
  if (!family_of(key, family)) return false;
  const uint64_t family_hash = hash_of(family);
  std::lock_guard<std::mutex> guard(lock);
  for (int i = 0; i < kRecords; ++i) {
    const Record &r = records[i];
    if (family_hashes[i] == family_hash && r.used && r.has_family &&
        std::memcmp(r.family, family, sizeof(r.family)) == 0) {
      copy_out(r, out);
      member = true;
      return true;
    }
  }
  return false;
}

void learn(uint64_t hash, const int64_t *key, const Learned &l) {
  std::lock_guard<std::mutex> guard(lock);
  int slot = slot_of(hash, key);
  if (slot < 0) {
    slot = next_victim;
    next_victim = (next_victim + 1) % kRecords;
  }
  Record &r = records[slot];
  r.used = true;
  std::memcpy(r.key, key, sizeof(r.key));
  r.has_family = family_of(key, r.family);
  hashes[slot] = hash;
  family_hashes[slot] = r.has_family ? hash_of(r.family) : 0;
  r.args = *l.args;
  r.compute_capability = l.compute_capability;
  r.device = l.device;
  r.workspace_bytes = l.workspace_bytes;
}

bool workspace_for(int32_t device, void *stream, int64_t bytes, void *&ptr, int64_t &have) {
  std::lock_guard<std::mutex> guard(lock);
  for (const Workspace &w : workspaces)
    if (w.device == device && w.stream == stream && w.bytes >= bytes) {
      ptr = w.ptr;
      have = w.bytes;
      return true;
    }
  return false;
}

// Patch the call's pointers into its record's arguments and run them on the current stream
// of its device (made current for the call, as the Python path does). `member`: the record is
// the call's family base, so its arguments take the call's sizes (family_args), its plan
// gives the workspace it needs, and once it has launched the call's key is learned.
int64_t launch(const Args &a, const uint64_t hash, const int64_t *key, Record &r, bool member) {
  flash_kda_fwd_args &args = r.args;
  if (member && !family_args(key, args)) return kMiss;
  void *A_log = a.ptr(kALog), *dt_bias = a.ptr(kDtBias), *cu = a.ptr(kCuSeqlens),
       *indices = a.ptr(kIndices);
  // the Python path copies these to align them
  if (((reinterpret_cast<uintptr_t>(A_log) | reinterpret_cast<uintptr_t>(dt_bias)) & 15) ||
      ((reinterpret_cast<uintptr_t>(cu) | reinterpret_cast<uintptr_t>(indices)) & 7))
    return kMiss;
  int32_t current = -1;
  if (torch_fns.current_device(&current) != 0) return kMiss;
  void *guard = nullptr;
  if (current != r.device && torch_fns.create_guard(r.device, &guard) != 0) return kMiss;
  int64_t status = kMiss;
  void *stream = nullptr, *ws = nullptr;
  int64_t ws_bytes = 0;
  flash_kda_fwd_plan_info plan{};
  plan.struct_size = sizeof(plan);
  // a member's plan reads no pointer; a refusal leaves the call to the Python path
  if (member)
    r.workspace_bytes =
        plan_fn(r.compute_capability, &args, &plan) == 0 ? plan.workspace_bytes : -1;
  // a stream capturing a graph: the Python path gives the call the graph's workspace
  int32_t capture = 1;
  if (r.workspace_bytes >= 0 && torch_fns.current_stream(r.device, &stream) == 0 &&
      torch_fns.is_capturing(stream, &capture) == 0 && capture == 0 &&
      workspace_for(r.device, stream, r.workspace_bytes, ws, ws_bytes)) {
    args.q = a.ptr(kQ);
    args.k = a.ptr(kK);
    args.v = a.ptr(kV);
    args.g = a.ptr(kG);
    args.beta = a.ptr(kBeta);
    args.out = a.ptr(kOut);
    args.A_log = static_cast<const float *>(A_log);
    args.dt_bias = static_cast<const float *>(dt_bias);
    args.initial_state = a.ptr(kInitial);
    args.final_state = a.ptr(kFinal);
    args.cu_seqlens = cu;
    args.state_indices = indices;
    args.has_initial_state = static_cast<const uint8_t *>(a.ptr(kHasInitial));
    args.checkpoints = a.ptr(kCheckpoints);
    args.workspace = ws;
    args.workspace_bytes = ws_bytes;
    status = fwd_fn(r.compute_capability, &args, stream);
    if (status == 0) launches.fetch_add(1, std::memory_order_relaxed);
  }
  if (guard != nullptr) torch_fns.delete_guard(guard);
  if (status == 0 && member)
    learn(hash, key, Learned{&args, r.compute_capability, r.device, r.workspace_bytes});
  return status;
}

// The read of a call's arguments and key, then `then(args, hash, key)`; kMiss without a
// CUDA q or a key, or where Args refused an argument.
template <typename Then>
PyObj *with_key(PyObj *const *a, intptr_t nargs, bool inference_mode, Then then) {
  int64_t result = kMiss;
  if (nargs == kSlots + 1) {
    Args args(a, inference_mode);
    int64_t key[kKeyWords];
    int32_t type = -1;
    if (args.ok && args.tensors[kQ] != nullptr &&
        torch_fns.device_type(args.tensors[kQ], &type) == 0 && type == cuda_type &&
        key_of(args, key))
      result = then(args, hash_of(key), key);
  }
  return py.from_int(result);
}

int64_t find_and_launch(const Args &a, uint64_t hash, const int64_t *key) {
  Record r;
  bool member = false;
  return find(hash, key, r, member) ? launch(a, hash, key, r, member) : kMiss;
}

// launch(q, ..., forms, inference_mode): 0 (launched), kMiss, or flash_kda_fwd's refusal
// (> 0, nothing launched; the Python path reports it).
PyObj *eager_launch(PyObj *, PyObj *const *a, intptr_t nargs) {
  return with_key(a, nargs, nargs == kSlots + 1 && a[kInference] == py.true_, find_and_launch);
}

// learn(q, ..., forms, learned): remember the call's key with the Learned at the address
// `learned`; 0, or kMiss. The package calls it right after validating and launching the call.
PyObj *eager_learn(PyObj *, PyObj *const *a, intptr_t nargs) {
  const Learned *learned = nullptr;
  if (nargs == kSlots + 1) {
    learned = static_cast<const Learned *>(py.as_pointer(a[kLearned]));
    if (py.error() != nullptr) py.clear_error(), learned = nullptr;
  }
  return with_key(a, nargs, true, [learned](const Args &, uint64_t hash, const int64_t *key) {
    if (learned == nullptr) return kMiss;
    learn(hash, key, *learned);
    return int64_t{0};
  });
}

MethodDef launch_def{"eager_launch", &eager_launch, kMethFastcall,
                     "The eager launch in C of a learned signature (flash_kda._eager)."};
MethodDef learn_def{"eager_learn", &eager_learn, kMethFastcall,
                    "Teach the eager launch in C a validated call (flash_kda._eager)."};

template <typename F>
bool resolve(void *lib, const char *name, F &fn) {
  fn = reinterpret_cast<F>(dlsym(lib, name));
  return fn != nullptr;
}

}  // namespace

// The argument names of launch and learn in slot order (the package compares them with its own).
FLASH_KDA_TORCH_API const char *flash_kda_torch_slots() { return kSlotNames; }

// Find torch's and the interpreter's C functions in the process and keep the package's
// objects (torch.Tensor, torch.nn.Parameter, None, True and the attribute names "_cdata",
// "requires_grad", "is_inference"; the package keeps them alive); the library's
// flash_kda_fwd and flash_kda_fwd_plan by address. 0 on success; else the step that failed:
// 1 libtorch not loaded or a function missing, 2 a NULL argument, 3 an interpreter function
// missing. With a torch without CUDA every call is a miss. Called with the GIL held.
FLASH_KDA_TORCH_API int32_t flash_kda_torch_attach(const void *flash_kda_fwd,
                                                   const void *flash_kda_fwd_plan, PyObj *tensor,
                                                   PyObj *parameter, PyObj *none, PyObj *true_,
                                                   PyObj *cdata, PyObj *requires_grad,
                                                   PyObj *is_inference) {
  std::lock_guard<std::mutex> guard(lock);
  if (fwd_fn != nullptr) return 0;
  for (const void *p : {flash_kda_fwd, flash_kda_fwd_plan, static_cast<const void *>(tensor),
                        static_cast<const void *>(parameter), static_cast<const void *>(none),
                        static_cast<const void *>(true_), static_cast<const void *>(cdata),
                        static_cast<const void *>(requires_grad),
                        static_cast<const void *>(is_inference)})
    if (p == nullptr) return 2;
  void *cpu = dlopen("libtorch_cpu.so", RTLD_NOW | RTLD_NOLOAD);
  Torch t{};
  if (cpu == nullptr || !resolve(cpu, "aoti_torch_get_data_ptr", t.data_ptr) ||
      !resolve(cpu, "aoti_torch_get_dim", t.dim) || !resolve(cpu, "aoti_torch_get_sizes", t.sizes) ||
      !resolve(cpu, "aoti_torch_get_strides", t.strides) ||
      !resolve(cpu, "aoti_torch_get_dtype", t.dtype) ||
      !resolve(cpu, "aoti_torch_get_device_type", t.device_type) ||
      !resolve(cpu, "aoti_torch_get_device_index", t.device_index) ||
      !resolve(cpu, "aoti_torch_device_type_cuda", t.device_type_cuda) ||
      !resolve(cpu, "aoti_torch_grad_mode_is_enabled", t.grad_mode))
    return 1;
  Python p{};
  if (!resolve(RTLD_DEFAULT, "PyObject_GetAttr", p.get_attr) ||
      !resolve(RTLD_DEFAULT, "PyObject_CallMethodObjArgs", p.call_method) ||
      !resolve(RTLD_DEFAULT, "PyObject_Type", p.type_of) ||
      !resolve(RTLD_DEFAULT, "PyLong_AsVoidPtr", p.as_pointer) ||
      !resolve(RTLD_DEFAULT, "PyLong_AsLongLong", p.as_int) ||
      !resolve(RTLD_DEFAULT, "PyFloat_AsDouble", p.as_double) ||
      !resolve(RTLD_DEFAULT, "PyLong_FromLongLong", p.from_int) ||
      !resolve(RTLD_DEFAULT, "PyErr_Occurred", p.error) ||
      !resolve(RTLD_DEFAULT, "PyErr_Clear", p.clear_error) ||
      !resolve(RTLD_DEFAULT, "Py_DecRef", p.decref) ||
      !resolve(RTLD_DEFAULT, "PyCFunction_NewEx", p.new_function))
    return 3;
  p.tensor = tensor;
  p.parameter = parameter;
  p.none = none;
  p.true_ = true_;
  p.cdata = cdata;
  p.requires_grad = requires_grad;
  p.is_inference = is_inference;
  // a torch without CUDA: attached all the same, every call a miss
  void *cuda = dlopen("libtorch_cuda.so", RTLD_NOW | RTLD_NOLOAD);
  void *driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  const bool has_cuda =
      cuda != nullptr && resolve(cuda, "aoti_torch_get_current_cuda_stream", t.current_stream) &&
      resolve(cuda, "aoti_torch_get_current_device_index", t.current_device) &&
      resolve(cuda, "aoti_torch_create_cuda_guard", t.create_guard) &&
      resolve(cuda, "aoti_torch_delete_cuda_guard", t.delete_guard) && driver != nullptr &&
      resolve(driver, "cuStreamIsCapturing", t.is_capturing);
  torch_fns = t;
  py = p;
  cuda_type = has_cuda ? t.device_type_cuda() : -1;
  fwd_fn = reinterpret_cast<FwdFn>(flash_kda_fwd);
  plan_fn = reinterpret_cast<PlanFn>(flash_kda_fwd_plan);
  return 0;
}

// A new Python function: 0 launch, 1 learn (above); nullptr before attach. GIL held.
FLASH_KDA_TORCH_API PyObj *flash_kda_torch_function(int32_t which) {
  if (fwd_fn == nullptr || (which != 0 && which != 1)) return nullptr;
  return py.new_function(which == 0 ? &launch_def : &learn_def, nullptr, nullptr);
}

// A tensor's metadata as this library reads it, for the package's check of the handles:
// data pointer, dim, sizes[4], strides[4], device type (11 words). 0, or 1 where `obj` is
// not a plain tensor or has more than four dimensions. GIL held.
FLASH_KDA_TORCH_API int32_t flash_kda_torch_probe(PyObj *obj, int64_t *words) {
  void *impl = nullptr;
  if (fwd_fn == nullptr || !tensor_of(obj, impl)) return 1;
  Handle h = &impl;
  void *data = nullptr;
  int64_t dim = 0, *sizes = nullptr, *strides = nullptr;
  int32_t type = -1;
  if (torch_fns.data_ptr(h, &data) != 0 || torch_fns.dim(h, &dim) != 0 || dim > kMaxDims ||
      torch_fns.sizes(h, &sizes) != 0 || torch_fns.strides(h, &strides) != 0 ||
      torch_fns.device_type(h, &type) != 0)
    return 1;
  words[0] = static_cast<int64_t>(reinterpret_cast<uintptr_t>(data));
  words[1] = dim;
  for (int d = 0; d < kMaxDims; ++d) {
    words[2 + d] = d < dim ? sizes[d] : 0;
    words[6 + d] = d < dim ? strides[d] : 0;
  }
  words[10] = type;
  return 0;
}

// The workspace of the calls on (device, stream): `bytes` at `ptr`, owned by the package,
// which keeps it alive until it calls this again for the pair or flash_kda_torch_forget.
FLASH_KDA_TORCH_API void flash_kda_torch_set_workspace(int32_t device, void *stream, void *ptr,
                                                       int64_t bytes) {
  std::lock_guard<std::mutex> guard(lock);
  for (Workspace &w : workspaces)
    if (w.device == device && w.stream == stream) {
      w.ptr = ptr;
      w.bytes = bytes;
      return;
    }
  workspaces.push_back(Workspace{device, stream, ptr, bytes});
}

// The calls this library has launched since it was loaded.
FLASH_KDA_TORCH_API int64_t flash_kda_torch_launches() { return launches.load(); }

// Forget every learned signature and workspace.
FLASH_KDA_TORCH_API void flash_kda_torch_forget() {
  std::lock_guard<std::mutex> guard(lock);
  for (Record &r : records) r.used = false;
  for (uint64_t &h : hashes) h = 0;
  for (uint64_t &h : family_hashes) h = 0;
  workspaces.clear();
}
