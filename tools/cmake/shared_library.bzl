"""One shared library of every object of a workspace's cc_libraries.

    whole_shared_library(name = "libaccel.so", deps = ["//accel"])

A cc_binary with linkshared takes from its deps' archives only the objects
something in it refers to (none, for a library that nothing calls yet);
this rule links every object of this workspace's libraries (their PIC
archives, whole) and the system libraries they use as dynamic
dependencies, so the library has all of accel's symbols for programs that
other build systems link against it.
"""

load("@bazel_tools//tools/cpp:toolchain_utils.bzl", "find_cpp_toolchain")

def _whole_shared_library_impl(ctx):
    cc_toolchain = find_cpp_toolchain(ctx)
    feature_configuration = cc_common.configure_features(
        ctx = ctx,
        cc_toolchain = cc_toolchain,
        requested_features = ctx.features,
        unsupported_features = ctx.disabled_features,
    )
    inputs = []
    for dep in ctx.attr.deps:
        for linker_input in dep[CcInfo].linking_context.linker_inputs.to_list():
            own = linker_input.owner.workspace_name == ""
            libraries = []
            for library in linker_input.libraries:
                archive = library.pic_static_library or library.static_library
                if own and archive != None:
                    library = cc_common.create_library_to_link(
                        actions = ctx.actions,
                        feature_configuration = feature_configuration,
                        cc_toolchain = cc_toolchain,
                        pic_static_library = archive,
                        alwayslink = True,
                    )
                libraries.append(library)
            inputs.append(cc_common.create_linker_input(
                owner = linker_input.owner,
                libraries = depset(libraries),
                user_link_flags = depset(linker_input.user_link_flags),
            ))
    linking_context = cc_common.create_linking_context(
        linker_inputs = depset(inputs),
    )
    outputs = cc_common.link(
        actions = ctx.actions,
        feature_configuration = feature_configuration,
        cc_toolchain = cc_toolchain,
        linking_contexts = [linking_context],
        name = ctx.label.name,
        output_type = "dynamic_library",
        user_link_flags = ctx.attr.linkopts,
    )
    library = outputs.library_to_link.resolved_symlink_dynamic_library or \
              outputs.library_to_link.dynamic_library
    return [DefaultInfo(
        files = depset([library]),
        runfiles = ctx.runfiles(files = [library]),
    )]

whole_shared_library = rule(
    implementation = _whole_shared_library_impl,
    attrs = {
        "deps": attr.label_list(providers = [CcInfo]),
        "linkopts": attr.string_list(),
        "_cc_toolchain": attr.label(
            default = Label("@bazel_tools//tools/cpp:current_cc_toolchain"),
        ),
    },
    fragments = ["cpp"],
    toolchains = ["@bazel_tools//tools/cpp:toolchain_type"],
)
