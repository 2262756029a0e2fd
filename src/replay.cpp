// SPDX-License-Identifier: MIT
// replay.cpp: the recorded graphs of known calls (replay.h): a table keyed by (call, device,
// stream), the sink that records a forward's launches as a graph (stream capture on a stream
// of its own, so nothing runs while it records) and the sink that sets a recorded graph's
// node parameters to a later call's.
#include "replay.h"

#include <cuda.h>
#include <cudaTypedefs.h>

#include <atomic>
#include <mutex>

namespace flash_kda {
namespace {

constexpr int kMaxSteps = 8;     // launch.cuh launches at most 7 times a forward
constexpr int kGraphs = 64;      // graphs kept (signatures x streams)
constexpr int kProbes = 8;       // slots a key may take, from its home slot on
constexpr int kMaxDevices = 64;  // devices with a capture stream

// One launch of a recorded sequence and its node in the graph.
struct Step {
  const void *kernel;  // nullptr: the memset
  bool programmatic;
  cudaGraphNode_t node;
  CUfunction function;  // the kernel's, for the driver's update (nullptr: the runtime's)
};

// The driver's node update and graph launch, which the runtime's wrap: the runtime's update
// looks the kernel's function up on every call, the driver's takes it from the step. Both
// nullptr where the runtime cannot give them (the runtime's calls then).
struct Driver {
  PFN_cuGraphExecKernelNodeSetParams_v12000 set_kernel = nullptr;
  PFN_cuGraphLaunch_v10000 launch = nullptr;
};

const Driver &driver() {
  static const Driver d = [] {
    Driver r;
    void *set = nullptr, *launch = nullptr;
    cudaDriverEntryPointQueryResult found_set, found_launch;
    if (cudaGetDriverEntryPointByVersion("cuGraphExecKernelNodeSetParams", &set, 12000,
                                         cudaEnableDefault, &found_set) == cudaSuccess &&
        cudaGetDriverEntryPointByVersion("cuGraphLaunch", &launch, 10000, cudaEnableDefault,
                                         &found_launch) == cudaSuccess &&
        found_set == cudaDriverEntryPointSuccess && found_launch == cudaDriverEntryPointSuccess) {
      r.set_kernel = reinterpret_cast<PFN_cuGraphExecKernelNodeSetParams_v12000>(set);
      r.launch = reinterpret_cast<PFN_cuGraphLaunch_v10000>(launch);
    }
    cudaGetLastError();
    return r;
  }();
  return d;
}

struct Graph {
  uint64_t call;  // KnownCall::id; 0: a free slot
  int device;
  cudaStream_t stream;
  bool usable;  // false once recording or replaying failed: kernel by kernel from then on
  cudaGraph_t graph;
  cudaGraphExec_t exec;  // nullptr while usable: not recorded yet
  int steps;
  Step step[kMaxSteps];
};

std::mutex g_lock;  // the table, and a graph from its parameters' update to its launch
Graph g_graphs[kGraphs];
cudaStream_t g_capture[kMaxDevices];  // per device: the stream that records capture on
std::atomic<bool> g_on{true};
std::atomic<int64_t> g_replayed{0};

void release(Graph &g) {
  if (g.exec != nullptr) cudaGraphExecDestroy(g.exec);  // an in-flight launch completes first
  if (g.graph != nullptr) cudaGraphDestroy(g.graph);
  g = Graph{};
}

// The graph of (call, device, stream), or a slot claimed for it (not recorded yet; an older
// graph in the way is released).
Graph &slot_of(uint64_t call, int device, cudaStream_t stream) {
  const uint64_t home =
      (call * 0x9e3779b97f4a7c15ULL ^ reinterpret_cast<uintptr_t>(stream) ^ device) % kGraphs;
  Graph *free_slot = nullptr;
  for (int i = 0; i < kProbes; ++i) {
    Graph &g = g_graphs[(home + i) % kGraphs];
    if (g.call == call && g.device == device && g.stream == stream) return g;
    if (g.call == 0 && free_slot == nullptr) free_slot = &g;
  }
  Graph &g = free_slot != nullptr ? *free_slot : g_graphs[home];
  release(g);
  g.call = call;
  g.device = device;
  g.stream = stream;
  g.usable = true;
  return g;
}

cudaStream_t capture_stream(int device) {
  if (g_capture[device] == nullptr &&
      cudaStreamCreateWithFlags(&g_capture[device], cudaStreamNonBlocking) != cudaSuccess)
    g_capture[device] = nullptr;
  return g_capture[device];
}

// Records the launches into `g` by capturing them on `capture`: a launch that fails, or a
// capture that ends invalid, leaves no graph (end() gives nullptr).
class Recorder : public LaunchSink {
 public:
  Recorder(cudaStream_t capture, Graph &g) : LaunchSink(capture), g_(g) { g_.steps = 0; }

