"""A float64 PyTorch reference of loom's deepseek_v3 model (transformers 4.40
has no DeepSeek-V3): Llama attention and norms from transformers'
LlamaForCausalLM, and from block first_k_dense_replace on, DeepSeek-V3's MoE
MLP in place of the dense one:

    scores = sigmoid(x @ gate.weight^T)                      (N, E)
    chosen = top num_experts_per_tok of scores + e_score_correction_bias
             (the bias only chooses)
    w      = scores at the chosen, / their sum if norm_topk_prob,
             times routed_scaling_factor
    out    = sum_j w_j expert_{chosen_j}(x) + shared_experts(x)

every expert and the shared experts a SwiGLU MLP (gate_proj, up_proj,
down_proj; the shared one n_shared_experts * moe_intermediate_size wide).
Group-limited routing is not modelled (n_group = topk_group). Tensor names
are the Hugging Face DeepSeek-V3 ones, so a directory written here
(config.json + model.safetensors) is what loom reads with --model DIR, and
one loom writes loads back here with no missing or unexpected keys.
"""
import json
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
import transformers
from safetensors.torch import load_file, save_file

DEFAULTS = dict(n_shared_experts=1, routed_scaling_factor=2.5, norm_topk_prob=True, first_k_dense_replace=3,
                n_group=8, topk_group=4, aux_free_bias_rate=0.001)
MOE_KEYS = ("n_routed_experts", "n_shared_experts", "num_experts_per_tok", "moe_intermediate_size",
            "routed_scaling_factor", "norm_topk_prob", "first_k_dense_replace", "n_group", "topk_group",
            "aux_free_bias_rate", "scoring_func", "topk_method")


class SwiGLU(nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.gate_proj = nn.Linear(C, H, bias=False)
        self.up_proj = nn.Linear(C, H, bias=False)
        self.down_proj = nn.Linear(H, C, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Gate(nn.Module):
    def __init__(self, E, C):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(E, C))
        self.register_buffer("e_score_correction_bias", torch.zeros(E))


class DeepseekMoE(nn.Module):
    def __init__(self, C, d):
        super().__init__()
        E, H = d["n_routed_experts"], d["moe_intermediate_size"]
        self.k, self.norm, self.scale = d["num_experts_per_tok"], d["norm_topk_prob"], d["routed_scaling_factor"]
        self.gate = Gate(E, C)
        self.experts = nn.ModuleList([SwiGLU(C, H) for _ in range(E)])
        ns = d["n_shared_experts"]
        self.shared_experts = SwiGLU(C, H * ns) if ns else None
        self.chosen = None  # (E) tokens that chose each expert in the last forward

    def forward(self, x):
        shape = x.shape
        h = x.reshape(-1, shape[-1])
        scores = torch.sigmoid(F.linear(h, self.gate.weight))
        choice = scores.detach() + self.gate.e_score_correction_bias.to(scores.dtype)
        idx = torch.topk(choice, self.k, dim=-1).indices
        w = scores.gather(1, idx)
        if self.norm:
            w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
        w = w * self.scale
        out = torch.zeros_like(h)
        E = len(self.experts)
        self.chosen = torch.bincount(idx.reshape(-1), minlength=E)
        for e in range(E):
            tok, slot = torch.nonzero(idx == e, as_tuple=True)
            if len(tok):
                out = out.index_add(0, tok, w[tok, slot, None] * self.experts[e](h[tok]))
        if self.shared_experts is not None:
            out = out + self.shared_experts(h)
        return out.reshape(shape)


def _llama_config(d):
    keep = {k: v for k, v in d.items() if k not in MOE_KEYS and k not in ("model_type", "architectures")}
    cfg = transformers.LlamaConfig(**keep)
    cfg._attn_implementation = "eager"
    return cfg


def build(d, dtype=torch.float64):
    """The model of config dict d (model_type deepseek_v3), zero MoE weights."""
    full = dict(DEFAULTS)
    full.update(d)
    model = transformers.LlamaForCausalLM(_llama_config(full)).to(dtype)
    for l, layer in enumerate(model.model.layers):
        if l >= full["first_k_dense_replace"]:
            layer.mlp = DeepseekMoE(full["hidden_size"], full).to(dtype)
    return model


def make(out_dir, seed=0, **keys):
    """A random deepseek_v3 model (every weight and the selection biases
    random, so each matters) written to out_dir as config.json + model.safetensors."""
    d = dict(model_type="deepseek_v3", architectures=["DeepseekV3ForCausalLM"], scoring_func="sigmoid",
             topk_method="noaux_tc", **keys)
    torch.manual_seed(seed)
    model = build(d, torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(0.3 * torch.randn_like(p))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.1 * torch.randn_like(b))
    os.makedirs(out_dir, exist_ok=True)
    save(model, d, out_dir)
    return out_dir


def save(model, d, out_dir):
    sd = {k: v.detach().float().contiguous() for k, v in model.state_dict().items() if "rotary_emb" not in k}
    save_file(sd, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(d, f, indent=2)


def load(model_dir, dtype=torch.float64):
    """The directory's model in float64; its tensors must be exactly the model's (strict)."""
    with open(os.path.join(model_dir, "config.json")) as f:
        d = json.load(f)
    model = build(d, dtype)
    sd = load_file(os.path.join(model_dir, "model.safetensors"))
    missing, unexpected = model.load_state_dict(sd, strict=False)
    missing = [k for k in missing if "rotary_emb" not in k]
    if missing or unexpected:
        raise ValueError("%s: missing %s, unexpected %s" % (model_dir, missing, unexpected))
    if model.config.tie_word_embeddings:
        model.tie_weights()
    return model.to(dtype)
