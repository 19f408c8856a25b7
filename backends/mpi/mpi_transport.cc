#include "backends/mpi/mpi_transport.h"

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "accel/runtime/base/errors.h"
#include "accel/runtime/comm/registry.h"
#include "accel/runtime/launch/mpirun.h"
#include "backends/mpi/mpi_runtime.h"

namespace accel {
namespace {

using Clock = std::chrono::steady_clock;

// How long a waiting rank keeps MPI busy before it starts to sleep between
// polls. MPI moves data only inside its calls, so polling is progress;
// collectives in lockstep finish well within this.
constexpr auto kBusyPoll = std::chrono::milliseconds(5);
constexpr auto kLongestNap = std::chrono::microseconds(1000);
// How long a failed rank waits for the others to report the failure too,
// beyond the watchdog's own check interval, before it ends the job.
constexpr auto kReportGrace = std::chrono::milliseconds(1500);

std::string MpiError(int code) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  MPI_Error_string(code, text, &length);
  return std::string(text, static_cast<size_t>(length));
}

template <DType kType, ReduceOp kOp>
void AccelReduction(void* in, void* inout, int* length, MPI_Datatype*) {
  Reduce(kType, kOp, inout, in, inout, static_cast<size_t>(*length));
}

template <DType kType>
std::vector<MPI_Op> CreateOperations() {
  using Function = void (*)(void*, void*, int*, MPI_Datatype*);
  const Function functions[] = {
      AccelReduction<kType, ReduceOp::kSum>,
      AccelReduction<kType, ReduceOp::kProduct>,
      AccelReduction<kType, ReduceOp::kMin>,
      AccelReduction<kType, ReduceOp::kMax>,
  };
  std::vector<MPI_Op> ops;
  for (Function function : functions) {
    MPI_Op op;
    MPI_Op_create(function, /*commute=*/1, &op);
    ops.push_back(op);
  }
  return ops;
}

MPI_Comm Duplicate(MPI_Comm comm) {
  auto lock = MpiRuntime::Get().Lock();
  MPI_Comm copy;
  if (MPI_Comm_dup(comm, &copy) != MPI_SUCCESS) {
    throw Error("MPI_Comm_dup failed");
  }
  // Errors come back as codes, which become accel exceptions, instead of
  // MPI's default of aborting the job without a word about the call.
  MPI_Comm_set_errhandler(copy, MPI_ERRORS_RETURN);
  return copy;
}

// What to send from in a gather: MPI forbids a send buffer that overlaps
// the receive buffer, except at this rank's own place (MPI_IN_PLACE), and
// wants a valid pointer even for nothing.
const void* SendBuffer(const void* input, size_t bytes, void* output,
                       size_t output_bytes, size_t own_offset,
                       std::vector<char>* copy) {
  const char* in = static_cast<const char*>(input);
  const char* out = static_cast<const char*>(output);
  if (in == out + own_offset) return MPI_IN_PLACE;
  if (bytes == 0) return output;
  const auto in_at = reinterpret_cast<uintptr_t>(in);
  const auto out_at = reinterpret_cast<uintptr_t>(out);
  if (in_at < out_at + output_bytes && out_at < in_at + bytes) {
    copy->assign(in, in + bytes);
    return copy->data();
  }
  return input;
}

bool Finalized() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  return finalized != 0;
}

const BackendRegistration kRegistration(
    "mpi",
    [](const BackendContext& context) -> std::unique_ptr<Transport> {
      return std::make_unique<MpiTransport>(context);
    },
    /*usable=*/[] { return StartedByMpiLauncher(); });

[[maybe_unused]] const bool kEnvironment =
    (RegisterBackendEnvironment("mpi", MpiRuntime::JobEnvironment), true);

}  // namespace

MpiTransport::MpiTransport(const BackendContext& context)
    : MpiTransport(context, MPI_COMM_WORLD) {}

