// Where a ZeRO stage-3 parameter's storage points while its unit is not
// running (zero.h): an address range reserved with no access and no memory
// behind it. A program that reads such a parameter (model->parameters()
// after a step, a layer run outside its model) faults inside that range,
// and a SIGSEGV handler installed with the reservation says what happened
// and how to read the weights, before the process dies of the fault as it
// would have (LibTorch reads a tensor's data without checking that its
// storage holds any, so a null pointer would crash with no word).
//
//   void* at = accel::ReleasedMemory(storage, flat.nbytes());  // null: not
//   storage->set_data_ptr_noswap(c10::DataPtr(at, flat.device()));  // guarded
//   accel::NameReleasedBytes(storage, flat.nbytes(), 0, 64, "fc.weight");
//
// Each owner (a flat buffer's storage) gets a part of the range of its own,
// the same on every call, so that the handler can name the parameter whose
// bytes were touched. Faults elsewhere go to the handler that was installed
// before.
#pragma once

#include <cstddef>
#include <string>

namespace accel {

// The part of the reserved range that `owner`'s `bytes` point at while
// released (the same part on every call, once it was given); the range's
// start, shared and nameless, when no part is left; null when the range
// could not be reserved.
void* ReleasedMemory(const void* owner, size_t bytes);

// Names bytes [offset, offset + bytes) of owner's part (of `owner_bytes`):
// a fault there names `name` (cut to 95 characters). At most 65,536 names.
void NameReleasedBytes(const void* owner, size_t owner_bytes, size_t offset,
                       size_t bytes, const std::string& name);

// Drops the names in owner's part: a new buffer whose storage has the
// address of a freed one (whose part it then shares) starts nameless.
void ForgetReleasedNames(const void* owner);

// Whether `at` lies in the reserved range (for tests).
bool IsReleasedMemory(const void* at);

}  // namespace accel
