"""Vanilla recurrent networks and why recurrence is not enough (notebook 01).

- ``rnn_step`` / ``rnn_forward``: ``h_t = tanh(W_hh h_{t-1} + W_xh x_t + b_h)``, batch first;
- ``jacobian_norms``: how much ``h_T`` still depends on each earlier state ``h_t``;
- ``random_rnn_weights``: weights with a chosen spectral radius of ``W_hh``;
- ``time_recurrence``: wall time of the sequential loop against one batched product;
- ``FixedContextSeq2Seq``: an encoder-decoder whose only link is the context ``c = h_n``.

Weight matrices follow ``nn.Linear``: ``W_xh (H, D_in)`` maps ``x (B, D_in)`` to
``x @ W_xh.T`` of shape ``(B, H)``.
"""

from __future__ import annotations

import time
from typing import Sequence

import torch
from torch import Tensor, nn

from .cost import count_flops, count_operations
from .device import torch_threads

__all__ = [
    "rnn_step", "rnn_forward", "jacobian_norms", "random_rnn_weights", "spectral_radius",
    "time_recurrence", "FixedContextSeq2Seq", "ContextReadout",
]


def _check_rnn_shapes(x: Tensor, h: Tensor, W_xh: Tensor, W_hh: Tensor, b_h: Tensor) -> None:
    H = W_hh.shape[0]
    if W_hh.dim() != 2 or W_hh.shape != (H, H):
        raise ValueError(f"W_hh must be square (H, H), got {tuple(W_hh.shape)}")
    if W_xh.dim() != 2 or W_xh.shape[0] != H:
        raise ValueError(f"W_xh must have shape (H={H}, D_in), got {tuple(W_xh.shape)}")
    if x.shape[-1] != W_xh.shape[1]:
        raise ValueError(f"inputs have {x.shape[-1]} features but W_xh expects D_in={W_xh.shape[1]}")
    if h.shape[-1] != H:
        raise ValueError(f"hidden state has size {h.shape[-1]}, expected H={H}")
    if b_h.shape != (H,):
        raise ValueError(f"b_h must have shape (H={H},), got {tuple(b_h.shape)}")


def rnn_step(x_t: Tensor, h_prev: Tensor, W_xh: Tensor, W_hh: Tensor, b_h: Tensor) -> Tensor:
    """One step ``h_t = tanh(W_hh h_{t-1} + W_xh x_t + b_h)``.

    Shapes: ``x_t (B, D_in)``, ``h_prev (B, H)``, ``W_xh (H, D_in)``, ``W_hh (H, H)``,
    ``b_h (H,)``; returns ``h_t (B, H)``.
    """
    _check_rnn_shapes(x_t, h_prev, W_xh, W_hh, b_h)
    return torch.tanh(h_prev @ W_hh.T + x_t @ W_xh.T + b_h)


def rnn_forward(X: Tensor, h0: Tensor, W_xh: Tensor, W_hh: Tensor, b_h: Tensor) -> Tensor:
    """Run the RNN over a batch of sequences and return every hidden state.

    Shapes: ``X (B, T, D_in)``, ``h0 (B, H)``; returns ``H_all (B, T, H)`` whose entry
    ``[:, t]`` is the state after reading ``X[:, t]``.
    """
    if X.dim() != 3:
        raise ValueError(f"X must have shape (B, T, D_in), got {tuple(X.shape)}")
    _check_rnn_shapes(X, h0, W_xh, W_hh, b_h)
    h = h0
    states = []
    for t in range(X.shape[1]):
        h = rnn_step(X[:, t], h, W_xh, W_hh, b_h)
        states.append(h)
    return torch.stack(states, dim=1)


def jacobian_norms(X: Tensor, h0: Tensor, W_xh: Tensor, W_hh: Tensor, b_h: Tensor) -> Tensor:
    """Frobenius norms of ``∂h_T/∂h_t`` for ``t = 1..T`` for one sequence.

    Shapes: ``X (T, D_in)``, ``h0 (H,)``; returns ``norms (T,)``. Since
    ``∂h_{t+1}/∂h_t = diag(1 - h_{t+1}²) W_hh``, the Jacobian is the product of these
    factors from ``t+1`` to ``T``; the last entry is ``‖I‖_F = √H``.
    """
    if X.dim() != 2 or h0.dim() != 1:
        raise ValueError(f"jacobian_norms takes one sequence: X (T, D_in) and h0 (H,), got X {tuple(X.shape)}, h0 {tuple(h0.shape)}")
    hs = rnn_forward(X[None], h0[None], W_xh, W_hh, b_h)[0]  # (T, H): h_1..h_T
    T, H = hs.shape
    J = torch.eye(H, dtype=hs.dtype, device=hs.device)
    norms = [J.norm()]
    for t in range(T - 1, 0, -1):  # multiply by ∂h_{t+1}/∂h_t, t = T-1 .. 1 (1-based)
        J = J @ ((1 - hs[t] ** 2)[:, None] * W_hh)
        norms.append(J.norm())
    return torch.stack(norms[::-1])


