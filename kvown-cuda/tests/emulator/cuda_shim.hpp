// Just enough CUDA C for the allocation kernels to compile as host C++: the qualifiers vanish and
// the launch coordinates are globals that the driver sets before calling a kernel once per
// (block, thread). The kernels use no shared memory, barriers or atomics, so running their
// threads one after another is an exact emulation of a launch.
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