MpiTransport::MpiTransport(const BackendContext& context, MPI_Comm comm)
    : Transport(context),
      store_(context.store),
      check_after_(context.options.check_after),
      compare_calls_(context.options.check_collectives && size() > 1) {
  try {
    comm_ = Duplicate(comm);
    int mpi_rank = 0, mpi_size = 0;
    {
      auto lock = MpiRuntime::Get().Lock();
      MPI_Comm_rank(comm_, &mpi_rank);
      MPI_Comm_size(comm_, &mpi_size);
      half_ops_ = CreateOperations<DType::kFloat16>();
      bfloat16_ops_ = CreateOperations<DType::kBFloat16>();
    }
    if (mpi_rank != rank() || mpi_size != size()) {
      throw UsageError(
          "MPI places this process at rank " + std::to_string(mpi_rank) +
          " of " + std::to_string(mpi_size) +
          ": --backend=mpi needs processes started by mpirun or srun (give "
          "the program --num_processes=N --backend=mpi and it runs mpirun "
          "itself)");
    }
  } catch (const Error&) {
    RethrowWithPrefix(Where() + "creating the communicator: ");
  }
}

std::unique_ptr<Communicator> MakeMpiCommunicator(const BackendContext& context,
                                                  MPI_Comm comm) {
  return std::make_unique<Communicator>(
      std::make_unique<MpiTransport>(context, comm), context);
}

std::unique_ptr<Transport> MpiTransport::MakeGroup(
    const Op& /*op*/, const BackendContext* group, int color, int key,
    const TransportFactory& /*factory*/) {
  MPI_Comm split = MPI_COMM_NULL;
  {
    // Blocking, under the lock: make groups before other threads run
    // collectives on other communicators (docs/parallelism.md).
    auto lock = MpiRuntime::Get().Lock();
    if (MPI_Comm_split(comm_, group != nullptr ? color : MPI_UNDEFINED, key,
                       &split) != MPI_SUCCESS) {
      throw PeerError(Where() + "MPI_Comm_split failed");
    }
  }
  if (group == nullptr) return nullptr;
  std::unique_ptr<Transport> transport;
  try {
    transport = std::make_unique<MpiTransport>(*group, split);
  } catch (...) {
    auto lock = MpiRuntime::Get().Lock();
    MPI_Comm_free(&split);
    throw;
  }
  auto lock = MpiRuntime::Get().Lock();
  MPI_Comm_free(&split);
  return transport;
}

