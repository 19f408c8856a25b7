// Where a ZeRO stage-3 parameter's storage points while its unit is not
// running (zero.h): an address range reserved with no access and no memory
// behind it. A program that reads such a parameter (model->parameters()
// after a step, a layer run outside its model) faults inside that range,
// and a SIGSEGV handler installed with the reservation says what happened
// and how to read the weights, before the process dies of the fault as it
// would have (LibTorch reads a tensor's data without checking that its
// storage holds any, so a null pointer would crash with no word).
//
//   void* at = accel::ReleasedMemory(flat.nbytes());  // null: not guarded
//   storage->set_data_ptr_noswap(c10::DataPtr(at, flat.device()));
//
// Faults elsewhere go to the handler that was installed before.
#pragma once

#include <cstddef>

namespace accel {

// The reserved range's start when `bytes` fit in it (and it could be
// reserved), else null.
void* ReleasedMemory(size_t bytes);

}  // namespace accel
