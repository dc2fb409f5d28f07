#!/usr/bin/env python3
"""Projected throughput and efficiency of zof's data x pipeline (x tensor) parallel ZO
fine-tuning on 8 to 128 GPUs, for OPT-13B to OPT-175B shapes, over NVLink and InfiniBand. A
documented calculation, not a measurement: every input is a command-line option, printed with
the tables.

What it models (zof's schedule as implemented in src/zo/zo.cpp and src/train/trainer.cpp):
  * G GPUs = S pipeline stages x R data-parallel replicas. S is the smallest power of two whose
    share of the weights (--bytes-per-param; zof holds fp32 master weights) fits in the usable
    GPU memory; the layers split evenly, the embedding joins stage 0 and the LM head the last
    stage (dist::stage_blocks), so the last stage is the slowest.
  * A step: each replica takes b_r sequences of `seq` tokens in M micro-batches; for every
    micro-batch each stage regenerates the 2q perturbed copies of its blocks (a fused pass that
    reads fp32 theta and writes two bf16 copies per query) and runs 2q forward streams through
    them, then sends the 2q hidden states (--act-bytes per value) to the next stage. Forward-only
    pipeline (no backward): step = (M + S - 1) slots of the slowest stage, one slot being
    max(stage compute, activation transfer), plus (S - 1) transfers on the fill path, plus the
    update pass (read + write fp32 theta once) and the data-parallel reduction.
  * Stage compute per micro-batch and block: max(FLOPs / (peak x gemm_efficiency),
    bytes read and written / HBM bandwidth) (a roofline), FLOPs = 2q x tokens x (2 x 12 h^2
    + 2 x seq x h) per layer (matmuls + causal attention), 2q x tokens x 2 V h for the LM head.
  * The reduction: a gather then a broadcast of 2q + 3 doubles over R replicas, as binomial
    trees: 2 ceil(log2 R) link latencies. Nothing else crosses ranks: every rank regenerates z.
  * For contrast, the first-order data-parallel gradient all-reduce of the same model (ring,
    bf16 gradients, 2 (R-1)/R x 2N bytes per GPU over the inter-replica link).
  * Efficiency = (FLOPs of the step / (G x peak x gemm_efficiency)) / step time: what is lost to
    the pipeline bubble, the last stage's LM head, memory-bound passes and communication.

Inputs and assumptions (defaults; change them with the options):
  * H200: dense bf16 matmul 790 TFLOP/s and HBM 4.3 TB/s (FIELD.md, measured on the lent machine
    type), 141 GB of which 90% usable; gemm_efficiency 0.6 = the share of the matmul rate a
    whole transformer forward keeps (zof's CPU forward keeps 53-62% of its GEMM rate,
    bench/RESULTS.md; an assumption for the GPU backend). Once bench/gpu/block_bench.cpp has
    measured a block on the GPU, pass its TFLOP/s as --block-tflops: the per-block compute time
    then comes from that measurement (efficiency stays relative to peak x gemm_efficiency).
  * NVLink 4 (H200 SXM): 450 GB/s per direction per GPU, 80% achieved, 3 us latency.
    InfiniBand NDR: 400 Gb/s = 50 GB/s per GPU, 80% achieved, 5 us latency. "mixed" is a DGX-style
    cluster: NVLink inside nodes of 8 GPUs, InfiniBand between them (pipelines are laid inside a
    node when S <= 8, as zof puts a pipeline's stages on consecutive ranks; replicas cross nodes).
  * Weak scaling: every replica takes b_r = 16 sequences of 512 tokens (MeZO's batch size per
    replica) in M = 16 micro-batches, q = 1. A second table keeps MeZO's global batch of 16
    sequences fixed (strong scaling), which caps the useful replicas at 16.
  * Tensor parallel (--tensor T, the third table): G = T x S x R, the T ranks of a tensor group
    inside one node (NVLink), each computing 1/T of every layer and holding 1/T of the weights,
    with two all-reduces of a micro-batch's (tokens, h) activations per layer and stream
    (docs/parallelism.md), not overlapped with compute (zof runs them in line). Two exchanges:
    zof's today, an all-gather through the group's first rank (it receives T - 1 parts and sends
    the whole to T - 1 ranks: T (T - 1) parts leave it, in fp32), and a ring all-reduce in bf16
    (2 (T - 1) / T of the whole per rank: what NCCL would do).
  * Not modelled: compute/transfer jitter, stragglers, the host side of checkpoints and
    evaluation, streaming weights from host memory (ZO2).

--validate-cpu checks the same structure against this machine: from the measured one-rank runs
(bench/mpi_bench.sh's raw JSON: the per-step fixed cost and the per-example cost) and the
measured MPI link (dist_pingpong_bench --json) it predicts the 2- and 4-rank runs, printed next
to what was measured.
"""
import argparse
import json
import math
import statistics

