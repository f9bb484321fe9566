// Idle with a context held: one warp sleeps on the global timer for `duration_ns`, so the GPU is
// awake (context, clocks locked) but does no work. Its power at each clock is the idle power the
// model adds over the makespan. Wall time is set by the timer, not by the SM clock.
//
// @work emo_idle per_launch min_ns=@duration_ns

extern "C" __global__ void emo_idle(unsigned long long duration_ns, float* out, float sentinel)
{
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        asm volatile("nanosleep.u32 %0;" ::"r"(1000u));
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < duration_ns);
    // Data-dependent write: never taken in practice, but the compiler cannot know.
    if ((float)(t - t0) == sentinel) out[0] = (float)t;
}
