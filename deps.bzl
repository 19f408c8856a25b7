"""Everything accel needs, in a WORKSPACE, in one call (no downloads).

    local_repository(name = "accel", path = "/path/to/accel")
    load("@accel//:deps.bzl", "accel_dependencies")
    accel_dependencies()

defines, from the Debian packages that tools/setup.sh installs:

    accel_torch      LibTorch 1.13 (libtorch-dev)      @accel_torch//:torch
    accel_gloo       Gloo 0.5 (libgloo-dev)            @accel_gloo//:gloo
    accel_gflags     gflags 2.2 (libgflags-dev)        @accel_gflags//:gflags
    accel_glog       glog 0.6 (libgoogle-glog-dev)     @accel_glog//:glog
    accel_json       nlohmann JSON 3.11                @accel_json//:json
    accel_mpi        Open MPI 4.1 (libopenmpi-dev)     @accel_mpi//:mpi
    accel_protobuf   Protocol Buffers 3.21             @accel_protobuf//:protobuf,
                                                       :bin/protoc, :well_known_protos
    accel_yaml_cpp   yaml-cpp 0.7 (libyaml-cpp-dev)    @accel_yaml_cpp//:yaml_cpp
    accel_zlib       zlib 1.2 (zlib1g-dev; examples)   @accel_zlib//:zlib
    accel_gtest      GoogleTest 1.12 (accel's tests)   @accel_gtest//:gtest, :gtest_main
    accel_cuda       CUDA + NCCL at $CUDA_HOME, when there is one
                     (default /usr/local/cuda; empty without)

and, unless the workspace defines them already, the three repositories that
Bazel 4.2.3 would otherwise download even for a pure C++ build (rules_cc,
rules_java, remote_coverage_tools) as the small offline stand-ins in accel's
third_party/bazel/: without them an offline build under Debian's Bazel cannot
build any cc_test. A workspace that has the real ones (a distdir, a mirror)
defines them before calling accel_dependencies and keeps its own.

A workspace that already has one of these libraries passes its own targets
instead, and accel builds against them (the accel_X repository then only
forwards to them):

    accel_dependencies(existing = {
        "@accel_gflags//:gflags": "@com_github_gflags_gflags//:gflags",
    })

Every target of such a repository that the build uses must be mapped.
"""

load("//third_party/cuda:cuda_configure.bzl", "cuda_configure")

# name -> BUILD file in //third_party, for the libraries under /usr.
_SYSTEM_LIBRARIES = {
    "accel_gflags": "gflags.BUILD",
    "accel_glog": "glog.BUILD",
    "accel_gloo": "gloo.BUILD",
    "accel_gtest": "gtest.BUILD",
    "accel_json": "json.BUILD",
    "accel_mpi": "mpi.BUILD",
    "accel_protobuf": "protobuf.BUILD",
    "accel_torch": "torch.BUILD",
    "accel_yaml_cpp": "yaml_cpp.BUILD",
    "accel_zlib": "zlib.BUILD",
}

_STAND_INS = ["rules_cc", "rules_java", "remote_coverage_tools"]

def _stand_in_impl(ctx):
    # Any file of a package beside the stand-ins finds them on disk.
    third_party = ctx.path(Label("//third_party:protobuf.BUILD")).dirname
    source = third_party.get_child("bazel").get_child(ctx.attr.folder)
    for child in source.readdir():
        ctx.symlink(child, child.basename)

_stand_in = repository_rule(
    implementation = _stand_in_impl,
    attrs = {"folder": attr.string(mandatory = True)},
    local = True,
)

def _forwarding_repository_impl(ctx):
    lines = ['package(default_visibility = ["//visibility:public"])', ""]
    for target, actual in sorted(ctx.attr.targets.items()):
        lines.append('alias(name = "%s", actual = "%s")' % (target, actual))
    ctx.file("WORKSPACE", "")
    ctx.file("BUILD.bazel", "\n".join(lines) + "\n")

_forwarding_repository = repository_rule(
    implementation = _forwarding_repository_impl,
    attrs = {"targets": attr.string_dict()},
)

def _split(label):
    """'@repo//:target' -> ('repo', 'target'); fails otherwise."""
    if not label.startswith("@") or "//:" not in label:
        fail("accel_dependencies: existing: expected a key like " +
             "'@accel_gflags//:gflags', found '%s'" % label)
    repository, target = label[1:].split("//:", 1)
    return repository, target

def accel_dependencies(existing = {}):
    """Defines the repositories accel needs (see the file's comment).

    Args:
      existing: {accel's label: your label}, for libraries the workspace
        already has, e.g. {"@accel_gflags//:gflags": "@gflags//:gflags"}.
    """
    forwarded = {}
    for label, actual in existing.items():
        repository, target = _split(label)
        if repository not in _SYSTEM_LIBRARIES:
            fail("accel_dependencies: existing: '%s' is not one of accel's " %
                 label + "repositories (%s)" % ", ".join(sorted(_SYSTEM_LIBRARIES)))
        forwarded.setdefault(repository, {})[target] = actual

    for name in _STAND_INS:
        if not native.existing_rule(name):
            _stand_in(name = name, folder = name)

    for name, build_file in _SYSTEM_LIBRARIES.items():
        if native.existing_rule(name):
            continue
        if name in forwarded:
            _forwarding_repository(name = name, targets = forwarded[name])
        else:
            native.new_local_repository(
                name = name,
                build_file = str(Label("//third_party:" + build_file)),
                path = "/usr",
            )

    if not native.existing_rule("accel_cuda"):
        cuda_configure(name = "accel_cuda")