SHAPES = {  # name: (layers, hidden, vocab); OPT family, ffn = 4h
    "OPT-13B": (40, 5120, 50272),
    "OPT-30B": (48, 7168, 50272),
    "OPT-66B": (64, 9216, 50272),
    "OPT-175B": (96, 12288, 50272),
}
LINKS = {  # name: (bandwidth B/s achieved, latency s)
    "nvlink": (450e9 * 0.8, 3e-6),
    "ib": (50e9 * 0.8, 5e-6),
}


def params(L, h, V):
    return 12 * L * h * h + V * h


def min_stages(a, shape, G, T=1):
    """The fewest stages (a power of two) whose weights fit in T-way slices; None when G GPUs
    are not enough."""
    N = params(*shape) / T
    usable = a.gpu_mem * a.mem_usable * 0.85  # 15% for perturbed copies, buffers, activations
    S = 1
    while S * T < G and N * a.bytes_per_param / S > usable:
        S *= 2
    ok = N * a.bytes_per_param / S <= usable and S <= shape[0] and S * T <= G
    return S if ok else None


def tp_allreduce(n_bytes, T, link, ring):
    """One all-reduce of n_bytes (the whole tensor, fp32) over T ranks: zof's all-gather through
    the first rank (T (T - 1) parts of n_bytes leave it; it waits for the T - 1 parts first), or
    a ring in bf16 (2 (T - 1) / T of the half-size tensor per rank, 2 (T - 1) latency steps)."""
    bw, lat = link
    if T == 1:
        return 0.0
    if ring:
        return 2 * (T - 1) * lat + 2 * (T - 1) / T * (n_bytes / 2) / bw
    return 2 * lat + (T - 1) * n_bytes / bw + T * (T - 1) * n_bytes / bw


