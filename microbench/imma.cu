// IMMA (int8 tensor cores, sm_80+): 4 independent accumulators per warp, each a
// mma.sync.m16n8k32 s8 x s8 -> s32 per iteration. Operands are all 1, accumulators grow by 32 per
// MMA and stay far from overflow.
// One m16n8k32 MMA = 2*16*8*32 = 8192 ops per warp = 256 ops per thread.
// Work per thread per iteration: 4 MMA x 256 = 1024 int8 tensor ops.
//
// @work emo_imma_s8 per_iter int8_tensor_op=1024

#define IMMA(d)                                                                            \
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 "                       \
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"         \
                 : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])                          \
                 : "r"(a), "r"(a), "r"(a), "r"(a), "r"(a), "r"(a))

extern "C" __global__ void emo_imma_s8(float* out, float sentinel, int iters)
{
    const unsigned int a = 0x01010101u;
    int d0[4] = {0, 0, 0, 0}, d1[4] = {0, 0, 0, 0}, d2[4] = {0, 0, 0, 0}, d3[4] = {0, 0, 0, 0};
    for (int i = 0; i < iters; ++i) {
        IMMA(d0); IMMA(d1); IMMA(d2); IMMA(d3);
    }
    const float acc = (float)(d0[0] + d1[1] + d2[2] + d3[3]);
    if (acc == sentinel) out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
}
