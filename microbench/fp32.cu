// FP32 FMA pipe: 16 independent fma.rn.f32 chains per thread (enough ILP to saturate the pipe).
// Work per thread per iteration: 16 FMA = 32 flop.
//
// @work emo_fp32_fma per_iter fp32_flop=32

#define FMA32(x) asm volatile("fma.rn.f32 %0, %0, %1, %2;" : "+f"(x) : "f"(a), "f"(b))

extern "C" __global__ void emo_fp32_fma(float* out, float sentinel, int iters)
{
    const unsigned int tid = blockIdx.x * blockDim.x + threadIdx.x;
    const float a = 0.999f, b = 1e-3f * (float)(tid & 7);
    float x0 = tid, x1 = x0 + 1.f, x2 = x0 + 2.f, x3 = x0 + 3.f, x4 = x0 + 4.f, x5 = x0 + 5.f;
    float x6 = x0 + 6.f, x7 = x0 + 7.f, x8 = x0 + 8.f, x9 = x0 + 9.f, x10 = x0 + 10.f;
    float x11 = x0 + 11.f, x12 = x0 + 12.f, x13 = x0 + 13.f, x14 = x0 + 14.f, x15 = x0 + 15.f;
    for (int i = 0; i < iters; ++i) {
        FMA32(x0); FMA32(x1); FMA32(x2); FMA32(x3); FMA32(x4); FMA32(x5); FMA32(x6); FMA32(x7);
        FMA32(x8); FMA32(x9); FMA32(x10); FMA32(x11); FMA32(x12); FMA32(x13); FMA32(x14); FMA32(x15);
    }
    const float acc = x0 + x1 + x2 + x3 + x4 + x5 + x6 + x7 + x8 + x9 + x10 + x11 + x12 + x13 + x14 + x15;
    if (acc == sentinel) out[tid] = acc;
}
