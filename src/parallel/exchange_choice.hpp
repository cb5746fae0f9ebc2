// How the gradient reduction and the weight all-gather travel (--grad-exchange).
#pragma once

#include <cstdint>

namespace l3::parallel {

// `automatic` is NCCL where the backend is CUDA, NCCL is compiled in and every rank has its own
// GPU, else MPI; `mpi_staged` is MPI through host staging buffers even where the buffers are
// host memory (the GPU fallback's code path, for the CPU tests).
enum class ExchangeChoice : std::uint8_t { automatic, mpi, nccl, mpi_staged };

}  // namespace l3::parallel
