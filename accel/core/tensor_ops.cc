#include "accel/core/tensor_ops.h"

#include <torch/utils.h>

#include <algorithm>
#include <sstream>

#include "accel/runtime/base/errors.h"
#include "accel/runtime/comm/object_collectives.h"

namespace accel {
namespace {

// Shape and dtype of one rank's tensor, exchanged as fixed-size int64s so
// that one allgather checks every rank: [dtype, ndim, size_0 .. size_7].
constexpr int kMaxDims = 8;
constexpr int kMetaWords = 2 + kMaxDims;

std::vector<int64_t> Meta(const torch::Tensor& tensor, const char* operation) {
  if (tensor.dim() > kMaxDims) {
    throw UsageError(std::string(operation) + ": tensors of more than " +
                     std::to_string(kMaxDims) +
                     " dimensions are not supported, "
                     "found " +
                     std::to_string(tensor.dim()));
  }
  std::vector<int64_t> meta(kMetaWords, 0);
  meta[0] = static_cast<int64_t>(tensor.scalar_type());
  meta[1] = tensor.dim();
  for (int64_t d = 0; d < tensor.dim(); ++d) meta[2 + d] = tensor.size(d);
  return meta;
}

std::string DescribeMeta(const int64_t* meta) {
  std::ostringstream out;
  out << "shape [";
  for (int64_t d = 0; d < meta[1]; ++d) out << (d ? ", " : "") << meta[2 + d];
  out << "] " << DTypeName(ToDType(static_cast<torch::ScalarType>(meta[0])));
  return out.str();
}

// Where `comm` needs buffers: the tensor's GPU for device backends (which
// must then get CUDA tensors), host memory otherwise.
torch::Device CommDevice(Communicator& comm, const torch::Tensor& like,
                         const char* operation) {
  if (comm.device_index() < 0) return torch::kCPU;
  if (!like.is_cuda()) {
    throw UsageError(std::string(operation) + ": the " + comm.backend_name() +
                     " backend works on CUDA tensors, found a tensor on " +
                     like.device().str() +
                     "; move it with .to(accelerator.device())");
  }
  return like.device();
}

torch::Tensor ForComm(Communicator& comm, const torch::Tensor& tensor,
                      const char* operation) {
  return tensor.to(CommDevice(comm, tensor, operation)).contiguous();
}

// Each rank's contribution to the shape check: its metadata, and its data
// too when it fits, so that a small gather needs one collective, not two.
constexpr int64_t kSlotBytes = 1024;
constexpr int64_t kMetaBytes = kMetaWords * sizeof(int64_t);

struct Exchange {
  std::vector<int64_t> metas;  // kMetaWords per rank.
  torch::Tensor slots;         // kSlotBytes per rank, on the comm device.
  bool inlined = false;        // Whether every rank's data is in its slot.
};

// Gathers every rank's metadata (and, with `inline_data`, its data when it
// fits) and throws the same UsageError on every rank when they differ.
Exchange ExchangeMeta(Communicator& comm, const torch::Tensor& tensor,
                      const char* operation, const char* needs,
                      const CollectiveOptions& options,
                      bool inline_data = false) {
  const torch::Device device = CommDevice(comm, tensor, operation);
  const auto bytes_options = torch::dtype(torch::kUInt8).device(device);
  torch::Tensor slot = torch::zeros({kSlotBytes}, bytes_options);
  slot.narrow(0, 0, kMetaBytes)
      .copy_(torch::tensor(Meta(tensor, operation), torch::kInt64)
                 .view(torch::kUInt8));
  const int64_t bytes = tensor.numel() * tensor.element_size();
  Exchange exchange;
  // Equal metadata means equal sizes, so every rank decides alike.
  exchange.inlined = inline_data && bytes <= kSlotBytes - kMetaBytes;
  if (exchange.inlined && bytes > 0) {
    slot.narrow(0, kMetaBytes, bytes)
        .copy_(tensor.contiguous().reshape({-1}).view(torch::kUInt8));
  }
  exchange.slots = torch::empty({kSlotBytes * comm.size()}, bytes_options);
  const uint64_t sequence =
      comm.allgather(slot.data_ptr(), exchange.slots.data_ptr(), kSlotBytes,
                     DType::kUInt8, options);
  const torch::Tensor metas = exchange.slots.view({comm.size(), kSlotBytes})
                                  .narrow(1, 0, kMetaBytes)
                                  .cpu()
                                  .contiguous()
                                  .view(torch::kInt64);
  exchange.metas.assign(metas.data_ptr<int64_t>(),
                        metas.data_ptr<int64_t>() + metas.numel());
  const std::vector<int64_t>& all = exchange.metas;
  bool same = true;
  for (int r = 1; r < comm.size(); ++r) {
    same &= std::equal(all.begin(), all.begin() + kMetaWords,
                       all.begin() + r * kMetaWords);
  }
  if (!same && comm.checks_enabled()) {
    std::ostringstream message;
    message << comm.DescribeCall(options, operation, sequence)
            << "tensors differ across ranks (";
    for (int r = 0; r < comm.size(); ++r) {
      message << (r ? "; " : "") << "rank " << r << ": "
              << DescribeMeta(all.data() + r * kMetaWords);
    }
    message << "); " << needs;
    throw UsageError(message.str());
  }
  return exchange;
}

}  // namespace

DType ToDType(torch::ScalarType type) {
  switch (type) {
    case torch::kFloat32:
      return DType::kFloat32;
    case torch::kFloat64:
      return DType::kFloat64;
    case torch::kFloat16:
      return DType::kFloat16;
    case torch::kBFloat16:
      return DType::kBFloat16;
    case torch::kInt8:
      return DType::kInt8;
    case torch::kUInt8:
      return DType::kUInt8;
    case torch::kInt32:
      return DType::kInt32;
    case torch::kInt64:
      return DType::kInt64;
    case torch::kBool:
      return DType::kBool;
    default:
      throw UsageError(std::string("tensors of dtype ") + c10::toString(type) +
                       " are not supported by collectives; supported: "
                       "float32, float64, float16, bfloat16, int8, uint8, "
                       "int32, int64, bool");
  }
}

torch::Tensor OnDeviceOf(const torch::Tensor& result,
                         const torch::Tensor& like) {
  return result.device() == like.device() ? result : result.to(like.device());
}

// `options` with `api` as the name diagnostics show, unless one is set.
CollectiveOptions Named(const CollectiveOptions& options, const char* api) {
  CollectiveOptions named = options;
  if (named.api == nullptr) named.api = api;
  return named;
}

torch::Tensor Gather(Communicator& comm, const torch::Tensor& tensor,
                     const CollectiveOptions& given) {
  const CollectiveOptions options = Named(given, "gather");
  const DType dtype = ToDType(tensor.scalar_type());
  torch::Tensor input =
      ForComm(comm, tensor.dim() == 0 ? tensor.reshape({1}) : tensor, "gather");
  const Exchange exchange = ExchangeMeta(
      comm, input, "gather",
      "gather needs the same shape and dtype on every rank (use "
      "pad_across_processes for sizes that differ along one dimension)",
      options, /*inline_data=*/true);
  std::vector<int64_t> shape = input.sizes().vec();
  shape[0] *= comm.size();
  if (exchange.inlined) {
    const int64_t bytes = input.numel() * input.element_size();
    torch::Tensor output = bytes == 0
                               ? torch::empty(shape, input.options())
                               : exchange.slots.view({comm.size(), kSlotBytes})
                                     .narrow(1, kMetaBytes, bytes)
                                     .contiguous()
                                     .view(input.scalar_type())
                                     .reshape(shape);
    return OnDeviceOf(output, tensor);
  }
  torch::Tensor output = torch::empty(shape, input.options());
  comm.allgather(input.data_ptr(), output.data_ptr(),
                 static_cast<size_t>(input.numel()), dtype, options);
  return OnDeviceOf(output, tensor);
}

torch::Tensor ReduceTensor(Communicator& comm, const torch::Tensor& tensor,
                           const std::string& reduction,
                           const CollectiveOptions& given) {
  const CollectiveOptions options = Named(given, "reduce");
  ReduceOp op;
  if (reduction == "sum" || reduction == "mean") {
    op = ReduceOp::kSum;
  } else if (reduction == "max") {
    op = ReduceOp::kMax;
  } else if (reduction == "min") {
    op = ReduceOp::kMin;
  } else {
    throw UsageError("reduce: unknown reduction '" + reduction +
                     "'; use \"sum\", \"mean\", \"max\" or \"min\"");
  }
  const DType dtype = ToDType(tensor.scalar_type());
  if (reduction == "mean" && !torch::isFloatingType(tensor.scalar_type())) {
    throw UsageError(std::string("reduce: \"mean\" needs a floating-point "
                                 "tensor, found ") +
                     c10::toString(tensor.scalar_type()) +
                     "; convert it first, e.g. tensor.to(torch::kFloat32)");
  }
  if (!SupportsReduction(dtype, op)) {
    throw UsageError("reduce: reduction '" + reduction +
                     "' is not defined for bool tensors; use \"max\" (any) "
                     "or \"min\" (all)");
  }
  // clone(): the input is never modified, as in Accelerate.
  torch::Tensor result = ForComm(comm, tensor, "reduce").clone();
  if (comm.checks_enabled()) {
    ExchangeMeta(comm, result, "reduce",
                 "reduce needs the same shape and dtype on every rank",
                 options);
  }
  comm.allreduce(result.data_ptr(), static_cast<size_t>(result.numel()), dtype,
                 op, options);
  if (reduction == "mean") result.div_(comm.size());
  return OnDeviceOf(result, tensor);
}

torch::Tensor BroadcastTensor(Communicator& comm, const torch::Tensor& tensor,
                              int from_process,
                              const CollectiveOptions& given) {
  const CollectiveOptions options = Named(given, "broadcast");
  if (from_process < 0 || from_process >= comm.size()) {
    throw UsageError("broadcast: from_process must be in [0, " +
                     std::to_string(comm.size()) + "), found " +
                     std::to_string(from_process));
  }
  const DType dtype = ToDType(tensor.scalar_type());
  torch::Tensor result = ForComm(comm, tensor, "broadcast").clone();
  if (comm.checks_enabled()) {
    ExchangeMeta(comm, result, "broadcast",
                 "every rank must pass a tensor of the sender's shape and "
                 "dtype",
                 options);
  }
  comm.broadcast(result.data_ptr(), static_cast<size_t>(result.numel()), dtype,
                 from_process, options);
  return OnDeviceOf(result, tensor);
}

namespace {

// "'fc.weight' shape [4, 8] float32", how a rank's tensor is compared.
std::string DescribeNamed(const std::string& name,
                          const torch::Tensor& tensor) {
  return "'" + name + "' " + DescribeMeta(Meta(tensor, "broadcast").data());
}

uint64_t Fingerprint(const std::vector<std::string>& descriptions) {
  uint64_t hash = 14695981039346656037ull;  // FNV-1a.
  for (const std::string& text : descriptions) {
    for (unsigned char c : text + '\n') hash = (hash ^ c) * 1099511628211ull;
  }
  return hash;
}

// Throws the same UsageError on every rank when their lists differ: one
// allgather of (count, fingerprint); only when they differ, the lists.
void CheckSameTensors(Communicator& comm,
                      const std::vector<std::string>& descriptions,
                      const CollectiveOptions& options) {
  int64_t mine[2] = {static_cast<int64_t>(descriptions.size()),
                     static_cast<int64_t>(Fingerprint(descriptions))};
  std::vector<int64_t> all(2 * static_cast<size_t>(comm.size()));
  const uint64_t sequence =
      comm.allgather(mine, all.data(), 2, DType::kInt64, options);
  bool same = true;
  for (int r = 1; r < comm.size(); ++r) {
    same &= all[2 * r] == all[0] && all[2 * r + 1] == all[1];
  }
  if (same) return;
  const std::vector<std::string> lists =
      GatherObject(comm, std::vector<std::string>{[&] {
                     std::string joined;
                     for (const std::string& d : descriptions)
                       joined += d + '\n';
                     return joined;
                   }()},
                   options);
  std::vector<std::vector<std::string>> split(lists.size());
  for (size_t r = 0; r < lists.size(); ++r) {
    std::istringstream lines(lists[r]);
    for (std::string line; std::getline(lines, line);) {
      split[r].push_back(line);
    }
  }
  std::ostringstream message;
  message << comm.DescribeCall(options, "broadcast", sequence)
          << "the ranks' tensors differ: ";
  for (size_t r = 1; r < split.size(); ++r) {
    size_t i = 0;
    while (i < split[0].size() && i < split[r].size() &&
           split[0][i] == split[r][i]) {
      ++i;
    }
    if (i == split[0].size() && i == split[r].size()) continue;
    auto at = [&](size_t rank) {
      return i < split[rank].size()
                 ? split[rank][i]
                 : "nothing (it passed " + std::to_string(split[rank].size()) +
                       ")";
    };
    message << "tensor " << i << " is " << at(0) << " on rank 0 and " << at(r)
            << " on rank " << r << "; ";
    break;
  }
  message << "every rank must pass the same tensors (prepare the same model "
             "on every rank)";
  throw UsageError(message.str());
}

// One broadcast of `members`, flattened into one buffer.
void BroadcastBucket(Communicator& comm,
                     const std::vector<torch::Tensor>& members,
                     int from_process, const CollectiveOptions& options) {
  std::vector<torch::Tensor> parts;
  for (const torch::Tensor& t : members) {
    parts.push_back(ForComm(comm, t, "broadcast").reshape({-1}));
  }
  torch::Tensor flat = torch::cat(parts);
  comm.broadcast(flat.data_ptr(), static_cast<size_t>(flat.numel()),
                 ToDType(flat.scalar_type()), from_process, options);
  if (comm.rank() == from_process) return;
  int64_t offset = 0;
  for (torch::Tensor t : members) {
    t.copy_(flat.narrow(0, offset, t.numel()).view(t.sizes()));
    offset += t.numel();
  }
}

}  // namespace

void BroadcastCoalesced(Communicator& comm,
                        const std::vector<std::string>& names,
                        const std::vector<torch::Tensor>& tensors,
                        int from_process, const CollectiveOptions& given,
                        int64_t bucket_bytes) {
  const CollectiveOptions options = Named(given, "broadcast");
  if (names.size() != tensors.size()) {
    throw UsageError("BroadcastCoalesced: " + std::to_string(names.size()) +
                     " names for " + std::to_string(tensors.size()) +
                     " tensors");
  }
  if (from_process < 0 || from_process >= comm.size()) {
    throw UsageError("broadcast: from_process must be in [0, " +
                     std::to_string(comm.size()) + "), found " +
                     std::to_string(from_process));
  }
  std::vector<torch::Tensor> live;
  std::vector<std::string> descriptions;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (!tensors[i].defined()) continue;
    ToDType(tensors[i].scalar_type());  // Unsupported dtypes fail here.
    descriptions.push_back(DescribeNamed(names[i], tensors[i]));
    if (tensors[i].numel() > 0) live.push_back(tensors[i]);
  }
  if (comm.checks_enabled()) CheckSameTensors(comm, descriptions, options);
  // Buckets: the tensors of one dtype and device in list order, cut at
  // bucket_bytes, so that every rank builds the same ones.
  std::vector<std::vector<torch::Tensor>> groups;
  for (const torch::Tensor& t : live) {
    auto group = std::find_if(groups.begin(), groups.end(), [&](auto& g) {
      return g.front().scalar_type() == t.scalar_type() &&
             g.front().device() == t.device();
    });
    if (group == groups.end()) {
      groups.push_back({t});
    } else {
      group->push_back(t);
    }
  }
  torch::NoGradGuard no_grad;
  for (const std::vector<torch::Tensor>& group : groups) {
    size_t begin = 0;
    while (begin < group.size()) {
      size_t end = begin;
      int64_t bytes = 0;
      while (end < group.size()) {
        const int64_t size = group[end].numel() * group[end].element_size();
        if (end > begin && bytes + size > bucket_bytes) break;
        bytes += size;
        ++end;
      }
      BroadcastBucket(comm, {group.begin() + begin, group.begin() + end},
                      from_process, options);
      begin = end;
    }
  }
}

