"""Structure of the synthetic workload programs: events, collectives, schedules, copies, kernels."""

from __future__ import annotations

from collections import defaultdict, deque

import pytest

from emo.device.sim.program import Op, Program
from emo.workloads import build_program
from emo.workloads.pp import one_f_one_b

BLOCKING = {Op.STREAM_SYNC, Op.EVENT_SYNC, Op.DEVICE_SYNC}

CONFIGS = [
    {"kind": "tp"},
    {"kind": "tp", "tp": 4, "chunks": 4},
    {"kind": "tp", "tp": 8, "chunks": 1, "model": {"layers": 2}},
    {"kind": "tp", "tp": 2, "training": False},
    {"kind": "tp", "tp": 4, "overlap": "megatron"},
    {"kind": "pp"},
    {"kind": "pp", "pp": 2, "microbatches": 3},
    {"kind": "pp", "pp": 8, "microbatches": 8, "partition": "parameter"},
    {"kind": "pp", "pp": 4, "microbatches": 5, "partition": "parameter"},
    {"kind": "pp", "pp": 4, "microbatches": 6, "recv": "early"},
    {"kind": "pp", "pp": 8, "microbatches": 9, "recv": "early"},
    {"kind": "hybrid"},
    {"kind": "hybrid", "tp": 4, "pp": 4, "dp": 2, "microbatches": 5, "partition": "parameter"},
    {"kind": "hybrid", "tp": 1, "pp": 2, "dp": 4, "microbatches": 3, "bucket_mb": 5},
    {"kind": "hybrid", "tp": 2, "pp": 4, "dp": 1, "microbatches": 4, "recv": "early"},
    {"kind": "offload", "decode_tokens": 2},
]


@pytest.fixture(
    scope="module", params=CONFIGS, ids=lambda c: "-".join(f"{v}" for v in c.values() if not isinstance(v, dict))
)
def program(request) -> Program:
    return build_program(request.param)


def run_abstract(p: Program) -> None:
    """Execute the program without time: hosts issue in order (blocking where CUDA blocks), streams run
    in order, a WAIT holds its stream until the event's record ran, a collective completes once every
    participant has it at the head of a stream. Fails if anything is left stuck (a deadlock)."""
    host = [0] * p.ranks
    copy_queued = [False] * p.ranks  # a blocking copy was enqueued, the host waits for its stream
    queues: dict[tuple[int, int], deque] = defaultdict(deque)
    done_events: set[int] = set()
    arrived: dict[int, set[int]] = defaultdict(set)

    def drained(r: int, stream: int | None = None) -> bool:
        return all(not q for (rr, s), q in queues.items() if rr == r and (stream is None or s == stream))

    progress = True
    while progress:
        progress = False
        for r in range(p.ranks):  # hosts
            ops = p.ops[r]
            while host[r] < len(ops):
                op = ops[host[r]]
                k = op[0]
                if k == Op.MEMCPY:
                    if not copy_queued[r]:
                        queues[(r, op[1])].append(("copy",))
                        copy_queued[r] = bool(op[4])
                    if copy_queued[r]:
                        if not drained(r, op[1]):
                            break
                        copy_queued[r] = False
                elif k == Op.STREAM_SYNC and not drained(r, op[1]):
                    break
                elif k == Op.DEVICE_SYNC and not drained(r):
                    break
                elif k == Op.EVENT_SYNC and op[1] not in done_events:
                    break
                elif k == Op.LAUNCH:
                    queues[(r, op[1])].append(("kernel",))
                elif k == Op.RECORD:
                    queues[(r, op[2])].append(("record", op[1]))
                elif k == Op.WAIT:
                    queues[(r, op[1])].append(("wait", op[2]))
                elif k == Op.COLLECTIVE:
                    queues[(r, op[1])].append(("coll", op[2]))
                host[r] += 1
                progress = True
        for (r, _s), q in queues.items():  # streams
            while q:
                item = q[0]
                if item[0] == "record":
                    done_events.add(item[1])
                elif item[0] == "wait" and item[1] not in done_events:
                    break
                elif item[0] == "coll":
                    arrived[item[1]].add(r)
                    if not set(p.collectives[item[1]].ranks) <= arrived[item[1]]:
                        break
                q.popleft()
                progress = True
    stuck = {r: p.ops[r][host[r]] for r in range(p.ranks) if host[r] < len(p.ops[r])}
    left = {k: list(q)[:2] for k, q in queues.items() if q}
    assert not stuck and not left, f"deadlock: hosts at {stuck}, streams at {left}"


