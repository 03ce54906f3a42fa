"""Published training runs, for checking `loom plan` against runs it was not
built from (bench/plan_published.py runs it). Every row is one measured run:
the model, the system, the layout and what the training stack did, and the
throughput the source printed, with the source named. Nothing here is
fitted: where a source leaves a knob out, the row says so and either fixes
it to the stack's documented default or lets the planner choose among the
candidates in `choose` (its best prediction: an optimistic choice, said
where it is made).

Each row is a dict:
  id       short unique name
  src      key of SOURCES (the citation)
  family   "megatron" (Megatron-LM / Megatron-Core / NeMo), "fsdp" (PyTorch
           FSDP: llm-foundry/Composer, torchtitan), "deepspeed" (DeepSpeed
           ZeRO, Megatron-DeepSpeed), "meta" (Llama 3's own stack)
  system   key of SYSTEMS (a preset of plan/clusters/ plus what the source
           says of the network)
  model    key of MODELS (a config.json the planner reads)
  gpus, batch (global, sequences), seq
  prec     bf16 | fp8 (fp16 runs are bf16 here: the same bytes)
  layout   `loom plan --layout` text
  stack    what the stack did: attention (materialized, flash, flash2,
           flash3, triton, cudnn), grad_reduce (bf16 | fp32), dropout (0/1),
           no_dp_overlap (0/1), fused (0/1: torch.compile'd element-wise ops),
           elementwise (eager: PyTorch composites, torchtitan without compile),
           logits (bf16: a fused loss kernel on bf16 logits), fp8_params
           (0/1: the weights held in FP8, no bf16 copy), zero3_live (DeepSpeed
           ZeRO-3's stage3_max_live_parameters), zero3_per_param (0/1: ZeRO-3
           gathers each parameter tensor with its own collective, DeepSpeed)
  choose   optional list of layout suffixes the source does not settle
  tps      published throughput, tokens per second per GPU (converted from
           the source's own unit with the source's own FLOP count where it
           printed TFLOP/s or an iteration time: see each block)
  mem      optional published peak memory per GPU, GB (1e9 bytes)
  part     "cal" (calibration: looked at while the model was built) or
           "held" (held out: checked only at milestones, never tuned on)
  group    optional: rows of one group compare layouts or schedules of one
           model on one cluster (rank agreement)
"""

# ---- sources -------------------------------------------------------------

SOURCES = {
    "meg21": "Narayanan et al., 'Efficient Large-Scale Language Model Training on GPU Clusters Using "
             "Megatron-LM', SC'21, arXiv:2104.04473, Table 1 and Table 2 (TFLOP/s per GPU by its Eq. 3); "
             "micro-batch, virtual stages and DDP from NVIDIA/Megatron-LM "
             "examples/academic_paper_scripts/sc21/ (de7dc40f)",
    "k22": "Korthikanti et al., 'Reducing Activation Recomputation in Large Transformer Models', "
           "arXiv:2205.05198, Table 3 and Table 5 (iteration times), section 6",
    "llama3": "Llama Team, 'The Llama 3 Herd of Models', arXiv:2407.21783, section 3.3, Table 4",
    "mtnlg": "Smith et al., 'Using DeepSpeed and Megatron to Train Megatron-Turing NLG 530B', "
             "arXiv:2201.11990, section 2.4 (iteration times 60.1, 50.2, 44.4 s at 280, 350, 420 DGX A100 "
             "nodes, batch 1920; 126, 121, 113 TFLOP/s per GPU)",
    "bloom": "BigScience, 'BLOOM: A 176B-Parameter Open-Access Multilingual Language Model', "
             "arXiv:2211.05100, section 3.4 (384 A100 80GB, 48 nodes, 4 x 100 Gb/s Omni-Path per node, "
             "TP 4, PP 12, DP 8, ZeRO-1, bf16, ~150 TFLOP/s) and bigscience.notion.site 'BigScience 176B "
             "Model' (one replica on 48 GPUs using 60 GB each)",
    "foundry": "mosaicml/llm-foundry scripts/train/benchmarking/README.md at 49521837 (2024-04-22): MPT "
               "throughput tables (A100 80GB and 40GB with 1600 Gb/s RoCE, H100 80GB BF16 and FP8); "
               "configs from scripts/train/benchmarking/submit_benchmarks.py and yamls/pretrain/mpt-*.yaml "
               "at b2a43a14 (attn_impl triton, FSDP, learned positions, no dropout)",
    "tt2404": "pytorch/torchtitan docs/performance.md at 3faaa1a0 (2024-08-23): Llama 3 8B/70B and Llama 2 "
              "13B/70B with FSDP2 on 64 A100 80GB (WPS per GPU)",
    "tt2408": "pytorch/torchtitan docs/performance.md at 3faaa1a0 (2024-08-23): Llama 3.1 405B, FSDP 16 x TP "
              "8 on 128 H100 (HBM2e 94-96 GB), local batch 2, full AC",
    "tt2412": "pytorch/torchtitan docs/performance.md at d4c86e37 (2025-01-30; versions 2024-12-26): Llama "
              "3.1 8B/70B/405B on Grand Teton H100 96GB HBM2e 2.4 TB/s at 500 W, 400 Gb/s RDMA per GPU "
              "(TPS/GPU and memory, max reserved)",
    "tt2506": "pytorch/torchtitan benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md (c0b41b35): vanilla "
              "vs async TP, Llama 3.1 8B and 70B on Grand Teton H100",
    "tth200": "pytorch/torchtitan benchmarks/llama3-8b_h200_202506_trainy-whitefiber.md (9ba3c310): Llama "
              "3.1 8B, FSDP + compile + float8 on 32 and 64 H200, 400 Gb/s per GPU",
    "mcore08": "NVIDIA/Megatron-LM README.md at f2e5db40 (2024-07-15) and images/model_table.png: "
               "Megatron-Core r0.8.0 weak scaling on H100, vocabulary 131,072, sequence 4096, "
               "--overlap-grad-reduce --overlap-param-gather --tp-comm-overlap (per-GPU TFLOP/s)",
    "nemo2407": "NVIDIA/NeMo docs/source/performance/performance_summary.md (NeMo 24.07, DGX-H100, FP8): "
                "pre-training tokens/s/GPU with TP, PP, CP, VP, MBS, GBS",
    "mbridge": "NVIDIA-NeMo/Megatron-Bridge docs/performance-summary.md and performance-summary-archive.md "
               "(NeMo 25.09, 25.11, 26.02 containers): pre-training tokens/s/GPU, DGX-H100 and DGX-B200",
}