def spectral_radius(W: Tensor) -> float:
    """Largest absolute eigenvalue of a square matrix."""
    return float(torch.linalg.eigvals(W.detach().double().cpu()).abs().max())


def random_rnn_weights(input_size: int, hidden_size: int, radius: float, seed: int = 0,
                       dtype: torch.dtype = torch.float64) -> dict[str, Tensor]:
    """Random ``W_xh (H, D_in)``, ``W_hh (H, H)`` scaled to spectral radius ``radius``, and
    ``b_h (H,)`` (zeros), as a dict of keyword arguments for the RNN functions."""
    if radius <= 0:
        raise ValueError(f"radius must be positive, got {radius}")
    g = torch.Generator().manual_seed(seed)
    W_hh = torch.randn(hidden_size, hidden_size, generator=g, dtype=torch.float64)
    W_hh = W_hh * (radius / spectral_radius(W_hh))
    W_xh = torch.randn(hidden_size, input_size, generator=g, dtype=torch.float64) / input_size ** 0.5
    return {"W_xh": W_xh.to(dtype), "W_hh": W_hh.to(dtype), "b_h": torch.zeros(hidden_size, dtype=dtype)}


def time_recurrence(lengths: Sequence[int], batch_size: int = 1, hidden_size: int = 128,
                    repeats: int = 5, seed: int = 0, num_threads: int | None = 1) -> dict[str, list[float]]:
    """Median wall time (seconds) of the sequential RNN loop and of one batched matrix
    product over all positions (what a layer without recurrence can do), per length, and
    what each computes, counted (the same on any machine): its floating-point operations
    (:func:`course_lib.cost.count_flops`, equal for both) and the PyTorch operations it runs
    one after another (:func:`course_lib.cost.count_operations`: a few per step for the
    loop, a few in all for the product).

    Both run with ``num_threads`` CPU threads (restored afterwards; ``None`` keeps the
    current setting), so that the comparison measures the dependency between steps,
    not the number of cores. Returns ``{"length": [...], "sequential": [...], "parallel":
    [...], "sequential_flops": [...], "parallel_flops": [...], "sequential_operations":
    [...], "parallel_operations": [...]}``.
    """
    with torch_threads(num_threads):
        return _time_recurrence(lengths, batch_size, hidden_size, repeats, seed)