def test_every_wait_refers_to_an_earlier_record_on_the_same_rank(program: Program) -> None:
    for r, ops in enumerate(program.ops):
        recorded: set[int] = set()
        for op in ops:
            if op[0] == Op.RECORD:
                recorded.add(op[1])
            elif op[0] in (Op.WAIT, Op.EVENT_SYNC):
                ev = op[2] if op[0] == Op.WAIT else op[1]
                assert ev in recorded, f"rank {r}: waits on event {ev} not recorded before"


def test_collectives_are_issued_by_their_participants_in_the_same_order(program: Program) -> None:
    issued: dict[int, list[int]] = defaultdict(list)  # coll id -> ranks that issued it
    order: dict[tuple[str, tuple], dict[int, list[int]]] = defaultdict(lambda: defaultdict(list))
    for r, ops in enumerate(program.ops):
        for op in ops:
            if op[0] == Op.COLLECTIVE:
                cid = op[2]
                spec = program.collectives[cid]
                issued[cid].append(r)
                order[(spec.group, tuple(sorted(spec.ranks)))][r].append(cid)
                assert op[1] in program.streams and program.streams[op[1]] != "compute"
    assert set(issued) == set(range(len(program.collectives)))
    for cid, ranks in issued.items():
        spec = program.collectives[cid]
        assert sorted(ranks) == sorted(spec.ranks), f"collective {cid} {spec}: issued by {ranks}"
        assert spec.nbytes > 0 and len(set(spec.ranks)) == len(spec.ranks)
    for group, per_rank in order.items():
        sequences = list(per_rank.values())
        assert all(s == sequences[0] for s in sequences), f"group {group}: ranks issue in different orders"


def test_program_runs_to_completion_without_deadlock(program: Program) -> None:
    run_abstract(program)


def test_iteration_marker_first_and_scopes_nest(program: Program) -> None:
    for ops in program.ops:
        assert ops[0] == (Op.ITER,) and sum(op[0] == Op.ITER for op in ops) == 1
        depth = 0
        for op in ops:
            depth += op[0] == Op.BEGIN
            depth -= op[0] == Op.END
            assert depth >= 0
        assert depth == 0


def test_every_launch_names_a_kernel_with_work(program: Program) -> None:
    used = {op[2] for ops in program.ops for op in ops if op[0] == Op.LAUNCH}
    assert used == set(range(len(program.kernels)))
    for k in program.kernels:
        w = k.work
        moved = w.dram_read_bytes + w.dram_write_bytes
        assert k.name and k.op_name.startswith(("aten::", "flashinfer::"))
        assert moved > 0 and 0 < w.active_warps <= 1
        if "gemm" in k.name:
            assert w.fp16_tensor_flop > 0


def test_host_runs_ahead_and_ends_with_a_blocking_copy(program: Program) -> None:
    for ops in program.ops:
        cpu = [op[1] for op in ops if op[0] == Op.CPU]
        assert cpu and min(cpu) > 0
        last_sync = [op for op in ops if (op[0] == Op.MEMCPY and op[4]) or op[0] in BLOCKING][-1]
        assert last_sync[0] == Op.MEMCPY and last_sync[2] == "DtoH"


# --------------------------------------------------------------------------- tp
def test_tp_all_reduces_overlap_the_next_chunk() -> None:
    p = build_program({"kind": "tp", "tp": 2, "chunks": 2, "model": {"layers": 1}})
    ops = p.ops[0]
    # after an all-reduce is issued, the compute stream gets more work before anything waits for it
    colls = [i for i, op in enumerate(ops) if op[0] == Op.COLLECTIVE and p.collectives[op[2]].kind == "allreduce"]
    overlapped = 0
    for i in colls:
        done = ops[i + 1]
        assert done[0] == Op.RECORD and done[2] == 20
        j = next(j for j in range(i, len(ops)) if ops[j][0] == Op.WAIT and ops[j][2] == done[1])
        assert ops[j][1] == 7
        overlapped += any(op[0] == Op.LAUNCH and op[1] == 7 for op in ops[i:j])
    assert overlapped >= len(colls) - 2  # all but the last ones of forward/backward hide behind compute
    big = [p.collectives[ops[i][2]] for i in colls if p.collectives[ops[i][2]].dtype == "bf16"]
    assert all(c.ranks == (0, 1) and c.group == "tp" and c.nbytes == 2 * 2048 * 4096 * 2 for c in big)
    # embedding + 2 per layer forward, 2 per layer backward + lm head, per chunk
    assert len(big) == 2 * (1 + 2 + 2 + 1)


