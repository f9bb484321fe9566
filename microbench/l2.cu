// L2 streaming: the whole grid sweeps a 4 MiB buffer (smaller than the L2 of every supported GPU)
// with ld.global.cg (cache in L2 only, bypass L1), coalesced, so every load is an L2 hit.
// Work per thread per iteration: 4 x 16 B = 64 L2 bytes, 4 fp32 adds.
//
// @work emo_l2 per_iter l2_bytes=64 fp32_flop=4

extern "C" __global__ void emo_l2(const float4* buf, unsigned long long n4, float* out, float sentinel, int iters)
{
    const unsigned long long tid = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    const unsigned long long threads = (unsigned long long)gridDim.x * blockDim.x;
    float acc = 0.f;
    for (int i = 0; i < iters; ++i) {
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const unsigned long long idx = ((unsigned long long)(4 * i + u) * threads + tid) % n4;
            float v[4]; // a whole float4 is loaded; only v[0] is folded in
            asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];"
                         : "=f"(v[0]), "=f"(v[1]), "=f"(v[2]), "=f"(v[3]) : "l"(buf + idx));
            acc += v[0];
        }
    }
    if (acc == sentinel) out[tid] = acc;
}
