"""C++ classes from .proto files with the system protoc (no download).

    load("//third_party:proto.bzl", "cc_proto_sources_library")

    cc_proto_sources_library(
        name = "tensorboard_proto",
        srcs = ["tensorboard.proto"],  # in this package
    )

gives a cc_library whose header is "<package>/tensorboard.pb.h". The .proto
files import each other by their path from the repository root, and the
protobuf's well-known types ("google/protobuf/struct.proto"). Works in this
repository and from a workspace that uses accel as an external repository.
"""

load("//:defs.bzl", "ACCEL_COPTS")

def _proto_cc_sources_impl(ctx):
    protoc = ctx.executable._protoc
    root = ctx.label.workspace_root  # "" here, "external/<name>" elsewhere.
    well_known = ctx.files._well_known_protos
    includes = ["-I" + (root or ".")]
    for proto in well_known:
        if proto.path.endswith("google/protobuf/struct.proto"):
            includes.append("-I" + proto.path[:-len("google/protobuf/struct.proto")])
    headers = []
    sources = []
    for src in ctx.files.srcs:
        if src.owner.package != ctx.label.package:
            fail("%s: %s is not in package %s" % (ctx.label, src.path, ctx.label.package))
        base = src.basename[:-len(".proto")]
        headers.append(ctx.actions.declare_file(base + ".pb.h"))
        sources.append(ctx.actions.declare_file(base + ".pb.cc"))
    out_dir = ctx.bin_dir.path + ("/" + root if root else "")
    ctx.actions.run(
        executable = protoc,
        arguments = includes + ["--cpp_out=" + out_dir] +
                    [src.path for src in ctx.files.srcs],
        inputs = ctx.files.srcs + ctx.files.deps + well_known,
        outputs = headers + sources,
        mnemonic = "Protoc",
        progress_message = "Generating C++ from %s" % ", ".join(
            [src.basename for src in ctx.files.srcs],
        ),
    )
    return [
        DefaultInfo(files = depset(headers + sources)),
        OutputGroupInfo(headers = depset(headers), sources = depset(sources)),
    ]

_proto_cc_sources = rule(
    implementation = _proto_cc_sources_impl,
    attrs = {
        "srcs": attr.label_list(allow_files = [".proto"], mandatory = True),
        # .proto files that srcs import (from other packages).
        "deps": attr.label_list(allow_files = [".proto"]),
        "_protoc": attr.label(
            default = Label("@accel_protobuf//:bin/protoc"),
            executable = True,
            allow_single_file = True,
            cfg = "host",
        ),
        "_well_known_protos": attr.label(
            default = Label("@accel_protobuf//:well_known_protos"),
        ),
    },
)

def cc_proto_sources_library(name, srcs, deps = [], proto_deps = [], **kwargs):
    """A cc_library of the classes protoc generates from `srcs`.

    Args:
      name: the cc_library's name.
      srcs: .proto files of this package.
      deps: cc_proto_sources_library targets whose .proto files srcs import.
      proto_deps: those .proto files themselves.
      **kwargs: passed to cc_library (visibility, ...).
    """
    _proto_cc_sources(name = name + "_generated", srcs = srcs, deps = proto_deps)
    native.filegroup(
        name = name + "_headers",
        srcs = [":" + name + "_generated"],
        output_group = "headers",
    )
    native.filegroup(
        name = name + "_sources",
        srcs = [":" + name + "_generated"],
        output_group = "sources",
    )
    native.cc_library(
        name = name,
        srcs = [":" + name + "_sources"],
        hdrs = [":" + name + "_headers"],
        # Generated code: accel's warning flags are not its business.
        copts = ACCEL_COPTS + ["-w"],
        deps = deps + [Label("@accel_protobuf//:protobuf")],
        **kwargs
    )
