"""GPT-2 in plain PyTorch, written from the architecture: the oracle for loom.

Parameters live in a flat dict keyed by Hugging Face GPT-2 names (no "transformer."
prefix); linear weights are stored [in, out] as HF's Conv1D does, so y = x @ W + b.

    x = wte[idx] + wpe[0:T]
    for each of n_layer blocks (pre-LN):
        x = x + attn(ln_1(x))      causal multi-head, fused c_attn -> q | k | v
        x = x + mlp(ln_2(x))       c_fc -> GELU (tanh approximation) -> c_proj
    logits = ln_f(x) @ wte.T       LM head tied to the token embedding
    loss = mean cross-entropy over all B*T positions

Mixture of experts (loom's include/loom/moe.h, when n_expert > 0): the MLP of
every moe_every-th block becomes a router (C, E) and E experts; each token goes
to its top_k experts by softmax probability, gates renormalised if norm_topk;
with capacity_factor > 0 an expert takes at most ceil(f N top_k / E) choices of
the micro-batch, admitted choice-major then by position, the rest dropped; the
loss adds aux_coef E sum_e (chosen_e / N) mean(p_e) and z_coef mean(lse^2) per
MoE block.

Nothing here is parallel; everything runs in one process on the CPU.
"""

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

LN_EPS = 1e-5


@dataclass(frozen=True)
class Config:
    n_layer: int
    n_head: int
    n_embd: int
    vocab_size: int
    n_positions: int
    n_expert: int = 0
    top_k: int = 2
    moe_every: int = 1
    expert_hidden: int = 0
    norm_topk: bool = True
    aux_coef: float = 0.0
    z_coef: float = 0.0
    capacity_factor: float = 0.0

    def is_moe(self, layer):
        return self.n_expert > 0 and (layer + 1) % self.moe_every == 0

    def hidden(self):
        return self.expert_hidden or 4 * self.n_embd

    def check(self):
        """Raise ValueError naming the numbers if the config is unusable."""
        for k in ("n_layer", "n_head", "n_embd", "vocab_size", "n_positions"):
            if getattr(self, k) <= 0:
                raise ValueError("%s=%d must be positive" % (k, getattr(self, k)))
        if self.n_embd % self.n_head:
            raise ValueError("n_head=%d does not divide n_embd=%d" % (self.n_head, self.n_embd))


def param_shapes(cfg):
    """Ordered {HF name: shape} for every parameter of the model."""
    C, V = cfg.n_embd, cfg.vocab_size
    shapes = {"wte.weight": (V, C), "wpe.weight": (cfg.n_positions, C)}
    for i in range(cfg.n_layer):
        p = "h.%d." % i
        shapes.update({
            p + "ln_1.weight": (C,), p + "ln_1.bias": (C,),
            p + "attn.c_attn.weight": (C, 3 * C), p + "attn.c_attn.bias": (3 * C,),
            p + "attn.c_proj.weight": (C, C), p + "attn.c_proj.bias": (C,),
            p + "ln_2.weight": (C,), p + "ln_2.bias": (C,),
        })
        if cfg.is_moe(i):
            H = cfg.hidden()
            shapes[p + "mlp.router.weight"] = (C, cfg.n_expert)
            for e in range(cfg.n_expert):
                q = p + "mlp.experts.%d." % e
                shapes.update({q + "c_fc.weight": (C, H), q + "c_fc.bias": (H,),
                               q + "c_proj.weight": (H, C), q + "c_proj.bias": (C,)})
            continue
        shapes.update({
            p + "mlp.c_fc.weight": (C, 4 * C), p + "mlp.c_fc.bias": (4 * C,),
            p + "mlp.c_proj.weight": (4 * C, C), p + "mlp.c_proj.bias": (C,),
        })
    shapes.update({"ln_f.weight": (C,), "ln_f.bias": (C,)})
    return shapes


