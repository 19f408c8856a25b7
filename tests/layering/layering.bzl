"""Marks a package LibTorch-free for //tests/layering:layering_test.

    load("//tests/layering:layering.bzl", "torch_free_package")
    ...every rule of the package...
    torch_free_package()  # last, so that it sees every rule above it

Adds `torch_free_deps`, a genquery of the transitive dependencies of the
package's C++ rules, which the test checks for LibTorch and for accel's
LibTorch layer (//accel:*), and `library_deps`, the same for the rules
that are not tests (in accel/runtime/ those must not reach a backend; its
tests may run over one). New rules are covered without a list to keep.
"""

def torch_free_package():
    package = "//" + native.package_name() + ":"
    cc_rules = [
        rule
        for rule in native.existing_rules().values()
        if rule["kind"].startswith("cc_")
    ]
    rules = sorted([package + rule["name"] for rule in cc_rules])
    libraries = sorted([
        package + rule["name"]
        for rule in cc_rules
        if rule["kind"] != "cc_test" and not rule.get("testonly", False)
    ])
    native.genquery(
        name = "torch_free_deps",
        testonly = True,
        expression = "deps(set(%s))" % " ".join(rules),
        scope = rules,
        visibility = ["//tests/layering:__pkg__"],
    )
    native.genquery(
        name = "library_deps",
        testonly = True,
        expression = "deps(set(%s))" % " ".join(libraries),
        scope = libraries if libraries else rules,
        visibility = ["//tests/layering:__pkg__"],
    )

def accel_package():
    """Marks a package of accel's LibTorch layer (accel/core, accel/parallel,
    ...) for //tests/layering:layering_test, which checks its dependencies
    and includes against ACCEL_LAYERS in tests/layering/BUILD.bazel.

        load("//tests/layering:layering.bzl", "accel_package")
        ...every rule of the package...
        accel_package()  # last, so that it sees every rule above it

    Adds `accel_deps`, a genquery of the transitive dependencies of the
    package's libraries (its tests may reach further, through //tests).
    """
    package = "//" + native.package_name() + ":"
    libraries = sorted([
        package + rule["name"]
        for rule in native.existing_rules().values()
        if rule["kind"].startswith("cc_") and rule["kind"] != "cc_test" and
           not rule.get("testonly", False)
    ])
    native.genquery(
        name = "accel_deps",
        testonly = True,
        expression = "deps(set(%s))" % " ".join(libraries),
        scope = libraries,
        visibility = ["//tests/layering:__pkg__"],
    )