def project(a, shape, G, fabric, b_r, M, S, T=1, ring=False):
    """One configuration (T tensor x S stages x G/(S T) replicas): returns a dict of the
    projected step."""
    L, h, V = shape
    N = params(L, h, V)
    q, seq = a.queries, a.seq
    if S is None or S > L:
        return None
    R = G // (S * T)
    if R < 1 or b_r < 1:
        return None
    M = max(1, min(M, b_r))
    tok_m = b_r * seq / M  # tokens per micro-batch
    rate = a.block_tflops * 1e12 if a.block_tflops else a.peak * a.gemm_eff
    # Links: a pipeline inside a node (mixed) uses NVLink; replicas beyond one node use IB.
    if fabric == "mixed":
        stage_link = LINKS["nvlink"] if S <= a.gpus_per_node else LINKS["ib"]
        rep_link = LINKS["nvlink"] if G <= a.gpus_per_node else LINKS["ib"]
    else:
        stage_link = rep_link = LINKS[fabric]
    # Per micro-batch, per layer: 2q forward streams and the 2q perturbed copies.
    n_layer = 12 * h * h
    f_layer = 2 * q * tok_m * (2 * n_layer + 2 * seq * h)
    bytes_layer = 2 * q * n_layer * 2 + q * n_layer * (4 + 2 * 2)  # read bf16 copies; zo pass
    # A tensor group inside a node: 1/T of each layer, then its two all-reduces per stream.
    t_tp = 2 * 2 * q * tp_allreduce(tok_m * h * 4, T, LINKS["nvlink"], ring)
    t_layer = max(f_layer / T / rate, bytes_layer / T / a.hbm) + t_tp
    f_head = 2 * q * tok_m * 2 * V * h
    bytes_head = 2 * q * V * h * 2 + q * V * h * (4 + 2 * 2)
    t_head = max(f_head / T / rate, bytes_head / T / a.hbm)
    layers_last = L - (S - 1) * (L // S)  # the last stage's share (stage_blocks rounding)
    t_stage = max(math.ceil(L / S) * t_layer, layers_last * t_layer + t_head) if S > 1 else L * t_layer + t_head
    act = 2 * q * tok_m * h * a.act_bytes
    t_act = (stage_link[1] + act / stage_link[0]) if S > 1 else 0.0
    t_update = (N / S / T) * 8 / a.hbm  # read + write fp32 theta once per step
    t_reduce = 2 * math.ceil(math.log2(R)) * rep_link[1] if R > 1 else 0.0
    t_step = (M + S - 1) * max(t_stage, t_act) + (S - 1) * t_act + t_update + t_reduce
    flops = 2 * q * b_r * seq * R * (L * (2 * n_layer + 2 * seq * h) + 2 * V * h)
    eff = flops / (G * a.peak * a.gemm_eff) / t_step
    grad_bytes = 2 * (R - 1) / R * 2 * N / S / T if R > 1 else 0.0
    t_fo = grad_bytes / rep_link[0] if R > 1 else 0.0
    return dict(G=G, S=S, R=R, T=T, M=M, N=N, t_step=t_step, tok_s=b_r * seq * R / t_step,
                tp_share=L / S * t_tp / max(t_stage, 1e-30) if T > 1 else 0.0,
                pflops=flops / t_step / 1e15, eff=eff, bubble=(S - 1) / (M + S - 1),
                red_bytes=(2 * q + 3) * 8 * 2 * (G - 1), act_bytes=(S - 1) * M * act * R,
                t_fo=t_fo)


def tables(a):
    gpus = [8, 16, 32, 64, 128]
    rate = f"measured block rate {a.block_tflops:g} TFLOP/s, " if a.block_tflops else ""
    print(f"Inputs: {rate}peak {a.peak/1e12:.0f} TFLOP/s x gemm efficiency {a.gemm_eff}, HBM "
          f"{a.hbm/1e12:.1f} TB/s, {a.gpu_mem/1e9:.0f} GB x {a.mem_usable}, {a.bytes_per_param:g} B/param "
          f"resident, activations {a.act_bytes:g} B/value, q = {a.queries}, seq {a.seq}; NVLink "
          f"{LINKS['nvlink'][0]/1e9:.0f} GB/s {LINKS['nvlink'][1]*1e6:.0f} us, IB "
          f"{LINKS['ib'][0]/1e9:.0f} GB/s {LINKS['ib'][1]*1e6:.0f} us, {a.gpus_per_node} GPUs/node.\n")
    for title, strong in (("Weak scaling: 16 sequences x 512 tokens per replica, in 16 micro-batches", False),
                          ("Strong scaling: MeZO's global batch of 16 sequences x 512 tokens; at most 16 "
                           "replicas, further GPUs become pipeline stages", True)):
        print(f"#### {title}\n")
        print("| model | GPUs | stages x replicas | step (s) | tokens/s | PFLOP/s | eff. NVLink | eff. IB "
              "| eff. mixed | reduction B/step | activations MB/step | first-order all-reduce s/step (IB) |")
        print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for name, shape in SHAPES.items():
            for G in gpus:
                S = min_stages(a, shape, G)
                if S is not None and strong:
                    R = min(G // S, 16)
                    S = G // R
                b_r = 16 // (G // S) if (strong and S) else 16
                res = {f: project(a, shape, G, f, b_r, 16, S) for f in ("nvlink", "ib", "mixed")}
                r = res["mixed"]
                if r is None:
                    print(f"| {name} | {G} | does not fit | | | | | | | | | |")
                    continue
                print(f"| {name} | {G} | {r['S']} x {r['R']} | {r['t_step']:.3f} | {r['tok_s']:,.0f} | "
                      f"{r['pflops']:.1f} | {res['nvlink']['eff']:.0%} | {res['ib']['eff']:.0%} | "
                      f"{r['eff']:.0%} | {r['red_bytes']:,.0f} | {r['act_bytes']/1e6:,.0f} | "
                      f"{res['ib']['t_fo']:.2f} |")
        print()
    T = a.tensor
    print(f"#### Tensor parallel: T = {T} inside a node x pipeline x replicas (weak scaling as above), "
          "zof's exchange today and a bf16 ring all-reduce\n")
    print("| model | GPUs | tensor x stages x replicas | step (s), star | eff., star | TP share of a "
          "stage, star | step (s), ring | eff., ring | TP share, ring |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|")
    for name, shape in SHAPES.items():
        for G in gpus:
            S = min_stages(a, shape, G, T)
            star = project(a, shape, G, "mixed", 16, 16, S, T, False) if S else None
            ring = project(a, shape, G, "mixed", 16, 16, S, T, True) if S else None
            if star is None or star["R"] < 1:
                print(f"| {name} | {G} | does not fit | | | | | | |")
                continue
            print(f"| {name} | {G} | {T} x {star['S']} x {star['R']} | {star['t_step']:.3f} | "
                  f"{star['eff']:.0%} | {star['tp_share']:.0%} | {ring['t_step']:.3f} | "
                  f"{ring['eff']:.0%} | {ring['tp_share']:.0%} |")
    print()


def validate_cpu(a):
    """Projects the multi-rank CPU runs of bench/mpi_bench.sh from its one-rank runs.

    One rank on one thread, at batch B and B/4, gives t(b) = t_fix + b t_ex: t_fix the per-step
    cost that does not depend on the batch (z regeneration, the perturbation and update passes over
    all N parameters; the walk repeats the perturbation for every micro-batch), t_ex the forward
    cost per example. R data-parallel ranks: t_fix + (B/R) t_ex each. S stages with M
    micro-batches: a slot of (t_fix + (B/M) t_ex) / S, (M + S - 1) slots, plus the activation
    transfers and the reduction over the measured link. When there are more ranks than cores,
    the compute stretches by ranks / cores."""
    runs = [json.loads(l) for l in open(a.validate_cpu)]
    link = json.load(open(a.link))
    alpha, beta = link["alpha_s"], link["beta_Bps"]
    groups = {}
    for r in runs:
        groups.setdefault((r["model"], r["label"]), []).append(r)
    t_of = lambda rr: statistics.median(x["train_s"] / x["steps"] for x in rr)
    print(f"CPU check ({a.cores} cores assumed free; link alpha {alpha*1e6:.1f} us, beta "
          f"{beta/1e9:.2f} GB/s measured):\n")
    print("| model | t_fix (s/step) | t_ex (s/example) | layout | measured steps/s | projected steps/s | projected / measured |")
    print("|---|---:|---:|---|---:|---:|---:|")
    for (m, label), rs in groups.items():
        full, quarter = groups.get((m, "1 rank x 1 thread")), groups.get((m, "1 rank x 1 thread, quarter batch"))
        r = rs[0]
        R, S = r["dist"]["ranks"], r["dist"]["pipeline_stages"]
        if not full or not quarter or R == 1:
            continue
        B, Bq = full[0]["batch"], quarter[0]["batch"]
        t_ex = (t_of(full) - t_of(quarter)) / (B - Bq)
        t_fix = t_of(full) - B * t_ex
        reps = R // S
        stretch = max(1.0, R / a.cores)
        if S == 1:
            t = (t_fix + B / R * t_ex) * stretch + 2 * math.ceil(math.log2(R)) * alpha
        else:
            M = r.get("micro", 1)
            act = r["dist"]["bytes_per_step"] / reps / max(S - 1, 1)
            slot = (t_fix + B / reps / M * t_ex) / S * stretch
            t = (M + S - 1) * slot + (S - 1) * (alpha + act / M / beta) + \
                2 * math.ceil(math.log2(R)) * alpha
        meas = 1 / t_of(rs)
        print(f"| {m} | {t_fix:.3f} | {t_ex:.4f} | {label} | {meas:.2f} | {1/t:.2f} | {1/t/meas:.2f} |")
    print()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--peak", type=float, default=790e12, help="dense bf16 matmul FLOP/s per GPU")
    p.add_argument("--gemm-eff", type=float, default=0.6, help="share of --peak a forward keeps")
    p.add_argument("--block-tflops", type=float, help="measured forward TFLOP/s of one block on the GPU "
                   "(bench/gpu/block_bench.cpp, OPT-13B shape, bf16): replaces peak x gemm efficiency")
    p.add_argument("--hbm", type=float, default=4.3e12, help="GPU memory bandwidth, B/s")
    p.add_argument("--gpu-mem", type=float, default=141e9)
    p.add_argument("--mem-usable", type=float, default=0.9)
    p.add_argument("--bytes-per-param", type=float, default=4, help="resident weights (zof: fp32)")
    p.add_argument("--act-bytes", type=float, default=4, help="bytes per activation on the wire (zof: fp32)")
    p.add_argument("--queries", type=int, default=1)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--tensor", type=int, default=8, help="the third table's tensor-parallel T "
                   "(a tensor group inside a node)")
    p.add_argument("--validate-cpu", help="bench/mpi_bench.sh raw JSONL: check the model on this machine")
    p.add_argument("--link", help="dist_pingpong_bench --json line (with --validate-cpu)")
    p.add_argument("--cores", type=int, default=2)
    a = p.parse_args()
    if a.validate_cpu:
        validate_cpu(a)
    else:
        tables(a)


if __name__ == "__main__":
    main()