torch::Tensor PadAcrossProcesses(Communicator& comm,
                                 const torch::Tensor& tensor, int64_t dim,
                                 double pad_index, bool pad_first,
                                 const CollectiveOptions& given) {
  const CollectiveOptions options = Named(given, "pad_across_processes");
  const int64_t ndim = tensor.dim();
  if (dim < 0) dim += ndim;
  // Every rank decides alike as long as ranks agree on the tensor's rank.
  if (dim < 0 || dim >= ndim) return tensor;
  torch::Tensor longest =
      torch::tensor({tensor.size(dim)}, torch::kInt64)
          .to(CommDevice(comm, tensor, "pad_across_processes"));
  comm.allreduce(longest.data_ptr(), 1, DType::kInt64, ReduceOp::kMax, options);
  const int64_t size = longest.item<int64_t>();
  if (size == tensor.size(dim)) return tensor;
  std::vector<int64_t> shape = tensor.sizes().vec();
  shape[dim] = size;
  torch::Tensor padded = torch::full(shape, pad_index, tensor.options());
  const int64_t offset = pad_first ? size - tensor.size(dim) : 0;
  padded.narrow(dim, offset, tensor.size(dim)).copy_(tensor);
  return padded;
}

void AllreduceHostValues(Communicator& comm, void* values, size_t count,
                         torch::ScalarType type, ReduceOp op,
                         const CollectiveOptions& options) {
  if (comm.device_index() < 0) {
    comm.allreduce(values, count, ToDType(type), op, options);
    return;
  }
  torch::Tensor host =
      torch::from_blob(values, {static_cast<int64_t>(count)}, type);
  torch::Tensor device =
      host.to(torch::Device(torch::kCUDA, comm.device_index()));
  comm.allreduce(device.data_ptr(), count, ToDType(type), op, options);
  host.copy_(device.cpu());
}

}  // namespace accel
