"""C++ rules with the options accel's headers need, for accel and its users.

    load("@accel//:defs.bzl", "accel_cc_binary")

    accel_cc_binary(
        name = "train",
        srcs = ["train.cc"],
        deps = ["@accel//accel"],
    )

Bazel's auto-configured GCC toolchain compiles C++ as -std=c++0x; accel and
LibTorch need C++17. These macros are cc_library / cc_binary / cc_test with
-std=c++17 added to copts, so that a workspace using accel needs nothing in
its .bazelrc. Every target whose sources include an accel header needs it
(flags do not travel from a library to the targets that use it).
"""

ACCEL_COPTS = ["-std=c++17"]

def _with_copts(kwargs):
    kwargs["copts"] = ACCEL_COPTS + kwargs.get("copts", [])
    return kwargs

def accel_cc_library(**kwargs):
    native.cc_library(**_with_copts(kwargs))

def accel_cc_binary(**kwargs):
    native.cc_binary(**_with_copts(kwargs))

def accel_cc_test(**kwargs):
    native.cc_test(**_with_copts(kwargs))