def init_params(cfg, seed=0, dtype=np.float32, random_affine=False):
    """GPT-2-style initial parameters as {name: numpy array}.

    Weights ~ N(0, 0.02), residual projections (c_proj) ~ N(0, 0.02/sqrt(2L)),
    biases 0, LayerNorm gain 1. random_affine=True also draws biases ~ N(0, 0.02)
    and LayerNorm gains ~ 1 + N(0, 0.1) so every parameter influences the
    output (used by the oracle self-test).
    """
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in param_shapes(cfg).items():
        if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name == "ln_f.weight":
            a = np.ones(shape) + (rng.normal(0.0, 0.1, shape) if random_affine else 0.0)
        elif len(shape) == 1:
            a = rng.normal(0.0, 0.02, shape) if random_affine else np.zeros(shape)
        else:
            std = 0.02 / math.sqrt(2 * cfg.n_layer) if name.endswith("c_proj.weight") else 0.02
            a = rng.normal(0.0, std, shape)
        out[name] = np.asarray(a, dtype=dtype)
    return out


def params_from_numpy(arrays, cfg, dtype=torch.float32, requires_grad=True):
    """{name: torch leaf tensor} at dtype from {name: numpy array}.

    Raises KeyError naming a missing parameter and ValueError naming a
    parameter whose shape differs from the config's.
    """
    params = {}
    for name, shape in param_shapes(cfg).items():
        if name not in arrays:
            raise KeyError("missing parameter %s %s" % (name, shape))
        a = np.asarray(arrays[name])
        if tuple(a.shape) != tuple(shape):
            raise ValueError("parameter %s has shape %s, expected %s" % (name, a.shape, shape))
        t = torch.tensor(a, dtype=dtype)
        t.requires_grad_(requires_grad)
        params[name] = t
    return params


def _linear(x, w, b):
    # Conv1D convention: w is (in, out)
    return torch.matmul(x, w) + b


def _attention(x, p, pre, n_head):
    B, T, C = x.shape
    HS = C // n_head
    qkv = _linear(x, p[pre + "c_attn.weight"], p[pre + "c_attn.bias"])  # (B, T, 3C)
    q, k, v = qkv.split(C, dim=2)                                         # (B, T, C) each
    q = q.view(B, T, n_head, HS).transpose(1, 2)                          # (B, NH, T, HS)
    k = k.view(B, T, n_head, HS).transpose(1, 2)
    v = v.view(B, T, n_head, HS).transpose(1, 2)
    att = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(HS))   # (B, NH, T, T)
    mask = torch.ones(T, T, dtype=torch.bool).triu(1)                    # True above diagonal
    att = att.masked_fill(mask, float("-inf"))
    att = torch.softmax(att, dim=-1)
    y = torch.matmul(att, v)                                              # (B, NH, T, HS)
    y = y.transpose(1, 2).contiguous().view(B, T, C)
    return _linear(y, p[pre + "c_proj.weight"], p[pre + "c_proj.bias"])


def _mlp(x, p, pre):
    h = _linear(x, p[pre + "c_fc.weight"], p[pre + "c_fc.bias"])          # (B, T, 4C)
    h = F.gelu(h, approximate="tanh")
    return _linear(h, p[pre + "c_proj.weight"], p[pre + "c_proj.bias"])  # (B, T, C)


def moe_capacity(cfg, N):
    if cfg.capacity_factor <= 0:
        return N
    return min(N, int(math.ceil(float(cfg.capacity_factor) * N * cfg.top_k / cfg.n_expert)))


