// accel's version, for `accel env`, bug reports and programs that print it.
//
//   std::printf("accel %s\n", accel::kVersion);  // accel 0.1.1
#pragma once

namespace accel {

inline constexpr char kVersion[] = "0.1.1";

}  // namespace accel
