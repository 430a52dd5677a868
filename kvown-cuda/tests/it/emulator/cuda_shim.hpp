// Just enough CUDA C for the kernels in src/kernels/ to compile as host C++: the qualifiers
// vanish, the vector types get CUDA's alignment, and the launch coordinates are globals that
// `launch` sets before calling a kernel once per (block, thread), in order. The kernels use no
// shared memory, barriers or atomics, so running their threads one after another is an exact
// emulation of a launch whose threads write disjoint locations; where several blocks write the
// same location (a repeated padding slot), it gives one of the orders a GPU may pick.
#pragma once

#define __global__
#define __device__
#define __forceinline__ inline

struct Dim3 {
    unsigned int x, y, z;
};

static Dim3 blockIdx = {0, 1, 1};
static Dim3 threadIdx = {0, 1, 1};
static Dim3 blockDim = {1, 1, 1};
static Dim3 gridDim = {1, 1, 1};

// vector_types.h
struct alignas(8) uint2 {
    unsigned int x, y;
};
struct alignas(16) uint4 {
    unsigned int x, y, z, w;
};

// kernel<<<blocks, threads>>>(...) on a one-dimensional grid: `kernel` is a closure calling the
// kernel with its arguments.
template <typename Kernel>
static void launch(unsigned int blocks, unsigned int threads, Kernel kernel) {
    gridDim.x = blocks;
    blockDim.x = threads;
    for (unsigned int block = 0; block < blocks; ++block) {
        for (unsigned int thread = 0; thread < threads; ++thread) {
            blockIdx.x = block;
            threadIdx.x = thread;
            kernel();
        }
    }
}