# ---- systems: a preset plus what the source says of its network ----------

SYSTEMS = {
    # Selene: DGX A100 80GB, 8 x HDR 200 Gb/s InfiniBand per node
    "selene": ("a100-80gb", {}),
    # Jean Zay: 8 x A100 80GB per node, 4 x 100 Gb/s Omni-Path per node
    "jeanzay": ("a100-80gb", {"inter_node": {"nics_per_node": 4, "nic_gbps": 12.5}}),
    # MosaicML: "1600 Gbps node-node interconnect (RoCE)": 8 x 200 Gb/s
    "mosaic-a100-80": ("a100-80gb", {}),
    "mosaic-a100-40": ("a100-40gb", {}),
    # MosaicML H100 (not stated in the README): DGX H100's 8 x 400 Gb/s
    "mosaic-h100": ("h100-80gb", {}),
    # Meta's A100 cluster for torchtitan 2024-04 (not stated): 8 x 200 Gb/s
    "meta-a100": ("a100-80gb", {}),
    # Grand Teton H100 96GB HBM2e at 500 W, 400 Gb/s per GPU (torchtitan)
    "grandteton": ("h100-96gb", {}),
    # Llama 3: H100 80GB at 700 W, 400 Gb/s RoCE per GPU (section 3.3.1)
    "meta-h100": ("h100-80gb", {}),
    "dgx-h100": ("h100-80gb", {}),
    "whitefiber-h200": ("h200", {}),
    "dgx-b200": ("b200", {}),
}

# ---- model shapes --------------------------------------------------------


def gpt(layers, heads, hidden, vocab, seq, ffn=None):
    """GPT-2-style (LayerNorm, GELU, biases, learned positions, tied head)."""
    d = {"model_type": "gpt2", "n_layer": layers, "n_head": heads, "n_embd": hidden, "vocab_size": vocab,
         "n_positions": seq}
    if ffn:
        d["n_inner"] = ffn
    return d


def llama(layers, heads, kv, hidden, ffn, vocab, seq=8192, tied=False):
    return {"model_type": "llama", "num_hidden_layers": layers, "num_attention_heads": heads,
            "num_key_value_heads": kv, "hidden_size": hidden, "intermediate_size": ffn, "vocab_size": vocab,
            "max_position_embeddings": seq, "tie_word_embeddings": tied}


MODELS = {
    "llama3-8b": llama(32, 32, 8, 4096, 14336, 128256),
    "llama3-70b": llama(80, 64, 8, 8192, 28672, 128256),
    "llama3-405b": llama(126, 128, 8, 16384, 53248, 128256),
    "llama2-7b": llama(32, 32, 32, 4096, 11008, 32000, 4096),
    "llama2-13b": llama(40, 40, 40, 5120, 13824, 32000, 4096),
    "llama2-70b": llama(80, 64, 8, 8192, 28672, 32000, 4096),
    "bloom-176b": gpt(70, 112, 14336, 250880, 2048),
    "mtnlg-530b": gpt(105, 128, 20480, 51200, 2048),
    "gpt3-175b": gpt(96, 96, 12288, 51200, 2048),
}
# MPT (llm-foundry yamls/pretrain/mpt-*.yaml): d_model, n_heads, n_layers,
# expansion 4, vocabulary 50,368, learned positions of max_seq_len
MPT = {"125m": (12, 12, 768), "350m": (24, 16, 1024), "760m": (24, 12, 1536), "1b": (24, 16, 2048),
       "3b": (32, 20, 2560), "7b": (32, 32, 4096), "13b": (40, 40, 5120), "30b": (48, 56, 7168),
       "70b": (80, 64, 8192)}


def mpt_model(name, seq):
    key = "mpt-%s-s%d" % (name, seq)
    if key not in MODELS:
        L, a, h = MPT[name]
        MODELS[key] = gpt(L, a, h, 50368, seq)
    return key


def gpt_model(layers, heads, hidden, vocab, seq):
    key = "gpt-l%d-h%d-v%d-s%d" % (layers, hidden, vocab, seq)
    MODELS.setdefault(key, gpt(layers, heads, hidden, vocab, seq))
    return key


