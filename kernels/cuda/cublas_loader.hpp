// cuBLAS and cuBLASLt loaded on first use instead of linked (cublas_loader.cpp): a process that
// never calls them (`--help`, `prep`, `ckpt verify`, a run on the CPU backend of a CUDA build)
// no longer maps and relocates them at start, which cost each process about 0.4 s of CPU and
// 210 MB of resident memory. The backend calls cuBLAS by its own names as before. Real CUDA
// builds only: the emulation (L3_CUDA=EMULATED) defines the same functions itself.
#pragma once

#include <string>
#include <vector>

namespace l3::cuda {

// The cuBLAS functions this program forwards, each resolved now: the ones the loaded libraries
// lack, as "library: name: why" (empty when all are there). Throws core::Error (usage) when a
// library cannot be loaded at all, as the first cuBLAS call does.
[[nodiscard]] std::vector<std::string> missing_cublas_symbols();

// Whether cuBLAS is loaded in this process yet (it is not until a cuBLAS call).
[[nodiscard]] bool cublas_loaded() noexcept;

}  // namespace l3::cuda
