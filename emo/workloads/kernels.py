"""Kernel specs of a transformer step: the names PyTorch, cuBLAS, flash-attention and friends show in
a profiler on each GPU family, and Work vectors derived from the tensor shapes.

Work follows the roofline view of each kernel: GEMMs and attention count their tensor-core FLOPs and
the bytes their tiles pull through L2 and DRAM; norms, elementwise ops and the optimizer are DRAM
streams. `active_warps` is the achieved occupancy a profiler reports (fraction of warp slots), with
wave quantisation for grids smaller than the GPU. All factories are cached: the same shape yields
the same KernelSpec object, so building a program with many launches stays cheap.
"""
from __future__ import annotations

import math
from dataclasses import replace
from functools import lru_cache

from emo.device.sim.program import KernelSpec, Work
from emo.workloads.arch import Arch

ELT = 2  # bytes per bf16/fp16 element


def _ctype(dtype: str) -> str:
    return "c10::BFloat16" if dtype == "bf16" else "c10::Half"


def _cutlass_t(dtype: str) -> str:
    return "cutlass::bfloat16_t" if dtype == "bf16" else "cutlass::half_t"


def _occupancy(arch: Arch, ctas: int, warps_per_cta: int, ctas_per_sm: int) -> float:
    """Achieved occupancy: resident warps over warp slots, averaged over the waves of the grid."""
    per_wave = arch.sms * ctas_per_sm
    waves = max(1, math.ceil(ctas / per_wave))
    fill = ctas / (waves * per_wave)  # the tail wave leaves SMs empty
    return min(1.0, warps_per_cta * ctas_per_sm / arch.warps_per_sm * fill)


def _grid_1d(n_items: int, per_block: int) -> tuple[int, int, int]:
    return (max(1, math.ceil(n_items / per_block)), 1, 1)


# --------------------------------------------------------------------------- GEMM
def _gemm_tile(arch: Arch, m: int, n: int) -> tuple[int, int, str]:
    """The tile cuBLAS heuristics pick, roughly: big tiles for big outputs, small ones for skinny."""
    if m < 64:  # decode: a weight stream, many small CTAs
        return (64, 64, "64x5") if arch.family != "hopper" else (64, 128, "1x1x1")
    if m * n >= 4096 * 4096:
        return (256, 128, "64x3") if arch.family != "hopper" else (128, 256, "2x1x1")
    if m * n >= 512 * 512:
        return (128, 128, "32x5") if arch.family != "hopper" else (128, 128, "1x1x1")
    return (64, 64, "64x5") if arch.family != "hopper" else (64, 128, "1x1x1")


def _gemm_name(arch: Arch, dtype: str, m: int, n: int, layout: str) -> str:
    tm, tn, extra = _gemm_tile(arch, m, n)
    if arch.family == "hopper":
        return (f"sm90_xmma_gemm_{dtype}{dtype}_{dtype}f32_f32_{layout}_n_tilesize{tm}x{tn}x64_"
                f"warpgroupsize{extra}_execute_segment_k_off_kernel__5x_cublas")
    if arch.family == "volta":
        return f"volta_fp16_s884gemm_fp16_{tm}x{tn}_ldg8_f2f_{layout}"
    if m < 64 and arch.family == "ampere":  # decode-sized GEMMs go to cutlass wmma kernels
        k = f"cutlass_{arch.sm}_wmma_tensorop_{dtype}_s161616gemm_{dtype}_16x16_128x1_{layout}_align8"
        return f"void cutlass::Kernel2<{k}>({k}::Params)"
    sliced = "_sliced1x2" if tm == 64 else ""
    return f"ampere_{dtype}_s16816gemm_{dtype}_{tm}x{tn}{sliced}_ldg8_f2f_stages_{extra}_{layout}"