# ---- FLOP counts the sources print TFLOP/s with --------------------------


def megatron_eq3(B, s, l, h, V):
    """Narayanan et al. 2021, Eq. 3 (counts the recomputed forward); also the
    TFLOP/s Megatron-DeepSpeed prints with activation checkpointing (BLOOM,
    MT-NLG: 126 TFLOP/s at 60.1 s reproduces it)."""
    return 96.0 * B * s * l * h * h * (1 + s / (6.0 * h) + V / (16.0 * l * h))


def megatron_model_flops(B, s, l, h, V):
    """Korthikanti et al. 2022, Eq. 7; Megatron-Core's
    num_floating_point_operations for a GPT with MHA and a 4h GELU MLP."""
    return 72.0 * B * s * l * h * h * (1 + s / (6.0 * h) + V / (12.0 * l * h))


def model_flops_per_token(cfg, s):
    """6 x (the layers' weights + the head) + 12 l s h: the planner's model
    FLOPs per token of a Llama-style config (the Llama 3 rows' TFLOP/s)."""
    L, h, a = cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_attention_heads"]
    kv, F, V = cfg["num_key_value_heads"], cfg["intermediate_size"], cfg["vocab_size"]
    per_layer = 2 * h * h + 2 * h * (h // a) * kv + 3 * h * F
    return 6.0 * (L * per_layer + V * h) + 12.0 * L * s * h


def tps_from_tflops(tflops, flops_per_iter, B, s):
    """Tokens/s/GPU from TFLOP/s/GPU and the FLOPs of an iteration of B x s tokens."""
    return tflops * 1e12 * B * s / flops_per_iter


RUNS = []


def add(**row):
    row.setdefault("stack", {})
    RUNS.append(row)


# ---- Megatron-LM 2021 (Selene), Table 1 and Table 2 ---------------------
# fp16 mixed precision, full recompute, the s x s scores materialised (no
# FlashAttention yet), dropout 0.1 (Megatron's default), fp16 gradients;
# --DDP-impl local (all-reduce after the backward) except at pp = 1 (torch
# DDP, overlapped). Table 2's PTD-P rows: micro-batch 1, virtual stages not
# stated (choose). Calibration part.
MEG_STACK = {"attention": "materialized", "dropout": 1, "grad_reduce": "bf16"}
for (pb, a, h, L, tp, pp, g, B, tflops, tab, mbs, lpvs, ddp) in [
        (1.7, 24, 2304, 24, 1, 1, 32, 512, 137, "T1", 16, 0, "torch"),
        (3.6, 32, 3072, 30, 2, 1, 64, 512, 138, "T1", 16, 0, "torch"),
        (7.5, 32, 4096, 36, 4, 1, 128, 512, 142, "T1", 16, 0, "torch"),
        (18.4, 48, 6144, 40, 8, 1, 256, 1024, 135, "T1", 8, 0, "torch"),
        (39.1, 64, 8192, 48, 8, 2, 512, 1536, 138, "T1", 4, 0, "local"),
        (76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140, "T1", 2, 5, "local"),
        (145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148, "T1", 2, 5, "local"),
        (310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155, "T1", 1, 3, "local"),
        (529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163, "T1", 1, 1, "local"),
        (1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163, "T1", 1, 0, "local"),
        (174.6, 96, 12288, 96, 8, 12, 384, 1536, 153, "T2", 1, None, "local"),
        (174.6, 96, 12288, 96, 8, 12, 768, 1536, 149, "T2", 1, None, "local"),
        (174.6, 96, 12288, 96, 8, 12, 1536, 1536, 141, "T2", 1, None, "local"),
        (529.6, 128, 20480, 105, 8, 35, 560, 2240, 171, "T2", 1, None, "local"),
        (529.6, 128, 20480, 105, 8, 35, 1120, 2240, 167, "T2", 1, None, "local"),
        (529.6, 128, 20480, 105, 8, 35, 2240, 2240, 159, "T2", 1, None, "local")]:
    dp = g // (tp * pp)
    m = B // (dp * mbs)
    choose = None
    if pp == 1 or lpvs == 0:
        sched = "schedule=1f1b"
    elif lpvs:
        sched = "schedule=interleaved,v=%d" % (L // (pp * lpvs))
    else:
        sched = None
        choose = ["schedule=interleaved,v=%d" % v for v in (2, 3, 4, 6, 8) if m % pp == 0 and L % (pp * v) == 0]
    layout = "dp=%d,tp=%d,pp=%d,mbs=%d,m=%d,recompute=full" % (dp, tp, pp, mbs, m)
    if sched:
        layout += "," + sched
    add(id="meg21-%s-%gB-%d" % (tab, pb, g), src="meg21", family="megatron", system="selene",
        model=gpt_model(L, a, h, 51200, 2048), gpus=g, batch=B, seq=2048, prec="bf16", layout=layout,
        choose=choose, stack=dict(MEG_STACK, no_dp_overlap=int(ddp == "local")),
        tps=tps_from_tflops(tflops, megatron_eq3(B, 2048, L, h, 51200), B, 2048),
        part="cal" if tab == "T1" else "held",
        group="meg21-%gB-%d" % (pb, g) if tab == "T2" else None)

# Table 2, ZeRO-3 rows: DeepSpeed ZeRO-3 in the same codebase, every GPU a DP
# rank, the table's micro-batch (530B on 640 GPUs ran batch 2560). DeepSpeed
# gathers ZeRO-3 parameters module by module and holds at most
# stage3_max_live_parameters of them (1e9, its default: DeepSpeed's
# configuration docs, "ZeRO optimizations for FP16 training"), each parameter
# tensor gathered by an all-gather of its own (zero3_per_param). Held out.
for (pb, a, h, L, g, B, mbs, tflops) in [
        (174.6, 96, 12288, 96, 384, 1536, 4, 144), (174.6, 96, 12288, 96, 768, 1536, 2, 88),
        (174.6, 96, 12288, 96, 1536, 1536, 1, 44), (529.6, 128, 20480, 105, 640, 2560, 4, 138),
        (529.6, 128, 20480, 105, 1120, 2240, 2, 98), (529.6, 128, 20480, 105, 2240, 2240, 1, 48)]:
    add(id="zero3-%gB-%d" % (pb, g), src="meg21", family="deepspeed", system="selene",
        model=gpt_model(L, a, h, 51200, 2048), gpus=g, batch=B, seq=2048, prec="bf16",
        layout="dp=%d,zero=3,mbs=%d,m=%d,recompute=full" % (g, mbs, B // (g * mbs)),
        stack=dict(MEG_STACK, zero3_live=1e9, zero3_per_param=1),
        tps=tps_from_tflops(tflops, megatron_eq3(B, 2048, L, h, 51200), B, 2048), part="held",
        group="meg21-%gB-%d" % (pb, g))

# ---- Korthikanti et al. 2022 (Selene), Table 5 --------------------------
# dp = 1, s = 2048, V = 51,200, fp16; v = 3 for 175B and 530B; each model
# with full recompute (sp 0) and with SP + selective recompute. Calibration.
for (name, a, h, L, tp, pp, g, B, mbs, v, t_full, t_sel) in [
        ("22B", 64, 6144, 48, 8, 1, 8, 4, 4, 1, 1.42, 1.10),
        ("175B", 96, 12288, 96, 8, 8, 64, 64, 1, 3, 18.13, 13.75),
        ("530B", 128, 20480, 105, 8, 35, 280, 280, 1, 3, 49.05, 37.83),
        ("1T", 160, 25600, 128, 8, 64, 512, 512, 1, 1, 94.42, 71.49)]:
    sched = "interleaved,v=%d" % v if v > 1 else "1f1b"
    for (var, knobs, t) in (("full", "recompute=full,sp=0", t_full), ("sel", "recompute=selective,sp=1", t_sel)):
        add(id="k22-%s-%s" % (name, var), src="k22", family="megatron", system="selene",
            model=gpt_model(L, a, h, 51200, 2048), gpus=g, batch=B, seq=2048, prec="bf16",
            layout="dp=1,tp=%d,pp=%d,mbs=%d,m=%d,schedule=%s,%s" % (tp, pp, mbs, B // mbs, sched, knobs),
            stack=dict(MEG_STACK), tps=B * 2048 / (t * g), part="cal", group="k22-%s" % name)

# ---- Llama 3 405B (Meta's H100 cluster), Table 4 ------------------------
# FSDP sharding optimizer state and gradients (zero=2), interleaved,
# order [TP, CP, PP, DP], K/V all-gathered for CP, no activation
# checkpointing at 8K, FP32 gradient reduce-scatter (section 3.3.4,
# "Numerical stability"). TFLOP/s with the planner's model FLOPs (6 x params
# + 12 l s h per token); the 128K row's DP is printed 4, 8 by the arithmetic.
# The attention kernel is not stated: FlashAttention-2 assumed. Held out.
for (g, tp, cp, pp, dp, s, B, tflops) in [(8192, 8, 1, 16, 64, 8192, 2048, 430),
                                          (16384, 8, 1, 16, 128, 8192, 2048, 400),
                                          (16384, 8, 16, 16, 8, 131072, 128, 380)]:
    layout = "dp=%d,tp=%d,cp=%d,pp=%d,zero=2,mbs=1,m=%d,order=tp.cp.pp.dp" % (dp, tp, cp, pp, B // dp)
    if cp > 1:
        layout += ",cp_impl=allgather"
    recs = ("none",) if s == 8192 else ("none", "selective", "full")
    add(id="llama3-405b-%d-s%d" % (g, s), src="llama3", family="meta", system="meta-h100", model="llama3-405b",
        gpus=g, batch=B, seq=s, prec="bf16", layout=layout,
        choose=["schedule=interleaved,v=%d,recompute=%s,sp=%d" % (v, rc, sp) for v in (2, 4, 8) for rc in recs
                for sp in (0, 1)],
        stack={"attention": "flash2", "grad_reduce": "fp32"},
        tps=tflops * 1e12 / model_flops_per_token(MODELS["llama3-405b"], s), part="held")

# ---- MT-NLG 530B (Selene), section 2.4 -----------------------------------
# tp 8, pp 35, dp 8/10/12, batch 1920, micro-batch 1, full recompute,
# DeepSpeed's pipeline (1F1B, gradients reduced after the flush), ZeRO-1,
# fp16, scores materialised, dropout. TFLOP/s by Eq. 3. Held out.
for (nodes, t_iter) in [(280, 60.1), (350, 50.2), (420, 44.4)]:
    g = 8 * nodes
    dp = g // 280
    add(id="mtnlg-%d" % g, src="mtnlg", family="deepspeed", system="selene", model="mtnlg-530b", gpus=g,
        batch=1920, seq=2048, prec="bf16",
        layout="dp=%d,tp=8,pp=35,zero=1,mbs=1,m=%d,schedule=1f1b,recompute=full" % (dp, 1920 // dp),
        stack=dict(MEG_STACK, no_dp_overlap=1), tps=1920 * 2048 / (t_iter * g), part="held")

# ---- BLOOM 176B (Jean Zay) ----------------------------------------------
# TP 4, PP 12, DP 8, micro-batch 2, batch 2048, bf16, ZeRO-1, full
# recompute, no dropout, DeepSpeed pipeline (1F1B, reduction after the
# flush), FP32 gradient reduction (DeepSpeed's bf16 optimizer), fused
# softmax (scores materialised). ~150 TFLOP/s by Megatron-DeepSpeed's
# Eq. 3; 60 GB per GPU. Held out.
add(id="bloom-176b", src="bloom", family="deepspeed", system="jeanzay", model="bloom-176b", gpus=384, batch=2048,
    seq=2048, prec="bf16", layout="dp=8,tp=4,pp=12,zero=1,mbs=2,m=128,schedule=1f1b,recompute=full",
    stack={"attention": "materialized", "grad_reduce": "fp32", "no_dp_overlap": 1},
    tps=tps_from_tflops(150, megatron_eq3(2048, 2048, 70, 14336, 250880), 2048, 2048), mem=60.0, part="held")

# ---- Megatron-Core r0.8.0 weak scaling on H100 ---------------------------
# GPT, V = 131,072, s = 4096; DP 48 everywhere; overlapped DP (distributed
# optimizer: zero=1), TP overlap (async_tp), SP with TP. Micro-batch,
# recompute and virtual stages are not given: choose. Attention: TE's cuDNN
# fused attention (assumed). Per-GPU TFLOP/s by Megatron-Core's model FLOPs.
# Calibration.
for (pb, a, h, L, tp, pp, g, B, tflops) in [
        (1.7, 16, 2048, 24, 1, 1, 48, 192, 408.8), (7.1, 32, 4096, 30, 2, 1, 96, 192, 465.9),
        (16, 48, 6144, 32, 4, 1, 192, 192, 489.1), (32, 56, 7168, 48, 8, 1, 384, 192, 459.6),
        (70, 64, 8192, 84, 8, 2, 768, 384, 419.7), (119, 80, 10240, 92, 8, 4, 1536, 768, 420.5),
        (177, 96, 12288, 96, 8, 6, 2304, 1152, 432.8), (314, 128, 16384, 96, 8, 8, 3072, 1536, 474.4),
        (462, 144, 18432, 112, 8, 16, 6144, 3072, 459.9)]:
    dp = 48
    base = "dp=%d,tp=%d,pp=%d,zero=1,sp=%d,async_tp=%d,mbs=1,m=%d" % (dp, tp, pp, int(tp > 1), int(tp > 1),
                                                                       B // dp)
    recs = ("none", "selective", "full")
    if pp == 1:
        choose = ["recompute=%s" % rc for rc in recs]
    else:
        choose = ["recompute=%s,schedule=interleaved,v=%d" % (rc, v) for rc in recs for v in (1, 2, 3, 4, 6)
                  if L % (pp * v) == 0 and (B // dp) % pp == 0]
    add(id="mcore08-%gB" % pb, src="mcore08", family="megatron", system="dgx-h100",
        model=gpt_model(L, a, h, 131072, 4096), gpus=g, batch=B, seq=4096, prec="bf16", layout=base,
        choose=choose, stack={"attention": "cudnn", "grad_reduce": "fp32"},
        tps=tps_from_tflops(tflops, megatron_model_flops(B, 4096, L, h, 131072), B, 4096), part="cal")

# ---- NeMo 24.07 (DGX-H100, FP8) ------------------------------------------
# Megatron-Core with Transformer Engine: FP8 GEMMs, cuDNN fused attention,
# distributed optimizer (zero=1), DP/TP overlap, SP with TP, no recompute
# (NeMo's performance recipes), FP32 gradient reduction (Megatron's
# default). Held out.
for (name, model, g, B, mbs, s, tp, pp, cp, vp, tps) in [
        ("gpt3-175b-128", "gpt3-175b", 128, 256, 1, 2048, 4, 8, 1, 6, 726),
        ("gpt3-175b-512", "gpt3-175b", 512, 2048, 2, 2048, 4, 8, 1, 6, 782),
        ("llama2-7b", "llama2-7b", 8, 128, 1, 4096, 1, 1, 1, 1, 16847),
        ("llama2-13b", "llama2-13b", 16, 128, 1, 4096, 1, 4, 1, 10, 8646),
        ("llama2-70b", "llama2-70b", 64, 128, 1, 4096, 4, 4, 1, 20, 1707),
        ("llama3-8b", "llama3-8b", 8, 128, 1, 8192, 1, 1, 2, 1, 12036),
        ("llama3-70b", "llama3-70b", 64, 128, 1, 8192, 4, 4, 2, 5, 1533)]:
    dp = g // (tp * pp * cp)
    lay = "dp=%d,tp=%d,pp=%d,cp=%d,zero=1,sp=%d,async_tp=%d,mbs=%d,m=%d,recompute=none" % (
        dp, tp, pp, cp, int(tp > 1), int(tp > 1), mbs, B // (dp * mbs))
    if pp > 1:
        lay += ",schedule=%s" % ("interleaved,v=%d" % vp if vp > 1 else "1f1b")
    if cp > 1:
        lay += ",cp_impl=ring"
    add(id="nemo2407-%s" % name, src="nemo2407", family="megatron", system="dgx-h100", model=model, gpus=g,
        batch=B, seq=s, prec="fp8", layout=lay, stack={"attention": "cudnn", "grad_reduce": "fp32"}, tps=tps,
        part="held")

# ---- Megatron-Bridge (NeMo 25.09 / 25.11 / 26.02), FP8 current scaling ---
# Same stack as above; FSDP > 0 is Megatron-FSDP (zero=3). The FP8 recipe
# keeps the weights in FP8 (fp8_params): bf16_with_fp8_current_scaling_mixed
# sets fp8_param_gather = True, which MixedPrecisionConfig keeps in step with
# fp8_param (NVIDIA-NeMo/Megatron-Bridge src/megatron/bridge/training/
# mixed_precision.py at 9f69b72d; scripts/performance/utils/precision.py
# takes that recipe for fp8_cs); gradients reduced in fp32 (the same
# config's grad_reduce_in_fp32, from bf16_mixed). Held out.
for (name, sysname, model, g, B, mbs, s, fsdp, tp, pp, cp, vp, tps) in [
        ("h100-llama3-8b-2509", "dgx-h100", "llama3-8b", 8, 128, 1, 8192, 1, 1, 1, 1, 1, 14079),
        ("h100-llama3-8b-2511", "dgx-h100", "llama3-8b", 8, 128, 1, 8192, 1, 1, 1, 1, 1, 14451),
        ("h100-llama3-70b-2509", "dgx-h100", "llama3-70b", 64, 128, 1, 8192, 0, 4, 8, 1, 5, 1619),
        ("h100-llama3-70b-2511", "dgx-h100", "llama3-70b", 64, 128, 1, 8192, 0, 4, 8, 1, 5, 1602),
        ("h100-llama3-70b-2602", "dgx-h100", "llama3-70b", 64, 256, 1, 8192, 0, 4, 8, 1, 5, 1621),
        ("h100-llama31-405b-2509", "dgx-h100", "llama3-405b", 1024, 512, 1, 8192, 0, 8, 8, 2, 8, 302),
        ("h100-llama31-405b-2511", "dgx-h100", "llama3-405b", 1024, 512, 1, 8192, 0, 8, 8, 2, 8, 292),
        ("h100-llama31-405b-2602", "dgx-h100", "llama3-405b", 1024, 1536, 1, 8192, 0, 8, 8, 2, 8, 311),
        ("b200-llama3-8b-2509", "dgx-b200", "llama3-8b", 8, 128, 2, 8192, 0, 1, 1, 1, 1, 29994),
        ("b200-llama3-8b-2511", "dgx-b200", "llama3-8b", 8, 128, 2, 8192, 0, 1, 1, 1, 1, 30624),
        ("b200-llama31-405b-2509", "dgx-b200", "llama3-405b", 128, 64, 1, 8192, 0, 4, 8, 2, 8, 664),
        ("b200-llama31-405b-2511", "dgx-b200", "llama3-405b", 128, 64, 1, 8192, 0, 4, 8, 2, 8, 661)]:
    dp = g // (tp * pp * cp)
    lay = "dp=%d,tp=%d,pp=%d,cp=%d,zero=%d,sp=%d,async_tp=%d,mbs=%d,m=%d,recompute=none" % (
        dp, tp, pp, cp, 3 if fsdp else 1, int(tp > 1), int(tp > 1), mbs, B // (dp * mbs))
    if pp > 1:
        lay += ",schedule=%s" % ("interleaved,v=%d" % vp if vp > 1 else "1f1b")
    if cp > 1:
        lay += ",cp_impl=ring"
    add(id="mbridge-%s" % name, src="mbridge", family="megatron", system=sysname, model=model, gpus=g, batch=B,
        seq=s, prec="fp8", layout=lay, stack={"attention": "cudnn", "grad_reduce": "fp32", "fp8_params": 1}, tps=tps,
        part="held")

# ---- torchtitan ------------------------------------------------------------
# FSDP2 (zero=3, parameters resharded after the forward), bf16 compute with
# FP32 gradient reduce-scatter (MixedPrecisionPolicy reduce_dtype float32),
# PyTorch SDPA's FlashAttention-2 kernel, no dropout, sequence 8192 unless
# given; "selective op" AC = recompute=op, "selective layer" (every other
# block) = recompute=layer2, "full" = full.
TT = {"attention": "flash2", "grad_reduce": "fp32", "elementwise": "eager"}

# 2024-04 (64 A100 80GB, eager, local batch 1 or 2). Calibration.
for (name, model, s, lbs, ac, wps, grp) in [
        ("l3-8b-layer", "llama3-8b", 8192, 1, "layer2", 2904, "tt2404-l3-8b"),
        ("l3-8b-op", "llama3-8b", 8192, 1, "op", 2973, "tt2404-l3-8b"),
        ("l3-70b-full", "llama3-70b", 8192, 1, "full", 331, None),
        ("l2-13b-none", "llama2-13b", 4096, 2, "none", 2162, "tt2404-l2-13b"),
        ("l2-13b-layer", "llama2-13b", 4096, 2, "layer2", 1914, "tt2404-l2-13b"),
        ("l2-13b-op", "llama2-13b", 4096, 2, "op", 1904, "tt2404-l2-13b"),
        ("l2-70b-op", "llama2-70b", 4096, 1, "op", 355, "tt2404-l2-70b"),
        ("l2-70b-full", "llama2-70b", 4096, 2, "full", 353, "tt2404-l2-70b")]:
    add(id="tt2404-%s" % name, src="tt2404", family="fsdp", system="meta-a100", model=model, gpus=64,
        batch=64 * lbs, seq=s, prec="bf16", layout="dp=64,zero=3,mbs=%d,m=1,recompute=%s" % (lbs, ac), stack=TT,
        tps=wps, part="cal", group=grp)

# 2024-08: Llama 3.1 405B, 128 H100 (HBM2e), FSDP 16 x TP 8, local batch 2,
# full AC; bf16, Float8, Float8 + async TP (torch.compile with Float8). Held.
for (name, prec, atp, fused, wps) in [("bf16", "bf16", 0, 0, 109), ("fp8", "fp8", 0, 1, 177),
                                      ("fp8-asynctp", "fp8", 1, 1, 185)]:
    add(id="tt2408-405b-%s" % name, src="tt2408", family="fsdp", system="grandteton", model="llama3-405b",
        gpus=128, batch=32, seq=8192, prec=prec,
        layout="dp=16,tp=8,zero=3,sp=1,async_tp=%d,mbs=2,m=1,recompute=full" % atp,
        stack=dict(TT, fused=fused), tps=wps, part="held", group="tt2408-405b")

# 2024-12 (Grand Teton H100 96GB). Held out.
for (name, g, prec, fused, tps, mem, grp) in [
        ("t1-eager", 8, "bf16", 0, 5762, 82.4, "tt2412-t1"), ("t1-compile", 8, "bf16", 1, 6667, 77.0, "tt2412-t1"),
        ("t1-fp8", 8, "fp8", 1, 8532, 76.8, "tt2412-t1"), ("t3-eager", 128, "bf16", 0, 5605, 67.0, "tt2412-t3"),
        ("t3-compile", 128, "bf16", 1, 6514, 62.0, "tt2412-t3"), ("t3-fp8", 128, "fp8", 1, 8380, 61.8, "tt2412-t3")]:
    add(id="tt2412-8b-%s" % name, src="tt2412", family="fsdp", system="grandteton", model="llama3-8b", gpus=g,
        batch=2 * g, seq=8192, prec=prec, layout="dp=%d,zero=3,mbs=2,m=1,recompute=op" % g,
        stack=dict(TT, fused=fused), tps=tps, mem=mem * 2**30 / 1e9, part="held", group=grp)
for (fsdp, cp, s, tps, mem) in [(8, 1, 32768, 3890, 83.9), (4, 2, 65536, 2540, 84.2), (2, 4, 131072, 1071, 84.0),
                                (1, 8, 262144, 548, 84.5)]:
    lay = "dp=%d,cp=%d,zero=3,mbs=1,m=1,recompute=full" % (fsdp, cp)
    if cp > 1:
        lay += ",cp_impl=allgather"
    add(id="tt2412-8b-cp%d" % cp, src="tt2412", family="fsdp", system="grandteton", model="llama3-8b", gpus=8,
        batch=fsdp, seq=s, prec="fp8", layout=lay, stack=dict(TT, fused=1), tps=tps, mem=mem * 2**30 / 1e9,
        part="held")
for (atp, tps, mem) in [(0, 829, 71.9), (1, 876, 67.6)]:
    add(id="tt2412-70b-tp8-atp%d" % atp, src="tt2412", family="fsdp", system="grandteton", model="llama3-70b",
        gpus=256, batch=512, seq=8192, prec="fp8",
        layout="dp=32,tp=8,zero=3,sp=1,async_tp=%d,mbs=16,m=1,recompute=full" % atp, stack=dict(TT, fused=1),
        tps=tps, mem=mem * 2**30 / 1e9, part="held", group="tt2412-t4")
# With PP, torchtitan's apply_fsdp does not reshard after forward ("For PP,
# do not reshard after forward to avoid per-microbatch all-gathers":
# reshard_after_forward = False when pp_enabled, torchtitan
# models/llama3/infra/parallelize.py): the stage's parameters stay gathered
# over the micro-batches, gradients reduce-scattered: zero=2.
for (sched, tps, mem) in [("1f1b", 100, 82.5), ("interleaved,v=2", 128, 72.7)]:
    add(id="tt2412-405b-pp-%s" % sched.split(",")[0], src="tt2412", family="fsdp", system="grandteton",
        model="llama3-405b", gpus=512, batch=256, seq=8192, prec="fp8",
        layout="dp=8,tp=8,pp=8,zero=2,sp=1,async_tp=1,mbs=4,m=8,recompute=full,schedule=%s" % sched,
        stack=dict(TT, fused=1), tps=tps, mem=mem * 2**30 / 1e9, part="held", group="tt2412-t5")
for (fsdp, cp, s, tps, mem) in [(8, 1, 32768, 76, 75.3), (4, 2, 65536, 47, 75.9), (2, 4, 131072, 31, 77.1),
                                (1, 8, 262144, 16, 84.9)]:
    lay = "dp=%d,tp=8,pp=8,cp=%d,zero=2,sp=1,async_tp=1,mbs=1,m=8,recompute=full,schedule=1f1b" % (fsdp, cp)
    if cp > 1:
        lay += ",cp_impl=allgather"
    add(id="tt2412-405b-cp%d" % cp, src="tt2412", family="fsdp", system="grandteton", model="llama3-405b",
        gpus=512, batch=8 * fsdp, seq=s, prec="fp8", layout=lay, stack=dict(TT, fused=1), tps=tps,
        mem=mem * 2**30 / 1e9, part="held")

# 2025-06: vanilla vs async TP (compile; bf16 and Float8 tensorwise). Held.
for (model, g, dp, lbs, ac, prec, van, asy) in [
        ("llama3-70b", 256, 32, 16, "full", "bf16", 597.3, 652.4),
        ("llama3-70b", 256, 32, 16, "full", "fp8", 809.8, 942.4),
        ("llama3-8b", 64, 8, 12, "op", "bf16", 4378, 4809.4),
        ("llama3-8b", 64, 8, 12, "op", "fp8", 5078.1, 5570.1)]:
    for (atp, tps) in ((0, van), (1, asy)):
        add(id="tt2506-%s-%s-atp%d" % (model, prec, atp), src="tt2506", family="fsdp", system="grandteton",
            model=model, gpus=g, batch=dp * lbs, seq=8192, prec=prec,
            layout="dp=%d,tp=8,zero=3,sp=1,async_tp=%d,mbs=%d,m=1,recompute=%s" % (dp, atp, lbs, ac),
            stack=dict(TT, fused=1), tps=tps, part="held", group="tt2506-%s-%s" % (model, prec))

# 2025-06: H200, Llama 3.1 8B, FSDP + compile + Float8, local batch 2,
# selective op AC (the llama3_8b.toml default). Held out.
for (nodes, tps, mem) in [(4, 10938, 47.96), (8, 10753, 46.97)]:
    g = 8 * nodes
    add(id="tth200-8b-%d" % g, src="tth200", family="fsdp", system="whitefiber-h200", model="llama3-8b", gpus=g,
        batch=2 * g, seq=8192, prec="fp8", layout="dp=%d,zero=3,mbs=2,m=1,recompute=op" % g,
        stack=dict(TT, fused=1), tps=tps, mem=mem * 2**30 / 1e9, part="held")

# ---- llm-foundry (MPT, Composer + PyTorch FSDP) --------------------------
# (model, seq, gpus, micro-batch, grad accum, tokens/s/GPU, gradient reduce
# dtype (mixed_precision DEFAULT: fp32, PURE: bf16), ZeRO stage (FULL_SHARD
# 3, SHARD_GRAD_OP 2), activation checkpointing). The Triton FlashAttention
# kernel (attn_impl triton), no dropout, eager PyTorch; the loss is
# ComposerMPTCausalLM's default loss_fn 'fused_crossentropy', flash-attn's
# cross-entropy kernel on the bf16 logits (llmfoundry/models/mpt/
# modeling_mpt.py at 0085285a): --logits bf16.
# A100 80GB and H100 BF16 (8-64 GPUs): calibration; A100 40GB, H100 at 128+
# GPUs and H100 FP8 (Transformer Engine): held out.
from plan_runs_foundry import (FOUNDRY_A100_40, FOUNDRY_A100_80, FOUNDRY_H100,  # noqa: E402
                               FOUNDRY_H100_FP8, FOUNDRY_H100_LARGE)

for (rows, system, prec, part, tag) in [(FOUNDRY_A100_80, "mosaic-a100-80", "bf16", "cal", "a100-80"),
                                        (FOUNDRY_H100, "mosaic-h100", "bf16", "cal", "h100"),
                                        (FOUNDRY_A100_40, "mosaic-a100-40", "bf16", "held", "a100-40"),
                                        (FOUNDRY_H100_LARGE, "mosaic-h100", "bf16", "held", "h100-large"),
                                        (FOUNDRY_H100_FP8, "mosaic-h100", "fp8", "held", "h100-fp8")]:
    for i, (name, s, g, mbs, ga, tps, red, zero, ac) in enumerate(rows):
        add(id="foundry-%s-%d-%s-s%d-g%d" % (tag, i, name, s, g), src="foundry", family="fsdp", system=system,
            model=mpt_model(name, s), gpus=g, batch=g * mbs * ga, seq=s, prec=prec,
            layout="dp=%d,zero=%s,mbs=%d,m=%d,recompute=%s" % (g, zero, mbs, ga, "full" if ac else "none"),
            stack={"attention": "triton", "grad_reduce": red, "logits": "bf16"}, tps=tps, part=part,
            group="foundry-%s-s%d-g%d-mbs%d" % (name, s, g, mbs) if tag.startswith("h100") and g == 8 else None)

ids = [r["id"] for r in RUNS]
assert len(ids) == len(set(ids)), "duplicate run ids"
