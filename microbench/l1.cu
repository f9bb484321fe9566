// L1 cache: every block reads the same 16 KiB of global memory with ld.global.ca (cache at all
// levels), so after the first touch every load hits in the SM's L1.
// Work per thread per iteration: 8 x 16 B = 128 L1 bytes, 8 fp32 adds. n4 must be a power of two:
// the index wraps with a 32-bit mask. (A 64-bit `% n4` compiled to a division sequence that kept
// the ALU and XU pipes busier than L1: on an H200, 39 % of L1's peak and the XU the busiest unit.)
//
// @work emo_l1 per_iter l1_bytes=128 fp32_flop=8

extern "C" __global__ void emo_l1(const float4* buf, unsigned long long n4, float* out, float sentinel, int iters)
{
    const unsigned mask = (unsigned)n4 - 1u;
    float acc = 0.f;
    for (int i = 0; i < iters; ++i) {
#pragma unroll
        for (int u = 0; u < 8; ++u) {
            const unsigned idx = (threadIdx.x + 32u * (unsigned)(8 * i + u)) & mask;
            float v[4]; // a whole float4 is loaded; only v[0] is folded in
            asm volatile("ld.global.ca.v4.f32 {%0, %1, %2, %3}, [%4];"
                         : "=f"(v[0]), "=f"(v[1]), "=f"(v[2]), "=f"(v[3]) : "l"(buf + idx));
            acc += v[0];
        }
    }
    if (acc == sentinel) out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
}