  cudaError_t zero(void *ptr, size_t bytes) override {
    cudaError_t err = begin();
    if (err == cudaSuccess) err = LaunchSink::zero(ptr, bytes);
    return add(err, nullptr, false);
  }

  cudaError_t kernel(const void *kernel, dim3 grid, dim3 block, int smem, void **args,
                     bool programmatic) override {
    cudaError_t err = begin();
    if (err == cudaSuccess) err = LaunchSink::kernel(kernel, grid, block, smem, args, programmatic);
    return add(err, kernel, programmatic);
  }

  // The graph of every launch, or nullptr.
  cudaGraph_t end() {
    if (!capturing_) return nullptr;
    capturing_ = false;
    cudaGraph_t graph = nullptr;
    if (cudaStreamEndCapture(stream_, &graph) != cudaSuccess || failed_) {
      if (graph != nullptr) cudaGraphDestroy(graph);
      cudaGetLastError();
      return nullptr;
    }
    return graph;
  }

 private:
  cudaError_t begin() {
    if (capturing_ || failed_) return failed_ ? cudaErrorStreamCaptureInvalidated : cudaSuccess;
    // thread-local: other threads' calls stay legal while this one records
    const cudaError_t err = cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal);
    capturing_ = err == cudaSuccess;
    failed_ = !capturing_;
    return err;
  }

  // The node the launch just added: the capture's one dependency now.
  cudaError_t add(cudaError_t err, const void *kernel, bool programmatic) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    const cudaGraphNode_t *deps = nullptr;
    size_t count = 0;
    if (err == cudaSuccess)
      err = cudaStreamGetCaptureInfo(stream_, &status, nullptr, nullptr, &deps, nullptr, &count);
    if (err == cudaSuccess &&
        (status != cudaStreamCaptureStatusActive || count != 1 || g_.steps == kMaxSteps))
      err = cudaErrorStreamCaptureInvalidated;
    if (err != cudaSuccess) {
      failed_ = true;
      return err;
    }
    cudaFunction_t function = nullptr;
    if (kernel != nullptr && driver().set_kernel != nullptr &&
        cudaGetFuncBySymbol(&function, kernel) != cudaSuccess) {
      cudaGetLastError();
      function = nullptr;
    }
    g_.step[g_.steps++] = {kernel, programmatic, deps[0], reinterpret_cast<CUfunction>(function)};
    return cudaSuccess;
  }

  Graph &g_;
  bool capturing_ = false, failed_ = false;
};

// Sets the recorded graph's nodes to this call's launches, which must be the recorded
// sequence (the same kernels in the same order; complete() says whether they were).
class Replayer : public LaunchSink {
 public:
  Replayer(cudaStream_t stream, Graph &g) : LaunchSink(stream), g_(g) {}

  cudaError_t zero(void *ptr, size_t bytes) override {
    const Step *s = next(nullptr, false);
    if (s == nullptr) return cudaErrorInvalidValue;
    cudaMemsetParams m = {};
    m.dst = ptr;
    m.elementSize = 1;
    m.width = bytes;
    m.height = 1;
    return done(cudaGraphExecMemsetNodeSetParams(g_.exec, s->node, &m));
  }

