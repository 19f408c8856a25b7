#include "backends/nccl/nccl_transport.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "accel/runtime/base/errors.h"
#include "accel/runtime/comm/registry.h"

namespace accel {
namespace {

using Clock = std::chrono::steady_clock;

ncclDataType_t NcclType(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return ncclFloat32;
    case DType::kFloat64:
      return ncclFloat64;
    case DType::kFloat16:
      return ncclFloat16;
    case DType::kBFloat16:
      return ncclBfloat16;
    case DType::kInt8:
      return ncclInt8;
    case DType::kUInt8:
    case DType::kBool:  // 0/1 bytes: min is "and", max is "or".
      return ncclUint8;
    case DType::kInt32:
      return ncclInt32;
    case DType::kInt64:
      return ncclInt64;
  }
  return ncclUint8;
}

ncclRedOp_t NcclOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kProduct:
      return ncclProd;
    case ReduceOp::kMin:
      return ncclMin;
    case ReduceOp::kMax:
      return ncclMax;
  }
  return ncclSum;
}

void CheckCuda(cudaError_t result, const char* what) {
  if (result != cudaSuccess) {
    throw Error(std::string(what) + " failed: " + cudaGetErrorString(result));
  }
}

bool SharingGpusAllowed() {
  const char* value = std::getenv("NCCL_MULTI_RANK_GPU_ENABLE");
  return value != nullptr && std::string(value) == "1";
}

int DeviceCount() {
  std::string error;
  const int count = VisibleCudaDevices(&error);
  return count < 0 ? 0 : count;
}

const BackendRegistration kRegistration(
    "nccl",
    [](const BackendContext& context) -> std::unique_ptr<Transport> {
      return std::make_unique<NcclTransport>(context);
    },
    [] { return DeviceCount() > 0; });

}  // namespace

int VisibleCudaDevices(std::string* error) {
  int count = 0;
  const cudaError_t result = cudaGetDeviceCount(&count);
  if (result != cudaSuccess) {
    *error = std::string(cudaGetErrorName(result)) + ": " +
             cudaGetErrorString(result);
    return -static_cast<int>(result);
  }
  return count;
}

struct NcclTransport::State {
  int device = 0;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  cudaEvent_t ready = nullptr;  // The default stream's work so far.
  cudaEvent_t done = nullptr;   // This operation's completion.
  void* scratch = nullptr;      // 4 bytes for barrier.
  bool aborted = false;
  std::atomic<bool> abort_requested{false};  // Set by the watchdog.
};

int NcclTransport::device_index() const { return state_->device; }

void NcclTransport::Abort() { state_->abort_requested = true; }

