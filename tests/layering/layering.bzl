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

def _cc_rules(libraries_only):
    """The labels of this package's C++ rules (only its libraries: no tests,
    nothing testonly), sorted."""
    package = "//" + native.package_name() + ":"
    return sorted([
        package + rule["name"]
        for rule in native.existing_rules().values()
        if rule["kind"].startswith("cc_") and (not libraries_only or (
            rule["kind"] != "cc_test" and not rule.get("testonly", False)))
    ])

def _deps_query(name, rules, scope):
    native.genquery(
        name = name,
        testonly = True,
        expression = "deps(set(%s))" % " ".join(rules),
        scope = scope,
        visibility = ["//tests/layering:__pkg__"],
    )

def torch_free_package():
    rules = _cc_rules(libraries_only = False)
    libraries = _cc_rules(libraries_only = True)
    _deps_query("torch_free_deps", rules, rules)
    _deps_query("library_deps", libraries, libraries if libraries else rules)

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
    libraries = _cc_rules(libraries_only = True)
    _deps_query("accel_deps", libraries, libraries)