@lru_cache(maxsize=None)
def gemm(arch: Arch, dtype: str, m: int, n: int, k: int, layout: str = "tn", op: str = "aten::mm") -> KernelSpec:
    """C[m,n] = A[m,k] · B[k,n] on tensor cores. layout: "tn" forward (x·Wᵀ), "nn" data-gradient
    (dy·W), "nt" weight-gradient (dyᵀ·x)."""
    tm, tn, _ = _gemm_tile(arch, m, n)
    ctas = math.ceil(m / tm) * math.ceil(n / tn)
    # skinny (decode) GEMMs: cuBLAS splits K so the weight stream keeps every SM busy
    split_k = max(1, min(k // 256, math.ceil(2 * arch.sms / ctas))) if m < 64 else 1
    a, b, c = m * k * ELT, k * n * ELT, m * n * ELT
    flops = 2.0 * m * n * k
    # Each A tile is re-read once per column of tiles and each B tile once per row of tiles, through
    # L2; DRAM sees the unique operands plus re-fetches once they stop fitting in L2.
    l2 = a * math.ceil(n / tn) + b * math.ceil(m / tm) + c
    spill = 1.0 + 0.25 * min(4.0, (a + b) / arch.l2_bytes)
    read = (a + b) * spill + (c if op == "aten::addmm" else 0)  # addmm reads the broadcast bias (small) / accumulator
    work = Work(
        fp16_tensor_flop=flops,
        fp32_flop=2.0 * m * n,  # epilogue: alpha/beta scaling, conversion
        int_op=flops / 256,  # address arithmetic of the main loop
        shared_bytes=flops / 32,  # 64x64 warp tiles: (64+64) elements per 2·64·64 FLOPs
        l2_bytes=l2,
        dram_read_bytes=read,
        dram_write_bytes=c,
        active_warps=_occupancy(arch, ctas * split_k, 8, 1 if tm * tn >= 128 * 128 else 4),
        min_ns=3000.0,
    )
    grid = (math.ceil(n / tn), math.ceil(m / tm), split_k)
    return KernelSpec(_gemm_name(arch, dtype, m, n, layout), work, op, grid, (256, 1, 1))


# --------------------------------------------------------------------------- attention
def _flash_traits(dtype: str, d: int, bwd: bool) -> str:
    t = _cutlass_t(dtype)
    if bwd:
        return (f"pytorch_flash::Flash_bwd_kernel_traits<{d}, 64, 128, 8, 2, 4, 2, false, false, {t}, "
                f"pytorch_flash::Flash_kernel_traits<{d}, 64, 128, 8, {t}> >")
    return (f"pytorch_flash::Flash_fwd_kernel_traits<{d}, 128, 64, 4, false, false, {t}, "
            f"pytorch_flash::Flash_kernel_traits<{d}, 128, 64, 4, {t}> >")


@lru_cache(maxsize=None)
def attention_fwd(arch: Arch, dtype: str, batch: int, heads: int, seq: int, d: int) -> KernelSpec:
    """Causal self-attention forward (flash-attention 2 via SDPA; cutlass mem-efficient on Volta)."""
    pairs = batch * heads * seq * seq / 2  # causal: half the score matrix
    qkvo = 4 * batch * heads * seq * d * ELT
    ctas = batch * heads * math.ceil(seq / 128)
    work = Work(
        fp16_tensor_flop=4.0 * pairs * d,  # QKᵀ and PV
        fp32_flop=4.0 * pairs,  # scaling, running max, rescale
        sfu_op=pairs,  # exp
        shared_bytes=pairs * d * ELT * 2 / 64,
        l2_bytes=qkvo + 2 * batch * heads * seq * d * ELT * math.ceil(seq / 128) / 2,
        dram_read_bytes=3 * batch * heads * seq * d * ELT,
        dram_write_bytes=batch * heads * seq * (d * ELT + 4),  # O and the logsumexp
        active_warps=_occupancy(arch, ctas, 4, 2),
        min_ns=4000.0,
    )
    if arch.family == "volta":
        name = ("fmha_cutlassF_f16_aligned_64x64_rf_sm70(PyTorchMemEffAttention::AttentionKernel<cutlass::half_t, "
                "cutlass::arch::Sm70, true, 64, 64, 64, true, true>::Params)")
        return KernelSpec(name, work, "aten::_efficient_attention_forward", (math.ceil(seq / 64), heads, batch), (128, 1, 1))
    name = (f"void pytorch_flash::flash_fwd_kernel<{_flash_traits(dtype, d, False)}, false, true, false, false, "
            f"true, true, false, false>(pytorch_flash::Flash_fwd_params)")
    return KernelSpec(name, work, "aten::_flash_attention_forward", (math.ceil(seq / 128), batch, heads), (128, 1, 1))


@lru_cache(maxsize=None)
def attention_bwd(arch: Arch, dtype: str, batch: int, heads: int, seq: int, d: int) -> tuple[KernelSpec, ...]:
    """Causal attention backward: flash-attention 2 launches dot(dO,O), the dq/dk/dv main loop and
    the dq conversion; Volta's mem-efficient kernel does it in one."""
    pairs = batch * heads * seq * seq / 2
    tensor = batch * heads * seq * d * ELT
    main = Work(
        fp16_tensor_flop=10.0 * pairs * d,  # recompute QKᵀ, dV, dP, dQ, dK
        fp32_flop=6.0 * pairs,
        sfu_op=pairs,
        shared_bytes=pairs * d * ELT * 5 / 64,
        l2_bytes=4 * tensor * math.ceil(seq / 128) / 2 + 4 * batch * heads * seq * d * math.ceil(seq / 128) / 2,
        dram_read_bytes=5 * tensor,  # q, k, v, o, do
        dram_write_bytes=2 * tensor + batch * heads * seq * d * 4,  # dk, dv and the fp32 dq accumulator
        active_warps=_occupancy(arch, batch * heads * math.ceil(seq / 128), 8, 1),
        min_ns=5000.0,
    )
    if arch.family == "volta":
        name = ("fmha_cutlassB_f16_aligned_64x64_k128_sm70(PyTorchMemEffAttention::AttentionBackwardKernel<"
                "cutlass::arch::Sm70, cutlass::half_t, true, false, true, 64, 64, 128>::Params)")
        return (KernelSpec(name, main, "aten::_efficient_attention_backward", (heads, batch, 1), (256, 1, 1)),)
    traits = _flash_traits(dtype, d, True)
    rows = batch * heads * seq
    dot = Work(fp32_flop=2.0 * rows * d, dram_read_bytes=2 * tensor, dram_write_bytes=rows * 4 + rows * d * 4,
               l2_bytes=2 * tensor, active_warps=0.5, min_ns=3000.0)
    conv = Work(fp32_flop=rows * d, dram_read_bytes=rows * d * 4, dram_write_bytes=tensor,
                l2_bytes=rows * d * 4, active_warps=0.5, min_ns=3000.0)
    op = "aten::_flash_attention_backward"
    return (
        KernelSpec(f"void pytorch_flash::flash_bwd_dot_do_o_kernel<true, {traits}>(pytorch_flash::Flash_bwd_params)",
                   dot, op, (math.ceil(seq / 128), batch, heads), (256, 1, 1)),
        KernelSpec(f"void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<{traits}, true, false, false, "
                   f"false, false, false, false>(pytorch_flash::Flash_bwd_params)",
                   main, op, (math.ceil(seq / 128), batch, heads), (256, 1, 1)),
        KernelSpec(f"void pytorch_flash::flash_bwd_convert_dq_kernel<{traits}>(pytorch_flash::Flash_bwd_params, int)",
                   conv, op, (math.ceil(seq / 128), batch, heads), (256, 1, 1)),
    )


@lru_cache(maxsize=None)
def attention_decode(arch: Arch, dtype: str, batch: int, heads: int, ctx: int, d: int) -> tuple[KernelSpec, ...]:
    """One new token per sequence against a KV cache of `ctx` tokens: split-KV flash decoding
    (a DRAM stream over the cache) plus the combine of the splits."""
    per_wave = arch.sms * 4  # small CTAs, four resident per SM
    splits = max(1, min(16, math.ceil(ctx / 128), round(per_wave / (batch * heads))))
    kv = 2 * batch * heads * ctx * d * ELT
    main = Work(fp16_tensor_flop=4.0 * batch * heads * ctx * d, fp32_flop=4.0 * batch * heads * ctx,
                sfu_op=batch * heads * ctx, l2_bytes=kv, dram_read_bytes=kv,
                dram_write_bytes=batch * heads * splits * (d + 1) * 4,
                active_warps=_occupancy(arch, batch * heads * splits, 4, 4), min_ns=4000.0)
    comb = Work(fp32_flop=3.0 * batch * heads * splits * d, dram_read_bytes=batch * heads * splits * (d + 1) * 4,
                dram_write_bytes=batch * heads * d * ELT, active_warps=0.05, min_ns=2500.0)
    traits = (f"pytorch_flash::Flash_fwd_kernel_traits<{d}, 64, 128, 4, false, false, {_cutlass_t(dtype)}, "
              f"pytorch_flash::Flash_kernel_traits<{d}, 64, 128, 4, {_cutlass_t(dtype)}> >")
    op = "aten::_flash_attention_forward"
    return (
        KernelSpec(f"void pytorch_flash::flash_fwd_splitkv_kernel<{traits}, true, false, false, false, true, true, "
                   f"false, false>(pytorch_flash::Flash_fwd_params)", main, op, (1, batch * heads, splits), (128, 1, 1)),
        KernelSpec(f"void pytorch_flash::flash_fwd_splitkv_combine_kernel<{traits}, 4, 4, false>"
                   f"(pytorch_flash::Flash_fwd_params)", comb, op, (max(1, batch * heads // 4), 1, 1), (128, 1, 1)),
    )


# --------------------------------------------------------------------------- norms and elementwise
def _stream(arch: Arch, n: int, read: float, write: float, flop: float, sfu: float = 0.0,
            threads_per_item: float = 0.25) -> Work:
    """A DRAM-bound kernel over n elements (vectorised by 4: a quarter thread per element)."""
    ctas = max(1, math.ceil(n * threads_per_item / 128))
    return Work(fp32_flop=flop, sfu_op=sfu, l2_bytes=read + write, dram_read_bytes=read, dram_write_bytes=write,
                active_warps=_occupancy(arch, ctas, 4, 16), min_ns=2000.0)


@lru_cache(maxsize=None)
def layer_norm_fwd(arch: Arch, dtype: str, rows: int, hidden: int) -> KernelSpec:
    n = rows * hidden
    t = _ctype(dtype)
    name = (f"void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<{t}, float>(int, float, {t} const*, "
            f"{t} const*, {t} const*, float*, float*, {t}*)")
    work = _stream(arch, n, n * ELT + 2 * hidden * ELT, n * ELT + rows * 8, 8.0 * n, sfu=rows, threads_per_item=1 / 8)
    return KernelSpec(name, work, "aten::native_layer_norm", (rows, 1, 1), (128, 1, 1))


@lru_cache(maxsize=None)
def layer_norm_bwd(arch: Arch, dtype: str, rows: int, hidden: int) -> tuple[KernelSpec, KernelSpec]:
    n = rows * hidden
    t = _ctype(dtype)
    op = "aten::native_layer_norm_backward"
    gi = KernelSpec(
        f"void at::native::(anonymous namespace)::layer_norm_grad_input_kernel_vectorized<{t}, float>({t} const*, "
        f"{t} const*, float const*, float const*, {t} const*, {t}*, int)",
        _stream(arch, n, 2 * n * ELT + rows * 8, n * ELT, 10.0 * n, threads_per_item=1 / 8), op, (rows, 1, 1), (128, 1, 1))
    gb = KernelSpec(
        f"void at::native::(anonymous namespace)::GammaBetaBackwardCUDAKernel<{t}, float>(long, long, {t} const*, "
        f"{t} const*, float const*, float const*, {t}*, {t}*)",
        _stream(arch, n, 2 * n * ELT + rows * 8, 2 * hidden * ELT, 4.0 * n, threads_per_item=1 / 16),
        op, (math.ceil(hidden / 32), 1, 1), (32, 32, 1))
    return gi, gb


@lru_cache(maxsize=None)
def rms_norm(arch: Arch, dtype: str, rows: int, hidden: int) -> KernelSpec:
    """flashinfer's fused RMSNorm, as inference stacks (KTransformers, vLLM) launch it."""
    t = "__nv_bfloat16" if dtype == "bf16" else "half"
    n = rows * hidden
    name = (f"void flashinfer::norm::RMSNormKernel<8u, {t}>({t}*, {t}*, {t}*, unsigned int, unsigned int, "
            f"unsigned int, float, float)")
    work = _stream(arch, n, n * ELT + hidden * ELT, n * ELT, 4.0 * n, sfu=rows, threads_per_item=1 / 8)
    return KernelSpec(name, work, "flashinfer::rmsnorm", (rows, 1, 1), (min(1024, hidden // 8), 1, 1))


_EW = {  # op -> (functor text, inputs, FLOPs and SFU ops per element)
    "add": ("at::native::CUDAFunctor_add<{t}>", 2, 1, 0, "aten::add"),
    "gelu": ("at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)::{{lambda()#2}}::operator()() "
             "const::{{lambda()#4}}::operator()() const::{{lambda({t})#1}}", 1, 12, 1, "aten::gelu"),
    "gelu_backward": ("at::native::GeluBackwardCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)::{{lambda()#2}}"
                      "::operator()() const::{{lambda()#4}}::operator()() const::{{lambda({t}, {t})#1}}", 2, 20, 1,
                      "aten::gelu_backward"),
    "dropout_backward": ("at::native::(anonymous namespace)::masked_scale_kernel<bool, {t}, float>(at::Tensor&, "
                         "at::Tensor const&, at::Tensor const&, float)::{{lambda({t}, bool)#1}}", 2, 1, 0,
                         "aten::native_dropout_backward"),
    "mul": ("at::native::binary_internal::MulFunctor<{t}>", 2, 1, 0, "aten::mul"),
    "silu_mul": ("at::native::silu_kernel(at::TensorIteratorBase&)::{{lambda()#1}}::operator()() const::{{lambda()#4}}"
                 "::operator()() const::{{lambda({t})#1}}", 1, 6, 1, "aten::silu"),
    "rotary": ("at::native::BinaryFunctor<{t}, {t}, {t}, at::native::binary_internal::MulFunctor<float> >", 2, 6, 0,
               "aten::mul"),
    "copy": ("at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{{lambda()#3}}::operator()() const::"
             "{{lambda()#7}}::operator()() const::{{lambda({t})#1}}", 1, 0, 0, "aten::copy_"),
    "softmax_grad": ("at::native::(anonymous namespace)::CUDAFunctor_sub<{t}>", 2, 2, 1,
                     "aten::_log_softmax_backward_data"),
}


@lru_cache(maxsize=None)
def elementwise(arch: Arch, dtype: str, kind: str, n: int) -> KernelSpec:
    """A vectorised TensorIterator kernel (at::native::vectorized_elementwise_kernel<4, ...>)."""
    functor, inputs, flop, sfu, op = _EW[kind]
    f = functor.format(t=_ctype(dtype))
    arrays = inputs + 1
    name = (f"void at::native::vectorized_elementwise_kernel<4, {f}, at::detail::Array<char*, {arrays}> >(int, {f}, "
            f"at::detail::Array<char*, {arrays}>)")
    work = _stream(arch, n, inputs * n * ELT, n * ELT, float(flop * n), sfu=float(sfu * n))
    return KernelSpec(name, work, op, _grid_1d(n, 512), (128, 1, 1))


@lru_cache(maxsize=None)
def dropout(arch: Arch, dtype: str, n: int) -> KernelSpec:
    t = _ctype(dtype)
    name = (f"void at::native::(anonymous namespace)::fused_dropout_kernel_vec<{t}, float, unsigned int, 1, 4, bool>("
            f"at::cuda::detail::TensorInfo<{t}, unsigned int>, at::cuda::detail::TensorInfo<{t}, unsigned int>, "
            f"at::cuda::detail::TensorInfo<bool, unsigned int>, unsigned int, float, at::PhiloxCudaState)")
    work = replace(_stream(arch, n, n * ELT, n * ELT + n, 3.0 * n), int_op=10.0 * n)  # Philox random numbers
    return KernelSpec(name, work, "aten::native_dropout", _grid_1d(n, 1024), (256, 1, 1))


@lru_cache(maxsize=None)
def bias_grad(arch: Arch, dtype: str, rows: int, cols: int) -> KernelSpec:
    """Sum of the output gradient over tokens (aten::sum for a Linear's bias)."""
    t = _ctype(dtype)
    ro = (f"at::native::ReduceOp<{t}, at::native::func_wrapper_t<{t}, at::native::sum_functor<{t}, float, {t}>::"
          f"operator()(at::TensorIterator&)::{{lambda(float, float)#1}}>, unsigned int, {t}, 4>")
    n = rows * cols
    work = _stream(arch, n, n * ELT, cols * ELT, float(n), threads_per_item=1 / 16)
    return KernelSpec(f"void at::native::reduce_kernel<512, 1, {ro} >({ro})", work, "aten::sum",
                      (math.ceil(cols / 32), 16, 1), (32, 16, 1))


@lru_cache(maxsize=None)
def row_reduce(arch: Arch, kind: str, rows: int, cols: int, in_bytes: int = ELT) -> KernelSpec:
    """Per-row max / sum-exp / argmax over logits (vocab-parallel cross entropy, sampling)."""
    fn = {"max": ("MaxOps<float>", "aten::max"), "sumexp": ("sum_functor<float, float, float>", "aten::sum"),
          "argmax": ("ArgMaxOps<float>", "aten::argmax")}[kind]
    ro = f"at::native::ReduceOp<float, at::native::{fn[0]}, unsigned int, float, 4>"
    n = rows * cols
    work = _stream(arch, n, n * in_bytes, rows * 8, 2.0 * n, sfu=float(n) if kind == "sumexp" else 0.0,
                   threads_per_item=1 / 16)
    return KernelSpec(f"void at::native::reduce_kernel<512, 1, {ro} >({ro})", work, fn[1], (rows, 1, 1), (512, 1, 1))


@lru_cache(maxsize=None)
def log_softmax_fwd(arch: Arch, dtype: str, rows: int, cols: int) -> KernelSpec:
    t = _ctype(dtype)
    n = rows * cols
    name = (f"void at::native::(anonymous namespace)::cunn_SoftMaxForward<8, {t}, float, float, "
            f"at::native::(anonymous namespace)::LogSoftMaxForwardEpilogue>(float*, {t} const*, int)")
    return KernelSpec(name, _stream(arch, n, 2 * n * ELT, n * 4, 4.0 * n, sfu=float(n), threads_per_item=1 / 8),
                      "aten::_log_softmax", (rows, 1, 1), (1024, 1, 1))


@lru_cache(maxsize=None)
def nll_loss(arch: Arch, rows: int, backward: bool = False) -> KernelSpec:
    if backward:
        name = ("void at::native::(anonymous namespace)::nll_loss_backward_reduce_cuda_kernel_2d<float, long>(float*, "
                "float const*, long const*, float const*, float const*, bool, int, int, long, long)")
        op = "aten::nll_loss_backward"
    else:
        name = ("void at::native::(anonymous namespace)::nll_loss_forward_reduce_cuda_kernel_2d<float, float, long>("
                "float*, float*, float const*, long const*, float const*, bool, long, long, long, long)")
        op = "aten::nll_loss_forward"
    work = Work(fp32_flop=2.0 * rows, dram_read_bytes=rows * 12.0, dram_write_bytes=8.0, active_warps=0.01, min_ns=3000.0)
    return KernelSpec(name, work, op, (1, 1, 1), (1024, 1, 1))


# --------------------------------------------------------------------------- embedding
@lru_cache(maxsize=None)
def embedding_fwd(arch: Arch, dtype: str, tokens: int, hidden: int) -> KernelSpec:
    t = _ctype(dtype)
    name = (f"void at::native::(anonymous namespace)::indexSelectLargeIndex<{t}, long, unsigned int, 2, 2, -2, true>("
            f"at::cuda::detail::TensorInfo<{t}, unsigned int>, at::cuda::detail::TensorInfo<{t} const, unsigned int>, "
            f"at::cuda::detail::TensorInfo<long const, unsigned int>, int, int, unsigned int, unsigned int, long)")
    n = tokens * hidden
    work = _stream(arch, n, n * ELT + tokens * 8, n * ELT, 0.0)
    work = replace(work, int_op=4.0 * n)
    return KernelSpec(name, work, "aten::index_select", _grid_1d(n, 512), (128, 1, 1))


@lru_cache(maxsize=None)
def embedding_bwd(arch: Arch, dtype: str, tokens: int, hidden: int) -> tuple[KernelSpec, KernelSpec]:
    t = _ctype(dtype)
    n = tokens * hidden
    op = "aten::embedding_dense_backward"
    cg = KernelSpec(
        f"void at::native::(anonymous namespace)::compute_grad_weight<{t}, float, long>(long const*, {t} const*, "
        f"long const*, long, long, long const*, long const*, at::AccumulateType<{t}, true>::type*)",
        _stream(arch, n, n * ELT + tokens * 16, n * 4, float(n)), op, _grid_1d(n, 512), (128, 1, 1))
    ss = KernelSpec(
        f"void at::native::(anonymous namespace)::sum_and_scatter<{t}, float, long>(long const*, {t}*, long, "
        f"long const*, long const*, at::AccumulateType<{t}, true>::type const*, long const*, long, long)",
        _stream(arch, n, n * 4 + tokens * 16, n * ELT, float(n)), op, _grid_1d(n, 512), (128, 1, 1))
    return cg, ss


# --------------------------------------------------------------------------- optimizer
ADAM_CHUNK = 65536  # elements per block of multi_tensor_apply
ADAM_BLOCKS = 320  # blocks per launch


def multi_tensor_launches(params: int) -> list[int]:
    """Elements each multi_tensor_apply launch covers for `params` elements (320 chunks per launch)."""
    per_launch = ADAM_CHUNK * ADAM_BLOCKS
    full, rest = divmod(params, per_launch)
    return [per_launch] * full + ([rest] if rest else [])


@lru_cache(maxsize=None)
def adam(arch: Arch, elements: int) -> KernelSpec:
    """torch.optim.AdamW(fused=True) over fp32 params, grads and moments: 16 B read, 12 B written per
    element, ~15 FLOPs and a sqrt."""
    fn = "at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4, (at::native::ADAM_MODE)1, false>"
    md = "at::native::(anonymous namespace)::FusedOptimizerTensorListMetadata<4>"
    args = "double*, double, double, double, double, double, bool, bool*, bool*"
    name = f"void at::native::(anonymous namespace)::multi_tensor_apply_kernel<{md}, {fn}, {args}>({md}, {fn}, {args})"
    work = _stream(arch, elements, 16.0 * elements, 12.0 * elements, 15.0 * elements, sfu=float(elements))
    blocks = max(1, math.ceil(elements / ADAM_CHUNK))
    work = replace(work, active_warps=_occupancy(arch, blocks, 16, 2))
    return KernelSpec(name, work, "aten::_fused_adamw_", (blocks, 1, 1), (512, 1, 1))


@lru_cache(maxsize=None)
def grad_norm(arch: Arch, elements: int) -> KernelSpec:
    """torch.nn.utils.clip_grad_norm_: _foreach_norm over the fp32 gradients."""
    fn = "at::native::(anonymous namespace)::LpNormFunctor<float, (at::native::(anonymous namespace)::NormType)1, float, float>"
    md = "at::native::(anonymous namespace)::TensorListMetadata<1>"
    name = f"void at::native::(anonymous namespace)::multi_tensor_apply_kernel<{md}, {fn}, float*, int>({md}, {fn}, float*, int)"
    work = _stream(arch, elements, 4.0 * elements, 4096.0, 2.0 * elements)
    blocks = max(1, math.ceil(elements / ADAM_CHUNK))
    work = replace(work, active_warps=_occupancy(arch, blocks, 16, 2))
    return KernelSpec(name, work, "aten::_foreach_norm", (blocks, 1, 1), (512, 1, 1))


@lru_cache(maxsize=None)
def grad_norm_cleanup(arch: Arch) -> KernelSpec:
    name = ("void at::native::(anonymous namespace)::lpnorm_cleanup<float, (at::native::(anonymous namespace)::NormType)1, "
            "float, float>(float const*, at::native::(anonymous namespace)::TensorListAddresses, int)")
    return KernelSpec(name, Work(fp32_flop=4096.0, sfu_op=1.0, dram_read_bytes=16384.0, dram_write_bytes=4.0,
                                 active_warps=0.005, min_ns=2500.0), "aten::_foreach_norm", (1, 1, 1), (512, 1, 1))


# --------------------------------------------------------------------------- MoE router
@lru_cache(maxsize=None)
def topk(arch: Arch, rows: int, cols: int, k: int) -> tuple[KernelSpec, KernelSpec]:
    """Router: softmax over experts, then top-k selection."""
    sm = KernelSpec(
        "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, "
        "at::native::(anonymous namespace)::SoftMaxForwardEpilogue>(float*, float const*, int)",
        Work(fp32_flop=5.0 * rows * cols, sfu_op=float(rows * cols), dram_read_bytes=rows * cols * 4.0,
             dram_write_bytes=rows * cols * 4.0, active_warps=0.01, min_ns=2500.0),
        "aten::_softmax", (rows, 1, 1), (128, 1, 1))
    tk = KernelSpec(
        "void at::native::sbtopk::gatherTopK<float, unsigned int, 2, false>(at::cuda::detail::TensorInfo<float const, "
        "unsigned int>, unsigned int, unsigned int, bool, unsigned int, unsigned int, at::cuda::detail::TensorInfo<float, "
        "unsigned int>, unsigned int, at::cuda::detail::TensorInfo<long, unsigned int>, unsigned int, float*)",
        Work(fp32_flop=4.0 * rows * cols, int_op=8.0 * rows * cols, dram_read_bytes=rows * cols * 4.0,
             dram_write_bytes=rows * k * 12.0, active_warps=0.01, min_ns=3500.0),
        "aten::topk", (rows, 1, 1), (1024, 1, 1))
    return sm, tk
