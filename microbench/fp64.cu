// FP64 pipe: 8 independent fma.rn.f64 chains per thread.
// Work per thread per iteration: 8 DFMA = 16 flop.
//
// @work emo_fp64_fma per_iter fp64_flop=16

#define FMA64(x) asm volatile("fma.rn.f64 %0, %0, %1, %2;" : "+d"(x) : "d"(a), "d"(b))

extern "C" __global__ void emo_fp64_fma(float* out, float sentinel, int iters)
{
    const unsigned int tid = blockIdx.x * blockDim.x + threadIdx.x;
    const double a = 0.999, b = 1e-3 * (double)(tid & 7);
    double x0 = tid, x1 = x0 + 1.0, x2 = x0 + 2.0, x3 = x0 + 3.0;
    double x4 = x0 + 4.0, x5 = x0 + 5.0, x6 = x0 + 6.0, x7 = x0 + 7.0;
    for (int i = 0; i < iters; ++i) {
        FMA64(x0); FMA64(x1); FMA64(x2); FMA64(x3); FMA64(x4); FMA64(x5); FMA64(x6); FMA64(x7);
    }
    const float acc = (float)(x0 + x1 + x2 + x3 + x4 + x5 + x6 + x7);
    if (acc == sentinel) out[tid] = acc;
}