def _moe(x, p, pre, cfg, stats):
    """The MoE MLP of x (B, T, C) and the block's router loss (aux + z).
    stats (a list) gets {"chosen", "kept"} per-expert counts."""
    B, T, C = x.shape
    N, E, k = B * T, cfg.n_expert, cfg.top_k
    xf = x.reshape(N, C)
    logits = xf @ p[pre + "router.weight"]                               # (N, E)
    probs = torch.softmax(logits, dim=-1)
    top_p, top_i = torch.topk(probs, k, dim=-1)                          # (N, k)
    gate = top_p / top_p.sum(-1, keepdim=True) if cfg.norm_topk else top_p
    sel = top_i.numpy()
    cap = moe_capacity(cfg, N)
    kept_n = np.zeros(E, dtype=np.int64)
    kept = np.zeros((N, k), dtype=bool)
    for j in range(k):                  # choice-major, then token order
        for i in range(N):
            if kept_n[sel[i, j]] < cap:
                kept_n[sel[i, j]] += 1
                kept[i, j] = True
    out = torch.zeros_like(xf)
    for e in range(E):
        ii, jj = np.nonzero((sel == e) & kept)
        if len(ii) == 0:
            continue
        q = pre + "experts.%d." % e
        rows = torch.from_numpy(ii)
        h = F.gelu(_linear(xf[rows], p[q + "c_fc.weight"], p[q + "c_fc.bias"]), approximate="tanh")
        y = _linear(h, p[q + "c_proj.weight"], p[q + "c_proj.bias"])
        out = out.index_add(0, rows, y * gate[rows, torch.from_numpy(jj)].unsqueeze(1))
    chosen = np.bincount(sel.ravel(), minlength=E)
    f = torch.tensor(chosen / N, dtype=probs.dtype)
    aux = cfg.aux_coef * E * (f * probs.mean(0)).sum()
    z = cfg.z_coef * (torch.logsumexp(logits, dim=-1) ** 2).mean()
    stats.append({"chosen": chosen, "kept": kept_n})
    return out.view(B, T, C), aux + z


def forward(params, cfg, idx, targets=None, moe_stats=None):
    """Logits (B, T, V) and, if targets is given, the mean cross-entropy loss.

    idx, targets: integer tensors (B, T) with values in [0, vocab_size);
    T must not exceed n_positions.
    """
    B, T = idx.shape
    if T > cfg.n_positions:
        raise ValueError("T=%d exceeds n_positions=%d" % (T, cfg.n_positions))
    C = cfg.n_embd
    p = params
    router_loss = 0.0
    x = p["wte.weight"][idx.long()] + p["wpe.weight"][:T]                 # (B, T, C)
    for i in range(cfg.n_layer):
        pre = "h.%d." % i
        h = F.layer_norm(x, (C,), p[pre + "ln_1.weight"], p[pre + "ln_1.bias"], LN_EPS)
        x = x + _attention(h, p, pre + "attn.", cfg.n_head)
        h = F.layer_norm(x, (C,), p[pre + "ln_2.weight"], p[pre + "ln_2.bias"], LN_EPS)
        if cfg.is_moe(i):
            y, r = _moe(h, p, pre + "mlp.", cfg, moe_stats if moe_stats is not None else [])
            x = x + y
            router_loss = router_loss + r
        else:
            x = x + _mlp(h, p, pre + "mlp.")
    x = F.layer_norm(x, (C,), p["ln_f.weight"], p["ln_f.bias"], LN_EPS)
    logits = torch.matmul(x, p["wte.weight"].t())                        # (B, T, V)
    loss = None
    if targets is not None:
        loss = F.cross_entropy(logits.reshape(B * T, -1), targets.reshape(B * T).long()) + router_loss
    return logits, loss


def make_adamw(params, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
    """torch.optim.AdamW with decay on ndim >= 2 params, none on the others."""
    decay = [t for t in params.values() if t.dim() >= 2]
    no_decay = [t for t in params.values() if t.dim() < 2]
    groups = [{"params": decay, "weight_decay": weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=tuple(betas), eps=eps)


def train_step(params, cfg, opt, idx, targets, clip=None, autocast_bf16=False):
    """One step: forward, backward, optional clip_grad_norm_(clip), opt.step, zero_grad.

    autocast_bf16: the forward under torch.autocast("cpu", torch.bfloat16)
    (PyTorch's bf16 mixed precision: matmuls in bf16, fp32 master weights).
    Returns (loss, grad_norm) as Python floats; grad_norm is the pre-clip total
    norm when clip is given, else None.
    """
    if autocast_bf16:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            _, loss = forward(params, cfg, idx, targets)
        loss = loss.float()
    else:
        _, loss = forward(params, cfg, idx, targets)
    loss.backward()
    norm = None
    if clip is not None:
        norm = float(torch.nn.utils.clip_grad_norm_(list(params.values()), clip))
    opt.step()
    opt.zero_grad(set_to_none=True)
    return float(loss), norm
