"""Marks a package LibTorch-free for //tests/layering:layering_test.

    load("//tests/layering:layering.bzl", "torch_free_package")
    ...every rule of the package...
    torch_free_package()  # last, so that it sees every rule above it

Adds `torch_free_deps`, a genquery of the transitive dependencies of the
package's C++ rules, which the test checks for LibTorch and for accel's
LibTorch layer (//accel:*). New rules are covered without a list to keep.
"""

def torch_free_package():
    package = "//" + native.package_name() + ":"
    rules = sorted([
        package + rule["name"]
        for rule in native.existing_rules().values()
        if rule["kind"].startswith("cc_")
    ])
    native.genquery(
        name = "torch_free_deps",
        testonly = True,
        expression = "deps(set(%s))" % " ".join(rules),
        scope = rules,
        visibility = ["//tests/layering:__pkg__"],
    )