  cudaError_t kernel(const void *kernel, dim3 grid, dim3 block, int smem, void **args,
                     bool programmatic) override {
    const Step *s = next(kernel, programmatic);
    if (s == nullptr) return cudaErrorInvalidValue;
    if (s->function != nullptr) {
      CUDA_KERNEL_NODE_PARAMS k = {};
      k.func = s->function;
      k.gridDimX = grid.x;
      k.gridDimY = grid.y;
      k.gridDimZ = grid.z;
      k.blockDimX = block.x;
      k.blockDimY = block.y;
      k.blockDimZ = block.z;
      k.sharedMemBytes = static_cast<unsigned>(smem);
      k.kernelParams = args;  // copied by the call
      const CUresult err = driver().set_kernel(reinterpret_cast<CUgraphExec>(g_.exec), s->node, &k);
      return done(err == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue);
    }
    cudaKernelNodeParams k = {};
    k.func = const_cast<void *>(kernel);
    k.gridDim = grid;
    k.blockDim = block;
    k.sharedMemBytes = static_cast<unsigned>(smem);
    k.kernelParams = args;  // copied by the call
    return done(cudaGraphExecKernelNodeSetParams(g_.exec, s->node, &k));
  }

  bool complete() const { return ok_ && index_ == g_.steps; }

 private:
  const Step *next(const void *kernel, bool programmatic) {
    if (!ok_ || index_ == g_.steps || g_.step[index_].kernel != kernel ||
        g_.step[index_].programmatic != programmatic) {
      ok_ = false;
      return nullptr;
    }
    return &g_.step[index_++];
  }
  cudaError_t done(cudaError_t err) {
    ok_ = ok_ && err == cudaSuccess;
    return err;
  }

  Graph &g_;
  int index_ = 0;
  bool ok_ = true;
};

}  // namespace

LaunchStatus launch_known(uint64_t call, const ArchTable &table, const FwdParams &params,
                          cudaStream_t stream) {
  LaunchSink direct(stream);
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  int device = -1;
  // a stream capturing the caller's graph takes the kernels themselves
  if (call == 0 || !g_on.load(std::memory_order_relaxed) ||
      cudaStreamIsCapturing(stream, &capture) != cudaSuccess ||
      capture != cudaStreamCaptureStatusNone || cudaGetDevice(&device) != cudaSuccess ||
      device < 0 || device >= kMaxDevices) {
    cudaGetLastError();
    return table.fwd(params, direct);
  }
  const std::lock_guard<std::mutex> guard(g_lock);
  Graph &g = slot_of(call, device, stream);
  if (g.usable && g.exec != nullptr) {
    Replayer replay(stream, g);
    const LaunchStatus st = table.fwd(params, replay);
    const Driver &d = driver();
    if (st.error == cudaSuccess && replay.complete() &&
        (d.launch != nullptr ? d.launch(reinterpret_cast<CUgraphExec>(g.exec), stream) == CUDA_SUCCESS
                             : cudaGraphLaunch(g.exec, stream) == cudaSuccess)) {
      g_replayed.fetch_add(1, std::memory_order_relaxed);
      return st;
    }
  } else if (g.usable) {
    const cudaStream_t capture_on = capture_stream(device);
    if (capture_on != nullptr) {
      Recorder record(capture_on, g);
      const LaunchStatus st = table.fwd(params, record);
      cudaGraph_t graph = record.end();
      cudaGraphExec_t exec = nullptr;
      if (st.error == cudaSuccess && graph != nullptr &&
          cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess &&
          cudaGraphLaunch(exec, stream) == cudaSuccess) {
        g.graph = graph;
        g.exec = exec;
        g_replayed.fetch_add(1, std::memory_order_relaxed);
        return st;
      }
      if (exec != nullptr) cudaGraphExecDestroy(exec);
      if (graph != nullptr) cudaGraphDestroy(graph);
    }
  }
  // nothing of the call has launched: kernel by kernel, now and at the graph's later calls
  cudaGetLastError();
  release(g);
  g.call = call;
  g.device = device;
  g.stream = stream;
  g.usable = false;
  return table.fwd(params, direct);
}

int64_t replayed_calls() { return g_replayed.load(); }

bool set_replays(bool on) { return g_on.exchange(on); }

}  // namespace flash_kda