MpiTransport::~MpiTransport() {
  if (Finalized()) return;
  auto lock = MpiRuntime::Get().Lock();
  for (auto* ops : {&half_ops_, &bfloat16_ops_}) {
    for (MPI_Op& op : *ops) MPI_Op_free(&op);
  }
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void MpiTransport::Abort() { aborted_ = true; }

void MpiTransport::OnBroken(const std::string& message) {
  std::fflush(stdout);
  std::fprintf(stderr,
               "error: %s\n%sending the job with MPI_Abort: MPI cannot "
               "cancel the failed collective\n",
               message.c_str(), Where().c_str());
  std::fflush(stderr);
  // The other ranks that found the failure get to say so before the job
  // ends: the watchdog's next check, plus some slack.
  if (store_ != nullptr) {
    try {
      store_->set("failed/" + std::to_string(rank()), "1");
      const auto deadline = Clock::now() + check_after_ + kReportGrace;
      while (Clock::now() < deadline) {
        const auto departed = store_->departures();
        int reported = 0;
        for (int r = 0; r < size(); ++r) {
          if (store_->try_get("failed/" + std::to_string(r)) ||
              departed.count(r) > 0) {
            ++reported;
          }
        }
        if (reported == size()) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    } catch (const std::exception&) {
      // The store is gone with rank 0: nobody is left to wait for.
    }
  }
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::_Exit(1);
}

template <typename StartCall>
void MpiTransport::Run(const Op& op, StartCall&& start) {
  const auto deadline = op.Deadline();
  if (compare_calls_) CheckSameCall(op, deadline);
  Poll(deadline, start);
}

template <typename StartCall>
void MpiTransport::Poll(Clock::time_point deadline, StartCall&& start) {
  MpiRuntime& mpi = MpiRuntime::Get();
  MPI_Request request = MPI_REQUEST_NULL;
  {
    auto lock = mpi.Lock();
    const int code = start(&request);
    if (code != MPI_SUCCESS) throw PeerError("MPI: " + MpiError(code));
  }
  const auto started = Clock::now();
  auto nap = std::chrono::microseconds(20);
  while (true) {
    int done = 0;
    int code;
    {
      auto lock = mpi.Lock();
      code = MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    }
    if (code != MPI_SUCCESS) throw PeerError("MPI: " + MpiError(code));
    if (done) return;
    if (aborted_) {
      throw PeerError("the watchdog stopped the MPI collective");
    }
    const auto now = Clock::now();
    if (now >= deadline) {
      throw TimeoutError("the MPI collective did not complete");
    }
    if (now - started > kBusyPoll) {
      // A long wait (a slow rank, a hang): poll less, leave the CPU free.
      std::this_thread::sleep_for(nap);
      nap = std::min(nap * 2, kLongestNap);
    }
  }
}

void MpiTransport::CheckSameCall(const Op& op, Clock::time_point deadline) {
  // Every rank's call (sequence number and arguments) as one number; the
  // maxima of it and of its complement equal ours only when all agree.
  uint64_t call = 0xcbf29ce484222325ull ^ op.sequence;
  for (const char c : op.signature) {
    call = (call ^ static_cast<unsigned char>(c)) * 0x100000001b3ull;
  }
  uint64_t values[2] = {call, ~call};
  Poll(deadline, [&](MPI_Request* request) {
    return MPI_Iallreduce(MPI_IN_PLACE, values, 2, MPI_UINT64_T, MPI_MAX, comm_,
                          request);
  });
  if (values[0] == call && values[1] == ~call) return;
  // Another rank called something else. Nothing has moved; the watchdog
  // compares the calls through the store and stops this one, naming them.
  while (!aborted_) {
    if (Clock::now() >= deadline) {
      throw TimeoutError("the ranks called different collectives");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  throw PeerError("the watchdog stopped the MPI collective");
}

MPI_Datatype MpiTransport::ElementType(DType dtype) const {
  switch (dtype) {
    case DType::kFloat32:
      return MPI_FLOAT;
    case DType::kFloat64:
      return MPI_DOUBLE;
    case DType::kFloat16:
    case DType::kBFloat16:
      return MPI_UINT16_T;
    case DType::kInt8:
      return MPI_INT8_T;
    case DType::kUInt8:
    case DType::kBool:  // 0/1 bytes: min is "and", max is "or".
      return MPI_UINT8_T;
    case DType::kInt32:
      return MPI_INT32_T;
    case DType::kInt64:
      return MPI_INT64_T;
  }
  throw UsageError("unknown dtype value " +
                   std::to_string(static_cast<int>(dtype)));
}

MPI_Op MpiTransport::Operation(DType dtype, ReduceOp op) const {
  const size_t index = static_cast<size_t>(op);
  if (dtype == DType::kFloat16) return half_ops_.at(index);
  if (dtype == DType::kBFloat16) return bfloat16_ops_.at(index);
  switch (op) {
    case ReduceOp::kSum:
      return MPI_SUM;
    case ReduceOp::kProduct:
      return MPI_PROD;
    case ReduceOp::kMin:
      return MPI_MIN;
    case ReduceOp::kMax:
      return MPI_MAX;
  }
  throw UsageError("unknown reduction");
}

int MpiTransport::Count(size_t count) const {
  if (count > static_cast<size_t>(INT_MAX)) {
    // The base adds the backend, rank and call to the message.
    throw UsageError("MPI counts are int: at most " + std::to_string(INT_MAX) +
                     " elements per call, found " + std::to_string(count) +
                     " (split the buffer)");
  }
  return static_cast<int>(count);
}

void MpiTransport::RunAllgather(const Op& op, const void* input, void* output,
                                size_t count, DType dtype) {
  if (count == 0) return;
  const int n = Count(count);
  const size_t bytes = count * ElementSize(dtype);
  std::vector<char> copy;
  const void* in =
      SendBuffer(input, bytes, output, bytes * size(), rank() * bytes, &copy);
  const MPI_Datatype type = ElementType(dtype);
  Run(op, [&](MPI_Request* request) {
    return MPI_Iallgather(in, n, type, output, n, type, comm_, request);
  });
}

void MpiTransport::RunAllgatherv(const Op& op, const void* input, void* output,
                                 const std::vector<size_t>& counts,
                                 DType dtype) {
  std::vector<int> sizes(counts.size()), offsets(counts.size());
  size_t total = 0;
  for (size_t r = 0; r < counts.size(); ++r) {
    sizes[r] = Count(counts[r]);
    offsets[r] = Count(total);
    total += counts[r];
  }
  Count(total);
  if (total == 0) return;
  const size_t element = ElementSize(dtype);
  std::vector<char> copy;
  const void* in =
      SendBuffer(input, counts[rank()] * element, output, total * element,
                 offsets[rank()] * element, &copy);
  const MPI_Datatype type = ElementType(dtype);
  Run(op, [&](MPI_Request* request) {
    return MPI_Iallgatherv(in, sizes[rank()], type, output, sizes.data(),
                           offsets.data(), type, comm_, request);
  });
}

void MpiTransport::RunAllToAll(const Op& op, const void* input, void* output,
                               const std::vector<size_t>& counts, DType dtype) {
  const int n = size();
  std::vector<int> send(n), send_at(n), receive(n), receive_at(n);
  size_t sent = 0, received = 0;
  for (int r = 0; r < n; ++r) {
    send[r] = Count(counts[rank() * n + r]);
    send_at[r] = Count(sent);
    sent += counts[rank() * n + r];
    receive[r] = Count(counts[r * n + rank()]);
    receive_at[r] = Count(received);
    received += counts[r * n + rank()];
  }
  const MPI_Datatype type = ElementType(dtype);
  Run(op, [&](MPI_Request* request) {
    return MPI_Ialltoallv(input, send.data(), send_at.data(), type, output,
                          receive.data(), receive_at.data(), type, comm_,
                          request);
  });
}

void MpiTransport::RunAllreduce(const Op& op, void* buffer, size_t count,
                                DType dtype, ReduceOp reduce_op) {
  if (count == 0 || size() == 1) return;
  const int n = Count(count);
  const MPI_Datatype type = ElementType(dtype);
  const MPI_Op operation = Operation(dtype, reduce_op);
  Run(op, [&](MPI_Request* request) {
    return MPI_Iallreduce(MPI_IN_PLACE, buffer, n, type, operation, comm_,
                          request);
  });
}

void MpiTransport::RunReduceScatter(const Op& op, const void* input,
                                    void* output,
                                    const std::vector<size_t>& counts,
                                    DType dtype, ReduceOp reduce_op) {
  std::vector<int> sizes(counts.size());
  size_t total = 0;
  size_t before = 0;
  for (size_t r = 0; r < counts.size(); ++r) {
    if (static_cast<int>(r) == rank()) before = total;
    sizes[r] = Count(counts[r]);
    total += counts[r];
  }
  Count(total);
  if (total == 0) return;
  const size_t element = ElementSize(dtype);
  const char* in = static_cast<const char*>(input);
  if (size() == 1) {
    if (in + before * element != output) {
      std::memcpy(output, in + before * element, counts[rank()] * element);
    }
    return;
  }
  // MPI's buffers may not overlap; ours may (output is our segment of input).
  std::vector<char> copy;
  const auto in_at = reinterpret_cast<uintptr_t>(in);
  const auto out_at = reinterpret_cast<uintptr_t>(output);
  if (out_at < in_at + total * element &&
      in_at < out_at + counts[rank()] * element) {
    copy.assign(in, in + total * element);
    in = copy.data();
  }
  const MPI_Datatype type = ElementType(dtype);
  const MPI_Op operation = Operation(dtype, reduce_op);
  char nothing = 0;  // A valid address where this rank receives nothing.
  void* out = counts[rank()] > 0 ? output : &nothing;
  Run(op, [&](MPI_Request* request) {
    return MPI_Ireduce_scatter(in, out, sizes.data(), type, operation, comm_,
                               request);
  });
}

void MpiTransport::RunBroadcast(const Op& op, void* buffer, size_t count,
                                DType dtype, int root) {
  if (count == 0 || size() == 1) return;
  const int n = Count(count);
  const MPI_Datatype type = ElementType(dtype);
  Run(op, [&](MPI_Request* request) {
    return MPI_Ibcast(buffer, n, type, root, comm_, request);
  });
}

void MpiTransport::RunBarrier(const Op& op) {
  if (size() == 1) return;
  Run(op, [&](MPI_Request* request) { return MPI_Ibarrier(comm_, request); });
}

}  // namespace accel