def test_megatron_forward_all_reduces_block_and_backward_ones_overlap_weight_gradients() -> None:
    p = build_program({"kind": "tp", "tp": 2, "overlap": "megatron", "model": {"layers": 1}})
    ops = p.ops[0]
    fwd_end = next(i for i, op in enumerate(ops) if op[0] == Op.BEGIN and op[1] == "## backward ##")
    colls = [i for i, op in enumerate(ops) if op[0] == Op.COLLECTIVE and p.collectives[op[2]].dtype == "bf16"]
    between = []
    for i in colls:
        done = ops[i + 1]
        j = next(j for j in range(i, len(ops)) if ops[j][0] == Op.WAIT and ops[j][2] == done[1])
        between.append(sum(op[0] == Op.LAUNCH and op[1] == 7 for op in ops[i:j]))
    fwd = [n for i, n in zip(colls, between) if i < fwd_end]
    bwd = [n for i, n in zip(colls, between) if i > fwd_end]
    assert fwd and all(n == 0 for n in fwd)  # the compute stream waits for each forward all-reduce at once
    assert bwd and all(n > 0 for n in bwd)  # weight-gradient GEMMs run under the input-gradient all-reduce
    assert all(p.collectives[ops[i][2]].nbytes == 4 * 2048 * 4096 * 2 for i in colls)  # the whole batch
    assert len(colls) == 1 + 2 + 2 + 1 and p.meta["chunks"] == 1 and p.meta["overlap"] == "megatron"


def test_tp_kernel_names_follow_the_gpu() -> None:
    names = {
        g: " ".join(k.name for k in build_program({"kind": "tp"}, gpu=g).kernels) for g in ("a100", "h100", "v100")
    }
    assert "ampere_bf16_s16816gemm_bf16" in names["a100"] and "pytorch_flash::flash_fwd_kernel" in names["a100"]
    assert "sm90_xmma_gemm_bf16bf16_bf16f32_f32" in names["h100"]
    assert "volta_fp16_s884gemm_fp16" in names["v100"] and "fmha_cutlassF_f16" in names["v100"]
    assert "c10::Half" in names["v100"] and "BFloat16" not in names["v100"]
    assert "multi_tensor_apply_kernel" in names["a100"] and "vectorized_layer_norm_kernel" in names["a100"]