def _time_recurrence(lengths: Sequence[int], batch_size: int, hidden_size: int, repeats: int,
                     seed: int) -> dict[str, list[float]]:
    g = torch.Generator().manual_seed(seed)
    W = {"W_xh": torch.randn(hidden_size, hidden_size, generator=g) / hidden_size ** 0.5,
         "W_hh": torch.randn(hidden_size, hidden_size, generator=g) / hidden_size ** 0.5,
         "b_h": torch.zeros(hidden_size)}
    keys = ("length", "sequential", "parallel", "sequential_flops", "parallel_flops", "sequential_operations",
            "parallel_operations")
    out: dict[str, list[float]] = {key: [] for key in keys}
    with torch.no_grad():
        for T in lengths:
            X = torch.randn(batch_size, T, hidden_size, generator=g)
            h0 = torch.zeros(batch_size, hidden_size)
            methods = {"sequential": lambda: rnn_forward(X, h0, **W),
                       "parallel": lambda: torch.tanh(X @ W["W_xh"].T + X @ W["W_hh"].T + W["b_h"])}
            times: dict[str, list[float]] = {name: [] for name in methods}
            for _ in range(repeats):
                for name, run in methods.items():
                    start = time.perf_counter()
                    run()
                    times[name].append(time.perf_counter() - start)
            out["length"].append(T)
            for name, run in methods.items():
                out[name].append(sorted(times[name])[len(times[name]) // 2])
                out[f"{name}_flops"].append(count_flops(run))
                out[f"{name}_operations"].append(count_operations(run))
    return out


class FixedContextSeq2Seq(nn.Module):
    """RNN encoder-decoder whose decoder only sees the context ``c = h_n``.

    ``cell`` is ``"rnn"`` (vanilla tanh RNN, the default) or ``"gru"``. The encoder reads the source; its final state ``c`` (at each sequence's true last
    token) initialises the decoder and is fed to it at every step, as in Cho et al.
    (2014): ``s_t = GRU([embedding(y_{t-1}); c], s_{t-1})`` and the output layer reads
    ``[s_t; c]``. The same ``c`` serves every output position: nothing else of the
    input reaches the decoder.

    - ``forward(src (B, T_in), src_mask (B, T_in), tgt_in (B, T_out)) -> logits (B, T_out, V_tgt)``
    - ``greedy(src, src_mask, max_len, bos_id) -> tokens (B, max_len)``
    """

    def __init__(self, src_vocab_size: int, tgt_vocab_size: int, emb_dim: int = 32, hidden_size: int = 128,
                 pad_id: int = 0, cell: str = "rnn") -> None:
        super().__init__()
        cells = {"rnn": nn.RNN, "gru": nn.GRU}
        if cell not in cells:
            raise ValueError(f"cell must be 'rnn' (vanilla tanh RNN) or 'gru', got {cell!r}")
        self.cell = cell
        self.src_emb = nn.Embedding(src_vocab_size, emb_dim, padding_idx=pad_id)
        self.tgt_emb = nn.Embedding(tgt_vocab_size, emb_dim, padding_idx=pad_id)
        self.encoder = cells[cell](emb_dim, hidden_size, batch_first=True)
        self.decoder = cells[cell](emb_dim + hidden_size, hidden_size, batch_first=True)
        self.out = nn.Linear(2 * hidden_size, tgt_vocab_size)

    def encode(self, src: Tensor, src_mask: Tensor) -> Tensor:
        """The context ``c (B, H)``: the encoder state after each sequence's last real token."""
        lengths = src_mask.sum(dim=1)
        if bool((lengths == 0).any()):
            raise ValueError("every source sequence needs at least one real token")
        packed = nn.utils.rnn.pack_padded_sequence(self.src_emb(src), lengths.cpu(), batch_first=True,
                                                   enforce_sorted=False)
        _, h_n = self.encoder(packed)
        return h_n[0]

    def _decode(self, y: Tensor, c: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        cs = c.unsqueeze(1).expand(-1, y.size(1), -1)
        states, state = self.decoder(torch.cat([self.tgt_emb(y), cs], dim=-1), state)
        return self.out(torch.cat([states, cs], dim=-1)), state

    def forward(self, src: Tensor, src_mask: Tensor, tgt_in: Tensor) -> Tensor:
        c = self.encode(src, src_mask)
        logits, _ = self._decode(tgt_in, c, c.unsqueeze(0).contiguous())
        return logits

    @torch.no_grad()
    def greedy(self, src: Tensor, src_mask: Tensor, max_len: int, bos_id: int) -> Tensor:
        """Decode ``max_len`` tokens, each step feeding back the most likely one."""
        c = self.encode(src, src_mask)
        state = c.unsqueeze(0).contiguous()
        y = torch.full((src.size(0), 1), bos_id, dtype=torch.long, device=src.device)
        tokens = []
        for _ in range(max_len):
            logits, state = self._decode(y, c, state)
            y = logits.argmax(dim=-1)
            tokens.append(y)
        return torch.cat(tokens, dim=1)


class ContextReadout(nn.Module):
    """What does ``c = h_n`` remember? Read each input position straight out of it.

    A vanilla tanh RNN encoder reads the input (all sequences of one length ``T``); the
    token at position ``t`` is then predicted from ``[c; p_t]`` alone by a small MLP
    (``p_t`` a learned position embedding). There is no decoder recurrence and nothing
    is fed back, so the accuracy at position ``t`` measures only how well ``c`` stores
    input ``t``.

    - ``forward(src (B, T)) -> logits (B, T, V)`` with ``T <= max_len``
    - ``loss(src)``: cross-entropy of reading ``src`` back out of its own context
    """

    def __init__(self, vocab_size: int, max_len: int, emb_dim: int = 32, hidden_size: int = 128) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, emb_dim)
        self.encoder = nn.RNN(emb_dim, hidden_size, batch_first=True)
        self.position = nn.Embedding(max_len, emb_dim)
        self.readout = nn.Sequential(nn.Linear(hidden_size + emb_dim, 128), nn.ReLU(), nn.Linear(128, vocab_size))

    def forward(self, src: Tensor) -> Tensor:
        B, T = src.shape
        if T > self.position.num_embeddings:
            raise ValueError(f"sequences of length {T} exceed max_len={self.position.num_embeddings}")
        _, h_n = self.encoder(self.embedding(src))
        c = h_n[0].unsqueeze(1).expand(B, T, -1)
        p = self.position.weight[:T].unsqueeze(0).expand(B, T, -1)
        return self.readout(torch.cat([c, p], dim=-1))

    def loss(self, src: Tensor) -> Tensor:
        logits = self(src)
        return nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), src.reshape(-1))

    @torch.no_grad()
    def per_position_accuracy(self, src: Tensor) -> Tensor:
        """``(T,)`` fraction of sequences whose token at each position is read back right."""
        return (self(src).argmax(dim=-1) == src).float().mean(dim=0)
