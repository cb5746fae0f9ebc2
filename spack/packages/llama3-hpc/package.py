# A Spack package for llama3-hpc: Llama 3 fine-tuning (SFT and reward models) for MPI clusters.
#
#   spack repo add ./spack
#   spack install llama3-hpc +cuda cuda_arch=90      # GPU nodes (H100/H200); cuda_arch=80 for A100
#   spack install llama3-hpc                         # CPU only
#   spack load llama3-hpc                            # llama3-hpc on PATH; job scripts in
#                                                    # $(spack location -i llama3-hpc)/share/llama3-hpc/jobs
#
# tests/spack/check_package.py keeps this file honest: every -D option below exists in the
# project's CMake, and the dependencies equal the ones the CMake configure step looks for.

from spack.package import *  # noqa: F401,F403  (Spack's package API: directives, CMakePackage, ...)

try:  # Spack >= 1.0: the build systems live in the builtin package repository
    from spack_repo.builtin.build_systems.cmake import CMakePackage
    from spack_repo.builtin.build_systems.cuda import CudaPackage
except ImportError:  # Spack 0.x: they come with spack.package
    pass

import spack


def _spack_knows_language(name):
    """Whether this Spack takes `depends_on(name)` for the language `name` (c, cxx). Spack 1.x
    requires it (a package gets only the compilers it depends on); 0.22 and 0.23 know a fixed
    list (spack.directives.SUPPORTED_LANGUAGES: 0.23.0.dev0 has cxx and fortran but not c); an
    older Spack stops at concretization with "Package 'c' not found"."""
    try:
        from spack import directives

        known = getattr(directives, "SUPPORTED_LANGUAGES", None)
    except ImportError:
        known = None
    if known is not None:
        return name in known
    try:
        return tuple(int(str(part)) for part in spack.spack_version_info[:2]) >= (1, 0)
    except (AttributeError, TypeError, ValueError):
        return True  # no version to read: assume a current Spack


class Llama3Hpc(CMakePackage, CudaPackage):
    """Fine-tune Llama 3 models on supercomputers: supervised fine-tuning and Bradley-Terry
    reward-model training as one bulk-synchronous MPI program in C++20/CUDA, with rank-parallel
    HDF5 data, sharded AdamW, and checkpoint/restart that survives node failures."""

    homepage = "https://github.com/llama3-hpc/llama3-hpc"
    git = "https://github.com/llama3-hpc/llama3-hpc.git"

    license("Apache-2.0")

    version("main", branch="main")

    variant("tests", default=False, description="Build the test suite (ctest; needs Catch2)")

    # The compilers (Spack >= 1.0 treats languages as dependencies): C++20, and C for CMake's
    # project(LANGUAGES C CXX). Each declared only where Spack knows it (see above).
    if _spack_knows_language("c"):
        depends_on("c", type="build")
    if _spack_knows_language("cxx"):
        depends_on("cxx", type="build")
    depends_on("cmake@3.24:", type="build")
    depends_on("pkgconfig", type="build")

    depends_on("mpi")
    depends_on("hdf5@1.10: +mpi")
    depends_on("boost@1.71: +program_options")
    depends_on("fmt@8:")
    depends_on("nlohmann-json@3.9:")
    # Any BLAS will not do: the CPU backend calls OpenBLAS's own thread controls, and the OpenMP
    # build shares the program's OpenMP threads instead of starting a competing pool.
    depends_on("openblas threads=openmp")
    depends_on("pcre2")
    depends_on("xxhash")
    depends_on("openssl")
    depends_on("zlib-api")
    # TensorBoard event files (--tensorboard): the library, and protoc at build time.
    depends_on("protobuf")
    depends_on("catch2@2:", type=("build", "test"), when="+tests")

    # GPU backend: CUDA (cuBLAS/cuBLASLt) from CudaPackage, cuDNN 9 and NCCL 2.
    depends_on("cuda@12:", when="+cuda")
    depends_on("cudnn@9:", when="+cuda")
    depends_on("nccl@2.18:", when="+cuda")
    conflicts("cuda_arch=none", when="+cuda", msg="llama3-hpc +cuda needs cuda_arch, e.g. cuda_arch=90")
    conflicts("%gcc@:10", msg="llama3-hpc needs C++20 (GCC 11 or newer)")

    def cmake_args(self):
        args = [
            self.define("L3_CUDA", "ON" if self.spec.satisfies("+cuda") else "OFF"),
            self.define_from_variant("L3_BUILD_TESTS", "tests"),
            self.define("L3_BUILD_BENCH", False),
            self.define("L3_FUZZ", False),
        ]
        if self.spec.satisfies("+cuda"):
            archs = self.spec.variants["cuda_arch"].value
            args.append(self.define("L3_CUDA_ARCHS", ";".join(archs)))
        return args
