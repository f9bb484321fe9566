// INT32 pipe: 8 independent chains, each a mad.lo.u32 and an xor.b32 per iteration
// (asm volatile: the compiler may neither fuse, reorder away nor elide them).
// Work per thread per iteration: 8 x (mad + xor) = 16 integer ops.
//
// @work emo_int32 per_iter int_op=16

#define INT_STEP(x, k)                                                      \
    asm volatile("mad.lo.u32 %0, %0, %1, %2;" : "+r"(x) : "r"(k), "r"(i)); \
    asm volatile("xor.b32 %0, %0, %1;" : "+r"(x) : "r"(k))

extern "C" __global__ void emo_int32(float* out, float sentinel, int iters)
{
    const unsigned int tid = blockIdx.x * blockDim.x + threadIdx.x;
    const unsigned int k = 0x9e3779b9u ^ tid;
    unsigned int x0 = tid, x1 = tid + 1, x2 = tid + 2, x3 = tid + 3;
    unsigned int x4 = tid + 4, x5 = tid + 5, x6 = tid + 6, x7 = tid + 7;
    for (unsigned int i = 0; i < (unsigned int)iters; ++i) {
        INT_STEP(x0, k); INT_STEP(x1, k); INT_STEP(x2, k); INT_STEP(x3, k);
        INT_STEP(x4, k); INT_STEP(x5, k); INT_STEP(x6, k); INT_STEP(x7, k);
    }
    const float acc = (float)(x0 ^ x1 ^ x2 ^ x3 ^ x4 ^ x5 ^ x6 ^ x7);
    if (acc == sentinel) out[tid] = acc;
}
