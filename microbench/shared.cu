// Shared memory: each thread reads 8 float4 per iteration from an 8 KiB tile (ld.shared.v4, asm
// volatile so no load is hoisted or elided; consecutive lanes read consecutive float4, so no bank
// conflicts). One fp32 add per load folds the data into a result.
// Work per thread per iteration: 8 x 16 B = 128 shared bytes, 8 fp32 adds.
//
// @work emo_shared per_iter shared_bytes=128 fp32_flop=8

#define TILE_FLOAT4 512 /* 8 KiB */

extern "C" __global__ void emo_shared(float* out, float sentinel, int iters)
{
    __shared__ float4 tile[TILE_FLOAT4];
    for (int k = threadIdx.x; k < TILE_FLOAT4; k += blockDim.x) {
        tile[k].x = (float)k; tile[k].y = (float)(k + 1); tile[k].z = (float)(k + 2); tile[k].w = (float)(k + 3);
    }
    __syncthreads();
    unsigned long long base;
    asm("cvta.to.shared.u64 %0, %1;" : "=l"(base) : "l"(tile));
    float acc = 0.f;
    for (int i = 0; i < iters; ++i) {
#pragma unroll
        for (int u = 0; u < 8; ++u) {
            const unsigned int idx = (threadIdx.x + 32u * (unsigned int)(8 * i + u)) & (TILE_FLOAT4 - 1);
            float v[4]; // a whole float4 is loaded; only v[0] is folded in
            asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
                         : "=f"(v[0]), "=f"(v[1]), "=f"(v[2]), "=f"(v[3]) : "l"(base + 16ull * idx));
            acc += v[0];
        }
    }
    if (acc == sentinel) out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
}
