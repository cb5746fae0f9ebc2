// Launchers of probe_kernels.cu (host code; synchronous in the emulation).
#pragma once

namespace l3::emulation_probe {

// out[b] = sum of in[b * threads, (b + 1) * threads) through device_utils' block_sum
void block_sums(float* out, const float* in, int blocks, int threads);
// the same, with the barrier between shared writes and reads missing
void racy_sums(float* out, const float* in, int blocks, int threads);
// a __syncthreads reached by half of a 64-thread block
void divergent_barrier(float* out);
// a __syncthreads after one thread of the block returned
void barrier_after_exit(float* out);
// a full-mask warp sum after lane 5 returned
void shuffle_with_exited_lane(float* out);
// out[t] = (lane ^ 3) * 10 by __shfl_xor_sync
void shuffle_partner(int* out, int threads);
// out[i] = in[i] for i < 8 bf16 values, read as one Bf16x8 from `in` (16-byte aligned or not)
void vector_copy(void* out, const void* in);
// out = the block's dynamic shared memory, never written
void dynamic_shared(float* out, int blocks, int threads);
// order[b] = the rank of block b in execution order
void block_order(int* order, int* counter, int blocks);
// out[block * per_block + thread] = block * 1000 + thread, linear indices over a 2D grid and 3D
// blocks
void indices(int* out, unsigned int grid_x, unsigned int grid_y, unsigned int bx, unsigned int by,
             unsigned int bz);

}  // namespace l3::emulation_probe
