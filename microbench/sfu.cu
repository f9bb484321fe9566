// Special-function unit (MUFU): 4 sin.approx and 4 cos.approx chains per thread; each stays in
// [-1, 1], so no chain overflows however long it runs.
// Work per thread per iteration: 8 SFU ops.
//
// @work emo_sfu per_iter sfu_op=8

#define SIN(x) asm volatile("sin.approx.ftz.f32 %0, %0;" : "+f"(x))
#define COS(x) asm volatile("cos.approx.ftz.f32 %0, %0;" : "+f"(x))

extern "C" __global__ void emo_sfu(float* out, float sentinel, int iters)
{
    const unsigned int tid = blockIdx.x * blockDim.x + threadIdx.x;
    float x0 = 1e-3f * (float)(tid & 1023), x1 = x0 + 0.1f, x2 = x0 + 0.2f, x3 = x0 + 0.3f;
    float x4 = x0 + 0.4f, x5 = x0 + 0.5f, x6 = x0 + 0.6f, x7 = x0 + 0.7f;
    for (int i = 0; i < iters; ++i) {
        SIN(x0); COS(x1); SIN(x2); COS(x3); SIN(x4); COS(x5); SIN(x6); COS(x7);
    }
    const float acc = x0 + x1 + x2 + x3 + x4 + x5 + x6 + x7;
    if (acc == sentinel) out[tid] = acc;
}
