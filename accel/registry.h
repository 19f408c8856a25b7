// Creates communicators by backend name, so that accel never names a backend
// and programs choose one at run time (--backend=gloo|nccl).
//
//   // In a backend's .cc (its cc_library has alwayslink = 1):
//   static const accel::BackendRegistration kRegistration(
//       "gloo", [](const accel::BackendContext& c) {
//         return std::make_unique<GlooCommunicator>(c);
//       });
//
//   // In a program:
//   auto comm = accel::CreateCommunicator("gloo", context);
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "accel/communicator.h"

namespace accel {

using BackendFactory =
    std::function<std::unique_ptr<Communicator>(const BackendContext&)>;

void RegisterBackend(const std::string& name, BackendFactory factory);

// Throws UsageError listing the registered names when `name` is unknown.
std::unique_ptr<Communicator> CreateCommunicator(const std::string& name,
                                                 const BackendContext& context);

std::vector<std::string> RegisteredBackends();

struct BackendRegistration {
  BackendRegistration(const std::string& name, BackendFactory factory) {
    RegisterBackend(name, std::move(factory));
  }
};

}  // namespace accel
