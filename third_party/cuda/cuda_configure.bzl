"""Finds a local CUDA toolkit with NCCL (no download).

Creates @local_cuda with :cuda (headers, cudart and nccl) and defs.bzl's
HAVE_CUDA. Without a toolkit at $CUDA_HOME (default /usr/local/cuda) the
library is empty and HAVE_CUDA is False, so the build still works and the nccl
backend reports that it was built without CUDA.
"""

_BUILD_WITH_CUDA = """
cc_library(
    name = "cuda",
    srcs = ["lib/libcudart.so", "lib/libnccl.so"],
    hdrs = glob(["include/**"]),
    includes = ["include"],
    visibility = ["//visibility:public"],
)
"""

_BUILD_WITHOUT_CUDA = """
cc_library(
    name = "cuda",
    visibility = ["//visibility:public"],
)
"""

def _cuda_configure_impl(ctx):
    home = ctx.os.environ.get("CUDA_HOME", "/usr/local/cuda")
    include = ctx.path(home + "/include")
    lib = None
    for candidate in ["lib64", "lib"]:
        path = ctx.path(home + "/" + candidate)
        if path.get_child("libnccl.so").exists and path.get_child("libcudart.so").exists:
            lib = path
            break
    have = (lib != None and include.get_child("nccl.h").exists and
            include.get_child("cuda_runtime_api.h").exists)
    if have:
        ctx.symlink(include, "include")
        ctx.symlink(lib, "lib")
        ctx.file("BUILD", _BUILD_WITH_CUDA)
    else:
        ctx.file("BUILD", _BUILD_WITHOUT_CUDA)
    ctx.file("defs.bzl", "HAVE_CUDA = %s\nCUDA_HOME = %r\n" % (have, home))

cuda_configure = repository_rule(
    implementation = _cuda_configure_impl,
    environ = ["CUDA_HOME"],
    local = True,
)
