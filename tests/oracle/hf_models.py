"""Tiny Hugging Face models for loom's tests, made with transformers (no hub):
a config of each family, random weights (norms and biases too, so each one
matters), saved with save_pretrained as a directory loom reads with
--model DIR. Also loads such a directory back into transformers in float64
(eager attention), with Llama 3's rope scaling applied by hand where
transformers 4.40 does not know it."""
import json
import math
import os

import torch
import transformers

BASE = dict(hidden_size=32, intermediate_size=56, num_hidden_layers=2, num_attention_heads=4,
            vocab_size=67, max_position_embeddings=64, rms_norm_eps=1e-6, rope_theta=10000.0,
            tie_word_embeddings=False)
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 16}

# Qwen2-MoE: 4 experts of 24, top 2 (not renormalised), a shared expert of 40 with its sigmoid gate
QWEN2_MOE = dict(num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24,
                 shared_expert_intermediate_size=40, decoder_sparse_step=1, norm_topk_prob=False)

CLASSES = {"llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
           "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
           "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
           "mixtral": (transformers.MixtralConfig, transformers.MixtralForCausalLM),
           "qwen2_moe": (transformers.Qwen2MoeConfig, transformers.Qwen2MoeForCausalLM)}


def make(out_dir, arch, seed=0, **overrides):
    """A random model of `arch` (llama, mistral, qwen2) saved to out_dir.
    rope_scaling of type llama3 is written into config.json after saving
    (transformers 4.40 refuses it); load() applies it."""
    keys = dict(BASE)
    keys.update(overrides)
    scaling = keys.pop("rope_scaling", None)
    cfg_cls, model_cls = CLASSES[arch]
    torch.manual_seed(seed)
    model = model_cls(cfg_cls(**keys))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn_like(p))
            else:
                p.copy_(0.3 * torch.randn_like(p))
    model.save_pretrained(out_dir, safe_serialization=True)
    if scaling:
        path = os.path.join(out_dir, "config.json")
        with open(path) as f:
            d = json.load(f)
        d["rope_scaling"] = scaling
        with open(path, "w") as f:
            json.dump(d, f, indent=2)
    return out_dir


def llama3_inv_freq(dim, base, s):
    """Llama 3's scaled rotary frequencies, as transformers 4.43 computes them (float32)."""
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    old = s["original_max_position_embeddings"]
    lo, hi, factor = s["low_freq_factor"], s["high_freq_factor"], s["factor"]
    low_wl, high_wl = old / lo, old / hi
    wavelen = 2 * math.pi / inv_freq
    out = torch.where(wavelen > low_wl, inv_freq / factor, inv_freq)
    smooth = (old / wavelen - lo) / (hi - lo)
    smoothed = (1 - smooth) * out / factor + smooth * out
    medium = ~(wavelen < high_wl) * ~(wavelen > low_wl)
    return torch.where(medium, smoothed, out)


def load(model_dir, dtype=torch.float64):
    """The directory's model in transformers (eager attention), dtype."""
    with open(os.path.join(model_dir, "config.json")) as f:
        d = json.load(f)
    scaling = d.pop("rope_scaling", None)
    cfg_cls, model_cls = CLASSES[d["model_type"]]
    d.pop("model_type", None)
    cfg = cfg_cls(**d)
    cfg._attn_implementation = "eager"
    model = model_cls.from_pretrained(model_dir, config=cfg, torch_dtype=dtype)
    if scaling:
        head = cfg.hidden_size // cfg.num_attention_heads
        inv = llama3_inv_freq(head, cfg.rope_theta, scaling)
        for mod in model.modules():
            if hasattr(mod, "inv_freq"):
                mod.inv_freq = inv.clone()
    return model