def test_tp_gemm_work_matches_the_shapes() -> None:
    p = build_program({"kind": "tp", "tp": 2, "chunks": 1, "model": {"layers": 1}})
    ops = p.ops[0]
    first_mm = next(p.kernels[op[2]] for op in ops if op[0] == Op.LAUNCH and p.kernels[op[2]].op_name == "aten::addmm")
    m, h = 4 * 2048, 4096
    assert first_mm.work.fp16_tensor_flop == 2.0 * m * (3 * h // 2) * h  # QKV, column-parallel over 2
    total = sum(p.kernels[op[2]].work.fp16_tensor_flop for op in ops if op[0] == Op.LAUNCH)
    # ~6 FLOPs per matmul parameter per token (forward + backward), split over 2 ranks, plus attention
    params = 12 * h * h + 50304 * h  # the embedding is a lookup, the LM head a GEMM
    assert 0.9 < total / (6 * m * params / 2) < 1.3


def test_default_tp_size_is_a_few_hundred_launches_per_rank() -> None:
    p = build_program({"kind": "tp"})
    assert 300 <= p.kernel_launches() / p.ranks <= 3000


# --------------------------------------------------------------------------- pp
@pytest.mark.parametrize("stages,micro", [(2, 2), (4, 8), (8, 8), (4, 5)])
def test_one_f_one_b_order(stages: int, micro: int) -> None:
    for s in range(stages):
        order = one_f_one_b(s, stages, micro)
        warm = min(stages - s - 1, micro)
        assert [k for k, _ in order[:warm]] == ["F"] * warm
        steady = order[warm : warm + 2 * (micro - warm)]
        assert [k for k, _ in steady] == ["F", "B"] * (micro - warm)
        assert [k for k, _ in order[warm + 2 * (micro - warm) :]] == ["B"] * warm
        assert sorted(m for k, m in order if k == "F") == list(range(micro))
        assert [m for k, m in order if k == "B"] == list(range(micro))


def test_pp_program_follows_1f1b_and_links_neighbours() -> None:
    p = build_program({"kind": "pp", "pp": 4, "microbatches": 6})
    for s, ops in enumerate(p.ops):
        steps = [op[1][0].upper() for op in ops if op[0] == Op.BEGIN and op[1] in ("forward_step", "backward_step")]
        assert steps == [k for k, _ in one_f_one_b(s, 4, 6)]
    for c in p.collectives:
        if c.kind == "sendrecv":
            assert len(c.ranks) == 2 and abs(c.ranks[0] - c.ranks[1]) == 1
            assert c.nbytes == 1 * 2048 * 2048 * 2
    sends = [c for c in p.collectives if c.kind == "sendrecv"]
    assert len(sends) == 2 * 3 * 6  # activation forward and gradient backward, per link and micro-batch
    norm = [c for c in p.collectives if c.kind == "allreduce"]
    assert len(norm) == 1 and norm[0].ranks == (0, 1, 2, 3)


def test_pp_parameter_partition_differs_from_uniform() -> None:
    uni = build_program({"kind": "pp"}).meta
    par = build_program({"kind": "pp", "partition": "parameter"}).meta
    assert uni["layers_per_stage"] == [4, 4, 4, 4]
    assert par["layers_per_stage"] != uni["layers_per_stage"] and sum(par["layers_per_stage"]) == 16
    # the embedding and LM head push layers off the first and last stages
    assert par["layers_per_stage"][0] < 4 and par["layers_per_stage"][-1] < 4
    assert max(par["params_per_stage"]) < max(uni["params_per_stage"])
    assert sum(par["params_per_stage"]) == sum(uni["params_per_stage"])


# --------------------------------------------------------------------------- offload
def test_offload_copies_surround_the_cpu_experts() -> None:
    w = {"kind": "offload", "decode_tokens": 2, "model": {"layers": 3}}
    p = build_program(w)
    ops = p.ops[0]
    expert = [i for i, op in enumerate(ops) if op[0] == Op.CPU and op[2] == "cpuinfer::MoE::forward"]
    assert len(expert) == 2 * 3
    for i in expert:
        before = [op for op in ops[:i] if op[0] == Op.MEMCPY][-1]
        after = next(op for op in ops[i:] if op[0] in (Op.MEMCPY, Op.LAUNCH))
        assert before[2] == "DtoH" and before[4] is True
        assert after[0] == Op.MEMCPY and after[2] == "HtoD"
    # expert FLOPs / cpu_gflops: 8 seq x top-6 x 3 GEMMs x 2 x 2048 x 1408 at 800 GFLOP/s ~ 1.04 ms
    assert all(abs(ops[i][1] - 1.038e6) < 0.12e6 for i in expert)


def test_offload_gpu_work_is_small_next_to_the_cpu_time() -> None:
    p = build_program({"kind": "offload"})
    cpu_ns = sum(op[1] for op in p.ops[0] if op[0] == Op.CPU)
    # rough roofline lower bound of the GPU's time: A100 tensor peak and DRAM bandwidth
    gpu_ns = sum(
        max(
            p.kernels[op[2]].work.fp16_tensor_flop / 312e3,
            (p.kernels[op[2]].work.dram_read_bytes + p.kernels[op[2]].work.dram_write_bytes) / 2039.0,
        )
        for op in p.ops[0]
        if op[0] == Op.LAUNCH
    )
    assert gpu_ns < 0.3 * cpu_ns


def test_abstract_runner_catches_crossed_collectives() -> None:
    from emo.device.sim.program import CollectiveSpec

    p = Program(
        "crossed",
        2,
        [[(Op.COLLECTIVE, 20, 0), (Op.COLLECTIVE, 20, 1)], [(Op.COLLECTIVE, 20, 1), (Op.COLLECTIVE, 20, 0)]],
        collectives=[CollectiveSpec("sendrecv", (0, 1), 8), CollectiveSpec("sendrecv", (1, 0), 8)],
    )
    with pytest.raises(AssertionError, match="deadlock"):
        run_abstract(p)
