"""accel's own headers, for installing beside its shared library.

    installed_headers(name = "headers", deps = ["//accel"], prefix = "accel/")

gives every header under `prefix` that the deps compile with, transitively,
from this workspace (not LibTorch's or the other system libraries'), as
files and runfiles at their paths in the workspace.
"""

def _installed_headers_impl(ctx):
    headers = []
    for dep in ctx.attr.deps:
        for header in dep[CcInfo].compilation_context.headers.to_list():
            # Headers of a library with strip_include_prefix (the forwarding
            # headers) come twice: as files and as _virtual_includes links.
            if (header.owner.workspace_name == "" and
                header.short_path.startswith(ctx.attr.prefix) and
                "/_virtual_includes/" not in header.short_path):
                headers.append(header)
    return [DefaultInfo(
        files = depset(headers),
        runfiles = ctx.runfiles(files = headers),
    )]

installed_headers = rule(
    implementation = _installed_headers_impl,
    attrs = {
        "deps": attr.label_list(providers = [CcInfo]),
        "prefix": attr.string(mandatory = True),
    },
)
