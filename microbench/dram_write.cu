// DRAM write: the grid streams once through a buffer far larger than L2 with st.global.cs
// (evict-first), coalesced; the stores are the side effect, so nothing can be elided.
// Work per thread per iteration: 4 x 16 B = 64 DRAM bytes written.
//
// @work emo_dram_write per_iter dram_write_bytes=64

extern "C" __global__ void emo_dram_write(float4* buf, unsigned long long n4, int iters)
{
    const unsigned long long tid = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    const unsigned long long threads = (unsigned long long)gridDim.x * blockDim.x;
    const float v = (float)tid;
    for (int i = 0; i < iters; ++i) {
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const unsigned long long idx = ((unsigned long long)(4 * i + u) * threads + tid) % n4;
            asm volatile("st.global.cs.v4.f32 [%0], {%1, %2, %3, %4};"
                         ::"l"(buf + idx), "f"(v), "f"(v), "f"(v), "f"(v) : "memory");
        }
    }
}
