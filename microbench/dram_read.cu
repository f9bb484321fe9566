// DRAM read: the grid streams once through a buffer far larger than L2 (ld.global.cs, evict-first),
// coalesced; every byte is read exactly once per launch, so every load misses L2.
// Work per thread per iteration: 4 x 16 B = 64 DRAM bytes read, 4 fp32 adds.
//
// @work emo_dram_read per_iter dram_read_bytes=64 fp32_flop=4

extern "C" __global__ void emo_dram_read(const float4* buf, unsigned long long n4, float* out, float sentinel, int iters)
{
    const unsigned long long tid = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    const unsigned long long threads = (unsigned long long)gridDim.x * blockDim.x;
    float acc = 0.f;
    for (int i = 0; i < iters; ++i) {
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const unsigned long long idx = ((unsigned long long)(4 * i + u) * threads + tid) % n4;
            float v[4]; // a whole float4 is loaded; only v[0] is folded in
            asm volatile("ld.global.cs.v4.f32 {%0, %1, %2, %3}, [%4];"
                         : "=f"(v[0]), "=f"(v[1]), "=f"(v[2]), "=f"(v[3]) : "l"(buf + idx));
            acc += v[0];
        }
    }
    if (acc == sentinel) out[tid] = acc;
}