NcclTransport::NcclTransport(const BackendContext& context)
    : Transport(context), state_(std::make_unique<State>()) {
  try {
    std::string error;
    const int devices = VisibleCudaDevices(&error);
    if (devices <= 0) {
      throw UsageError(
          "no CUDA GPU is visible (" +
          (devices < 0 ? "cudaGetDeviceCount: " + error
                       : std::string("cudaGetDeviceCount found 0 devices")) +
          "); the nccl backend needs one GPU per rank. Use --backend=gloo to "
          "train on CPUs");
    }
    int device = context.local_rank;
    if (device >= devices) {
      if (!SharingGpusAllowed()) {
        throw UsageError("LOCAL_RANK " + std::to_string(context.local_rank) +
                         " needs GPU " + std::to_string(device) + " but " +
                         std::to_string(devices) +
                         " are visible; start at most one rank per GPU "
                         "(or set NCCL_MULTI_RANK_GPU_ENABLE=1 to share)");
      }
      device %= devices;
    }
    state_->device = device;
    CheckCuda(cudaSetDevice(device), "cudaSetDevice");
    CheckCuda(cudaStreamCreateWithFlags(&state_->stream, cudaStreamNonBlocking),
              "cudaStreamCreate");
    CheckCuda(cudaEventCreateWithFlags(&state_->ready, cudaEventDisableTiming),
              "cudaEventCreate");
    CheckCuda(cudaEventCreateWithFlags(&state_->done, cudaEventDisableTiming),
              "cudaEventCreate");
    CheckCuda(cudaMalloc(&state_->scratch, 4), "cudaMalloc");

    // Rank 0 makes the unique id; the others read it from the store.
    ncclUniqueId id;
    if (context.rank == 0) {
      const ncclResult_t result = ncclGetUniqueId(&id);
      if (result != ncclSuccess) {
        throw Error(std::string("ncclGetUniqueId failed: ") +
                    ncclGetErrorString(result));
      }
      context.store->set("nccl_unique_id",
                         std::string(reinterpret_cast<char*>(&id), sizeof(id)));
    } else {
      const std::string bytes =
          context.store->get("nccl_unique_id", context.options.timeout);
      if (bytes.size() != sizeof(id)) {
        throw Error("the NCCL unique id in the store has " +
                    std::to_string(bytes.size()) + " bytes, expected " +
                    std::to_string(sizeof(id)));
      }
      std::memcpy(&id, bytes.data(), sizeof(id));
    }
    // Non-blocking initialisation, so that a rank that never comes can be
    // given up on (ncclCommAbort) instead of hanging here.
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclResult_t result = ncclCommInitRankConfig(&state_->comm, context.size,
                                                 id, context.rank, &config);
    const auto deadline = Clock::now() + context.options.timeout;
    while (result == ncclInProgress || result == ncclSuccess) {
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(state_->comm, &async);
      if (async == ncclSuccess) break;
      if (async != ncclInProgress) {
        result = async;
        break;
      }
      if (Clock::now() > deadline) {
        ncclCommAbort(state_->comm);
        state_->comm = nullptr;
        throw TimeoutError("ncclCommInitRankConfig did not complete within " +
                           std::to_string(context.options.timeout.count()) +
                           " ms (a rank did not join)");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (result != ncclSuccess && result != ncclInProgress) {
      throw Error(std::string("ncclCommInitRankConfig failed: ") +
                  ncclGetErrorString(result));
    }
  } catch (const Error&) {
    if (state_->comm != nullptr) ncclCommAbort(state_->comm);
    state_->comm = nullptr;
    RethrowWithPrefix(Where() + "creating the communicator: ");
  }
}

NcclTransport::~NcclTransport() {
  if (state_->comm != nullptr) {
    if (state_->aborted) {
      ncclCommAbort(state_->comm);
    } else {
      ncclCommDestroy(state_->comm);
    }
  }
  if (state_->scratch) cudaFree(state_->scratch);
  if (state_->ready) cudaEventDestroy(state_->ready);
  if (state_->done) cudaEventDestroy(state_->done);
  if (state_->stream) cudaStreamDestroy(state_->stream);
}

template <typename Launch>
void NcclTransport::Run(const Op& op, Launch&& launch) {
  State& s = *state_;
  if (s.aborted) throw PeerError("the NCCL communicator was aborted earlier");
  CheckCuda(cudaSetDevice(s.device), "cudaSetDevice");
  // Follow the work LibTorch queued on the default stream so far.
  CheckCuda(cudaEventRecord(s.ready, cudaStreamLegacy), "cudaEventRecord");
  CheckCuda(cudaStreamWaitEvent(s.stream, s.ready, 0), "cudaStreamWaitEvent");
  ncclResult_t result = launch(s);
  if (result != ncclSuccess && result != ncclInProgress) {
    throw Error(std::string(op.name) +
                " launch failed: " + ncclGetErrorString(result) + " (" +
                ncclGetLastError(s.comm) + ")");
  }
  CheckCuda(cudaEventRecord(s.done, s.stream), "cudaEventRecord");
  const auto start = Clock::now();
  while (true) {
    const cudaError_t status = cudaEventQuery(s.done);
    if (status == cudaSuccess) return;
    if (status != cudaErrorNotReady) CheckCuda(status, "cudaEventQuery");
    ncclResult_t async = ncclSuccess;
    ncclCommGetAsyncError(s.comm, &async);
    if (async != ncclSuccess && async != ncclInProgress) {
      s.aborted = true;
      ncclCommAbort(s.comm);
      s.comm = nullptr;
      throw PeerError(std::string("NCCL reported ") +
                      ncclGetErrorString(async) + "; communicator aborted");
    }
    if (s.abort_requested.exchange(false)) {
      s.aborted = true;
      ncclCommAbort(s.comm);
      s.comm = nullptr;
      throw PeerError("NCCL communicator aborted (ncclCommAbort)");
    }
    const auto now = Clock::now();
    if (now - start > op.timeout) {
      s.aborted = true;
      ncclCommAbort(s.comm);
      s.comm = nullptr;
      throw TimeoutError(
          "NCCL operation did not complete; communicator "
          "aborted (ncclCommAbort)");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

void NcclTransport::RunAllgather(const Op& op, const void* input, void* output,
                                 size_t count, DType dtype) {
  if (count == 0) return;
  const size_t bytes = count * ElementSize(dtype);
  Run(op, [&](State& s) {
    return ncclAllGather(input, output, bytes, ncclUint8, s.comm, s.stream);
  });
}

void NcclTransport::RunAllgatherv(const Op& op, const void* input, void* output,
                                  const std::vector<size_t>& counts,
                                  DType dtype) {
  const size_t element = ElementSize(dtype);
  size_t total = 0;
  for (size_t c : counts) total += c;
  if (total == 0) return;
  Run(op, [&](State& s) {
    // One broadcast per contributing rank, fused into one group launch.
    ncclGroupStart();
    size_t offset = 0;
    for (int r = 0; r < size(); ++r) {
      const size_t bytes = counts[r] * element;
      if (bytes > 0) {
        ncclBroadcast(r == rank() ? input : nullptr,
                      static_cast<char*>(output) + offset, bytes, ncclUint8, r,
                      s.comm, s.stream);
      }
      offset += bytes;
    }
    return ncclGroupEnd();
  });
}

void NcclTransport::RunAllreduce(const Op& op, void* buffer, size_t count,
                                 DType dtype, ReduceOp reduce_op) {
  if (count == 0) return;
  Run(op, [&](State& s) {
    return ncclAllReduce(buffer, buffer, count, NcclType(dtype),
                         NcclOp(reduce_op), s.comm, s.stream);
  });
}

void NcclTransport::RunReduceScatter(const Op& op, const void* input,
                                     void* output,
                                     const std::vector<size_t>& counts,
                                     DType dtype, ReduceOp reduce_op) {
  size_t total = 0;
  for (size_t c : counts) total += c;
  if (total == 0) return;
  const bool equal = std::all_of(counts.begin(), counts.end(),
                                 [&](size_t c) { return c == counts[0]; });
  const size_t element = ElementSize(dtype);
  Run(op, [&](State& s) {
    if (equal) {
      return ncclReduceScatter(input, output, counts[0], NcclType(dtype),
                               NcclOp(reduce_op), s.comm, s.stream);
    }
    ncclGroupStart();
    size_t offset = 0;
    for (int r = 0; r < size(); ++r) {
      if (counts[r] > 0) {
        ncclReduce(static_cast<const char*>(input) + offset * element,
                   r == rank() ? output : nullptr, counts[r], NcclType(dtype),
                   NcclOp(reduce_op), r, s.comm, s.stream);
      }
      offset += counts[r];
    }
    return ncclGroupEnd();
  });
}

void NcclTransport::RunBroadcast(const Op& op, void* buffer, size_t count,
                                 DType dtype, int root) {
  if (count == 0) return;
  Run(op, [&](State& s) {
    return ncclBroadcast(buffer, buffer, count * ElementSize(dtype), ncclUint8,
                         root, s.comm, s.stream);
  });
}

void NcclTransport::RunAllToAll(const Op& op, const void* input, void* output,
                                const std::vector<size_t>& counts,
                                DType dtype) {
  const int n = size();
  const size_t element = ElementSize(dtype);
  Run(op, [&](State& s) {
    ncclGroupStart();
    size_t sent = 0, received = 0;
    for (int r = 0; r < n; ++r) {
      const size_t out = counts[rank() * n + r] * element;
      const size_t in = counts[r * n + rank()] * element;
      if (out > 0) {
        ncclSend(static_cast<const char*>(input) + sent, out, ncclUint8, r,
                 s.comm, s.stream);
      }
      if (in > 0) {
        ncclRecv(static_cast<char*>(output) + received, in, ncclUint8, r,
                 s.comm, s.stream);
      }
      sent += out;
      received += in;
    }
    return ncclGroupEnd();
  });
}

void NcclTransport::RunBarrier(const Op& op) {
  Run(op, [&](State& s) {
    return ncclAllReduce(s.scratch, s.scratch, 1, ncclInt32, ncclSum, s.comm,
                         s.stream);
  });
}

}  // namespace accel
