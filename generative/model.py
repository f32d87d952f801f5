"""TIGER-style generative next-item model over semantic-ID tokens (methods.md §5.2, §5.6).

Why an encoder–decoder and not a decoder-only model: the history (up to 20 items × L tokens)
is encoded once per user, and beam search then runs only ``L`` short decoder steps per beam,
each attending to that fixed memory; a decoder-only model would re-read the history in every
beam's sequence. It is also what TIGER (T5) and the reference code use, so our numbers read
against theirs.

Tokens (one vocabulary, shared by encoder and decoder)::

    0                     padding
    1 + offset_l + c      code c of level l, offset_l = level_sizes[0] + ... + level_sizes[l-1]
    1 + Σ level_sizes     BOS: the decoder's start token
    2 + Σ level_sizes     EOH: end of history, appended to every history (always visible, so an
                          all-padding history still has one token to attend to)

Encoder input: the history's item tokens, item by item (``[B, T·L + 1]``), each token embedded
as ``token + recency(item) + level(token)``; recency 0 is the most recent item. Decoder input:
``BOS, c_0, ..., c_{L-2}`` plus a position embedding; output position ``l`` predicts level
``l`` through its own head ``[level_sizes[l], D]``.

Token embedding: through TorchRec (:class:`TorchRecTokenEmbedding`, an ``EmbeddingCollection``
with one table ``sid_tokens`` fed by a ``KeyedJaggedTensor`` of the non-padding tokens), so the
generative head sits on the same embedding stack as the ranking models; it scripts as is. The
export converts it to :class:`PlainTokenEmbedding` (an ``nn.Embedding`` with the same weights,
checked for parity) so the served module needs only torch. ``embedding="plain"`` skips TorchRec:
use it on a CUDA machine that only has the CPU fbgemm build (stack.md), since the KJT path calls
``fbgemm::asynchronous_complete_cumsum``.

Decoding cost: every decoder layer's cross-attention keys/values are computed once per user
(:meth:`SIDTransformer.encode`) and the ``W`` beams of a row attend to that single memory, with
no per-beam copies; each level re-runs the decoder over the (at most ``L``-token) prefix, with
no self-attention cache since ``L`` is 3-4. On 2 CPU cores, 256 users x beam 20 x 4 levels
(12k items, D 128, 2 + 2 layers) decode in about 0.7 s. TIGER's hashed user-id token is not
used: the model (and the served call) reads item histories only.
"""

from __future__ import annotations

from typing import Any, ClassVar, List, Literal, Tuple

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torchrec.modules.embedding_configs import EmbeddingConfig
from torchrec.modules.embedding_modules import EmbeddingCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from generative.base import Catalog, NextItemModel
from generative.decoding import ConstrainedBeamSearch, PrefixTrie, check_codes

__all__ = [
    "EMBEDDING_KERNELS",
    "HISTORY_TOKENS",
    "MASKED_LOGIT",
    "HistoryTokens",
    "MeanTokenCrossEntropy",
    "PlainTokenEmbedding",
    "SIDDecoderLayer",
    "SIDRecommender",
    "SIDTransformer",
    "TokenEmbeddingKind",
    "TorchRecTokenEmbedding",
]

MASKED_LOGIT = -1e9  # logit of a code beyond a level's size (finite, so losses stay finite)
#: the token table: TorchRec's ``EmbeddingCollection`` or a plain ``nn.Embedding`` (see the module doc)
TokenEmbeddingKind = Literal["torchrec", "plain"]
#: one encoder position per SID ``token`` of the history (TIGER) or per history ``item``
HistoryTokens = Literal["token", "item"]
EMBEDDING_KERNELS: tuple[TokenEmbeddingKind, ...] = ("torchrec", "plain")
HISTORY_TOKENS: tuple[HistoryTokens, ...] = ("token", "item")
TOKEN_TABLE = "sid_tokens"


class TorchRecTokenEmbedding(nn.Module):
    """Token ids ``[B, S]`` (0 = padding) -> ``[B, S, D]`` through a TorchRec ``EmbeddingCollection``.

    The non-padding tokens of each row become one jagged feature ``sid_tokens`` of a
    ``KeyedJaggedTensor``; the looked-up rows are scattered back to their positions, padding
    positions are zeros. Row 0 of the table is never read.
    """

    __jit_unused_properties__ = ["weight"]  # noqa: RUF012  (a Python-side accessor, not scripted)

    def __init__(self, num_tokens: int, dim: int) -> None:
        super().__init__()
        self.dim = dim
        self.feature = TOKEN_TABLE  # the KJT key (= table name)
        self.collection = EmbeddingCollection(
            tables=[
                EmbeddingConfig(
                    name=TOKEN_TABLE, embedding_dim=dim, num_embeddings=num_tokens, feature_names=[TOKEN_TABLE]
                )
            ],
            device=torch.device("cpu"),
        )
        nn.init.normal_(self.weight, std=0.02)

    @property
    def weight(self) -> Tensor:
        """The table ``[num_tokens, D]``."""
        return self.collection.embeddings[TOKEN_TABLE].weight

    def forward(self, tokens: Tensor) -> Tensor:
        if tokens.size(0) == 0:  # a KJT of zero rows cannot be split by key
            return torch.zeros(0, tokens.size(1), self.dim, device=tokens.device)
        mask = tokens > 0
        kjt = KeyedJaggedTensor(keys=[self.feature], values=tokens[mask], lengths=mask.sum(1).to(torch.int32))
        values = self.collection(kjt)[self.feature].values()  # [nnz, D], row-major over (B, S)
        out = values.new_zeros(tokens.size(0) * tokens.size(1), self.dim)
        out[mask.reshape(-1)] = values
        return out.reshape(tokens.size(0), tokens.size(1), self.dim)

    def to_plain(self) -> PlainTokenEmbedding:
        """A :class:`PlainTokenEmbedding` with a copy of this table (identical outputs)."""
        plain = PlainTokenEmbedding(self.weight.size(0), self.dim).to(self.weight.device)
        with torch.no_grad():
            plain.table.weight.copy_(self.weight)
        return plain


class PlainTokenEmbedding(nn.Module):
    """Token ids ``[B, S]`` (0 = padding) -> ``[B, S, D]`` through one ``nn.Embedding``; padding -> zeros."""

    __jit_unused_properties__ = ["weight"]  # noqa: RUF012

    def __init__(self, num_tokens: int, dim: int) -> None:
        super().__init__()
        self.dim = dim
        self.table = nn.Embedding(num_tokens, dim)
        nn.init.normal_(self.table.weight, std=0.02)

    @property
    def weight(self) -> Tensor:
        return self.table.weight

    def forward(self, tokens: Tensor) -> Tensor:
        return self.table(tokens) * (tokens > 0).unsqueeze(-1).to(self.table.weight.dtype)

    def to_plain(self) -> PlainTokenEmbedding:
        return self


class SIDDecoderLayer(nn.Module):
    """Pre-norm decoder layer (causal self-attention, cross-attention, feed-forward) whose
    cross-attention keys/values are computed once per user and shared by all its beams.

    ``memory_kv(memory [B, S, D]) -> [B, S, 2D]`` caches the keys and values; ``forward(y [B, W,
    q, D], memory_kv, memory_pad_mask [B, S]) -> [B, W, q, D]`` runs ``W`` beams of ``q`` tokens
    per row: self-attention within each beam, cross-attention of all ``W · q`` queries of a row
    against that row's single memory (no ``W`` copies of it).
    """

    def __init__(self, d_model: int, heads: int, ff_dim: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.head_dim = d_model // heads
        self.dropout_p = dropout
        self.norm_self, self.norm_cross, self.norm_ff = (nn.LayerNorm(d_model) for _ in range(3))
        self.self_qkv = nn.Linear(d_model, 3 * d_model)
        self.self_out = nn.Linear(d_model, d_model)
        self.cross_q = nn.Linear(d_model, d_model)
        self.cross_kv = nn.Linear(d_model, 2 * d_model)
        self.cross_out = nn.Linear(d_model, d_model)
        self.ff = nn.Sequential(nn.Linear(d_model, ff_dim), nn.GELU(), nn.Dropout(dropout), nn.Linear(ff_dim, d_model))
        self.dropout = nn.Dropout(dropout)

    def memory_kv(self, memory: Tensor) -> Tensor:
        return self.cross_kv(memory)

    def _heads(self, x: Tensor) -> Tensor:  # [B, n, D] -> [B, H, n, D/H]
        return x.reshape(x.size(0), x.size(1), self.heads, self.head_dim).transpose(1, 2)

    def forward(self, y: Tensor, memory_kv: Tensor, memory_pad_mask: Tensor) -> Tensor:
        batch, width, length, dim = y.shape
        p = self.dropout_p if self.training else 0.0
        qkv = self.self_qkv(self.norm_self(y)).reshape(batch * width, length, 3, self.heads, self.head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # [B·W, H, q, D/H] each
        att = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        y = y + self.dropout(self.self_out(att.transpose(1, 2).reshape(batch, width, length, dim)))
        q = self._heads(self.cross_q(self.norm_cross(y)).reshape(batch, width * length, dim))  # [B, H, W·q, D/H]
        k, v = self._heads(memory_kv[..., :dim]), self._heads(memory_kv[..., dim:])  # [B, H, S, D/H]
        visible = (~memory_pad_mask).reshape(batch, 1, 1, memory_pad_mask.size(1))
        att = F.scaled_dot_product_attention(q, k, v, attn_mask=visible, dropout_p=p)
        y = y + self.dropout(self.cross_out(att.transpose(1, 2).reshape(batch, width, length, dim)))
        return y + self.dropout(self.ff(self.norm_ff(y)))


class SIDTransformer(nn.Module):
    """Encoder–decoder transformer over semantic-ID tokens (pre-norm layers).

    The encoder is ``nn.TransformerEncoder``; the decoder is a stack of :class:`SIDDecoderLayer`,
    whose cross-attention keys/values are computed once per user in :meth:`encode`, so beam
    search never copies the memory per beam (with ``nn.TransformerDecoder`` re-projecting a
    ``[B·W, S, D]`` memory at every step cost ~10x the whole search on CPU).

    Args:
        codes: int ``[N + 1, L]``, row 0 = -1 (see :mod:`generative.base`).
        level_sizes: codes per level (``L`` entries).
        d_model: D. TIGER: 128.
        heads: attention heads (``d_model % heads == 0``). TIGER's T5 has 6 heads of 64 (inner
            dim 384 != D); here the head dim is ``D / heads``, so the nearest are 4 or 8 heads.
        encoder_layers / decoder_layers: TIGER: 4 + 4; default 2 + 2 for CPU budgets.
        ff_dim: feed-forward width (TIGER: 1024).
        dropout: TIGER: 0.1.
        max_history: H, the most recent items read (older columns are cut off).
        embedding: ``"torchrec"`` (default) or ``"plain"`` token embedding, see the module doc.
        history_tokens: ``"token"`` (TIGER: every SID token of every history item is one encoder
            position, ``S = T·L + 1``) or ``"item"`` (one position per history item, the sum of its
            ``L`` token embeddings, ``S = T + 1``): about 4x less encoder work for the same token
            table, which is what fits a CPU budget; the decoder is the same in both.

    Shapes: history ``[B, T]`` item indices (left-padded with 0; ids outside ``1..N`` are read
    as padding), codes ``[B, L]``, logits ``[B, L, max(level_sizes)]``.
    """

    def __init__(
        self,
        codes: np.ndarray | Tensor,
        level_sizes: list[int] | tuple[int, ...],
        d_model: int = 128,
        heads: int = 4,
        encoder_layers: int = 2,
        decoder_layers: int = 2,
        ff_dim: int = 512,
        dropout: float = 0.1,
        max_history: int = 20,
        embedding: TokenEmbeddingKind = "torchrec",
        history_tokens: HistoryTokens = "token",
    ) -> None:
        super().__init__()
        arr = check_codes(codes, level_sizes)
        if history_tokens not in HISTORY_TOKENS:
            raise ValueError(f"history_tokens={history_tokens!r}: choose one of {HISTORY_TOKENS}")
        self.item_history: bool = history_tokens == "item"
        sizes = [int(s) for s in level_sizes]
        if d_model < 1 or heads < 1 or d_model % heads:
            raise ValueError(f"d_model={d_model} must be a positive multiple of heads={heads}")
        if encoder_layers < 1 or decoder_layers < 1:
            raise ValueError(f"encoder_layers={encoder_layers} and decoder_layers={decoder_layers} must be >= 1")
        if max_history < 1:
            raise ValueError(f"max_history={max_history} must be >= 1")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout={dropout} must be in [0, 1)")
        if embedding not in EMBEDDING_KERNELS:
            raise ValueError(f"embedding={embedding!r}: choose one of {EMBEDDING_KERNELS}")
        num_levels = len(sizes)
        offsets = np.cumsum([0] + sizes)
        self.num_items: int = arr.shape[0] - 1
        self.num_levels: int = num_levels
        self.level_sizes: List[int] = sizes
        self.max_history: int = max_history
        self.d_model: int = d_model
        self.bos: int = 1 + int(offsets[-1])
        self.eoh: int = self.bos + 1
        self.num_tokens: int = self.eoh + 1
        self.embedding_kernel = embedding
        self.masked_logit: float = MASKED_LOGIT
        tokens = np.zeros_like(arr)
        tokens[1:] = arr[1:] + 1 + offsets[:-1]
        self.item_tokens: Tensor
        self.token_offsets: Tensor
        self.level_mask: Tensor
        self.register_buffer("item_tokens", torch.from_numpy(tokens))  # [N + 1, L], row 0 = pad tokens
        self.register_buffer("token_offsets", torch.from_numpy(offsets[:-1] + 1))  # [L]: token = offset + code
        width = max(sizes)
        self.register_buffer("level_mask", torch.arange(width).unsqueeze(0) >= torch.tensor(sizes).unsqueeze(1))

        embed_cls = TorchRecTokenEmbedding if embedding == "torchrec" else PlainTokenEmbedding
        self.tokens = embed_cls(self.num_tokens, d_model)
        self.recency = nn.Embedding(max_history + 1, d_model)  # row H: the EOH token
        self.level = nn.Embedding(num_levels + 1, d_model)  # row L: the EOH token
        self.decoder_position = nn.Embedding(num_levels, d_model)
        for emb in (self.recency, self.level, self.decoder_position):
            nn.init.normal_(emb.weight, std=0.02)
        self.dropout = nn.Dropout(dropout)
        enc = nn.TransformerEncoderLayer(
            d_model, heads, ff_dim, dropout, activation="gelu", batch_first=True, norm_first=True
        )
        self.encoder = nn.TransformerEncoder(
            enc, encoder_layers, norm=nn.LayerNorm(d_model), enable_nested_tensor=False
        )
        self.decoder = nn.ModuleList(SIDDecoderLayer(d_model, heads, ff_dim, dropout) for _ in range(decoder_layers))
        self.decoder_norm = nn.LayerNorm(d_model)
        self.head_weight = nn.Parameter(torch.randn(num_levels, width, d_model) * d_model**-0.5)  # [L, V, D]
        self.head_bias = nn.Parameter(torch.zeros(num_levels, width))  # [L, V]

    # -- encoder ------------------------------------------------------------------------------
    def encode(self, history: Tensor) -> Tuple[Tensor, Tensor]:
        """History ``[B, T]`` -> (every decoder layer's cross-attention keys/values ``[B, S, 2·D·layers]``,
        padding mask ``[B, S]`` bool), ``S = min(T, H)·L + 1`` (``min(T, H) + 1`` with ``history_tokens="item"``)."""
        if history.size(1) > self.max_history:
            history = history[:, history.size(1) - self.max_history :]
        batch, length = history.size(0), history.size(1)
        device = history.device
        valid = (history >= 1) & (history <= self.num_items)
        items = torch.where(valid, history, torch.zeros_like(history))
        eoh = torch.full((batch, 1), self.eoh, dtype=torch.int64, device=device)
        if self.item_history:
            steps = torch.arange(length, device=device)
            tokens = torch.cat([self.item_tokens[items].reshape(batch, length * self.num_levels), eoh], dim=1)
            embedded = self.tokens(tokens)  # [B, T·L + 1, D]
            per_item = embedded[:, : length * self.num_levels].reshape(batch, length, self.num_levels, self.d_model).sum(2)
            x = torch.cat([per_item, embedded[:, -1:]], dim=1)  # [B, T + 1, D]
            recency = torch.cat([length - 1 - steps, torch.full((1,), self.max_history, dtype=torch.int64, device=device)])
            x = x + self.recency(recency).unsqueeze(0)
            x[:, -1] = x[:, -1] + self.level.weight[self.num_levels]
            pad = torch.cat([~valid, torch.zeros(batch, 1, dtype=torch.bool, device=device)], dim=1)
        else:
            tokens = torch.cat([self.item_tokens[items].reshape(batch, length * self.num_levels), eoh], dim=1)  # [B, S]
            recency = (length - 1 - torch.arange(length, device=device)).repeat_interleave(self.num_levels)
            recency = torch.cat([recency, torch.full((1,), self.max_history, dtype=torch.int64, device=device)])
            level = torch.arange(self.num_levels, device=device).repeat(length)
            level = torch.cat([level, torch.full((1,), self.num_levels, dtype=torch.int64, device=device)])
            x = self.tokens(tokens) + (self.recency(recency) + self.level(level)).unsqueeze(0)
            pad = tokens == 0
        memory = self.encoder(self.dropout(x), src_key_padding_mask=pad)  # [B, S, D]
        # (iterating a ModuleList gives type checkers plain Modules)
        return torch.cat([layer.memory_kv(memory) for layer in self.decoder], dim=-1), pad  # type: ignore[operator]

    # -- decoder ------------------------------------------------------------------------------
    def decode(self, memory_kv: Tensor, memory_pad_mask: Tensor, codes: Tensor) -> Tensor:
        """Decoder states ``[B, W, l + 1, D]`` for inputs ``BOS, c_0, ..., c_{l-1}`` of ``W`` beams
        (``codes [B, W, l]``)."""
        batch, width, prefix = codes.size(0), codes.size(1), codes.size(2)
        bos = torch.full((batch, width, 1), self.bos, dtype=torch.int64, device=codes.device)
        tokens = torch.cat([bos, codes + self.token_offsets[:prefix]], dim=2)  # [B, W, l + 1]
        positions = torch.arange(prefix + 1, device=codes.device)
        y = self.tokens(tokens.reshape(batch, width * (prefix + 1))).reshape(batch, width, prefix + 1, self.d_model)
        y = self.dropout(y + self.decoder_position(positions))
        step = 2 * self.d_model
        for i, layer in enumerate(self.decoder):
            y = layer(y, memory_kv[..., i * step : (i + 1) * step], memory_pad_mask)
        return self.decoder_norm(y)

    def next_log_probs(self, memory_kv: Tensor, memory_pad_mask: Tensor, codes: Tensor, level: int) -> Tensor:
        """Log-probabilities ``[B, W, level_sizes[level]]`` of the level-``level`` code after
        ``codes [B, W, level]``."""
        state = self.decode(memory_kv, memory_pad_mask, codes)[:, :, -1]  # [B, W, D]
        size = self.level_sizes[level]
        logits = state @ self.head_weight[level, :size].t() + self.head_bias[level, :size]
        return torch.log_softmax(logits.float(), dim=-1)

    def teacher_forced_logits(self, memory_kv: Tensor, memory_pad_mask: Tensor, codes: Tensor) -> Tensor:
        """Logits ``[B, W, L, V]`` of every level of ``W`` candidate code tuples ``codes [B, W, L]`` per row."""
        states = self.decode(memory_kv, memory_pad_mask, codes[:, :, : self.num_levels - 1])  # [B, W, L, D]
        logits = torch.einsum("bwld,lvd->bwlv", states, self.head_weight) + self.head_bias
        return logits.float().masked_fill(self.level_mask, self.masked_logit)

    def forward(self, history: Tensor, codes: Tensor) -> Tensor:
        """Teacher-forced logits ``[B, L, V]`` (float32, ``V = max(level_sizes)``) of the target ``codes [B, L]``;
        entries ``>= level_sizes[l]`` are :data:`MASKED_LOGIT`."""
        memory_kv, pad = self.encode(history)
        return self.teacher_forced_logits(memory_kv, pad, codes.unsqueeze(1))[:, 0]


class MeanTokenCrossEntropy(nn.Module):
    """Plain cross-entropy averaged over the ``B × L`` code tokens: ``forward(logits [B, L, V], labels [B, L])``."""

    def forward(self, logits: Tensor, labels: Tensor) -> Tensor:
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1))


class SIDRecommender(NextItemModel):
    """Generative next-item recommender: :class:`SIDTransformer` + trie-constrained beam search.

    Args:
        codes: int ``[N + 1, L]`` semantic IDs, row 0 = -1, unique rows (a disambiguated
            codebook's ``codes``); saved in the state dict as ``codes``.
        level_sizes: codes per level.
        loss: ``forward(logits [B, L, V], labels [B, L]) -> scalar`` (a token weighting of
            :mod:`generative.weighting`); default :class:`MeanTokenCrossEntropy`.
        d_model, heads, encoder_layers, decoder_layers, ff_dim, dropout, max_history, embedding,
        history_tokens: see :class:`SIDTransformer`.
        beam_size: default beams per row in :meth:`recommend` (TIGER: 20); at least ``k`` is used.

    History ids outside ``1..N`` (unknown items) are read as padding, in training and serving
    alike; count them where the data is read (:mod:`generative.data`).

    Example::

        model = SIDRecommender(codebook.codes, codebook.level_sizes, loss=PlainCE())
        loss, logs = model.training_loss(history, target)       # [B, T], [B]
        items, scores = model.eval().recommend(history, k=10)   # [B, 10] each
    """

    name: ClassVar[str] = "sid"
    uses_semantic_ids: ClassVar[bool] = True

    def __init__(
        self,
        codes: np.ndarray | Tensor,
        level_sizes: list[int] | tuple[int, ...],
        loss: nn.Module | None = None,
        d_model: int = 128,
        heads: int = 4,
        encoder_layers: int = 2,
        decoder_layers: int = 2,
        ff_dim: int = 512,
        dropout: float = 0.1,
        max_history: int = 20,
        beam_size: int = 20,
        embedding: TokenEmbeddingKind = "torchrec",
        history_tokens: HistoryTokens = "token",
    ) -> None:
        super().__init__()
        arr = check_codes(codes, level_sizes)
        if beam_size < 1:
            raise ValueError(f"beam_size={beam_size} must be >= 1")
        self.trie = PrefixTrie(arr, level_sizes)  # also refuses ambiguous codes
        self.num_items = self.trie.num_items
        self.num_levels = self.trie.num_levels
        self.level_sizes = list(self.trie.level_sizes)
        self.beam_size = beam_size
        self.codes: Tensor
        self.register_buffer("codes", torch.from_numpy(arr))  # [N + 1, L]
        self.transformer = SIDTransformer(
            arr, level_sizes, d_model, heads, encoder_layers, decoder_layers, ff_dim, dropout, max_history, embedding,
            history_tokens,
        )
        self.loss_fn = loss if loss is not None else MeanTokenCrossEntropy()

    @classmethod
    def from_codebook(cls, codebook: Any, loss: nn.Module | None = None, **kwargs: Any) -> SIDRecommender:
        """Built from anything with ``codes`` and ``level_sizes`` (a :class:`generative.codebook.Codebook`)."""
        return cls(codebook.codes, list(codebook.level_sizes), loss, **kwargs)

    @classmethod
    def from_catalog(cls, catalog: Catalog, loss: nn.Module | None = None, **options: Any) -> SIDRecommender:
        """Built on the catalogue's semantic IDs (``catalog.codes``, ``catalog.level_sizes``)."""
        if catalog.codes is None or catalog.level_sizes is None:
            raise ValueError(f"model.arch={cls.name!r} needs a codebook; the catalogue has none")
        return cls(catalog.codes, catalog.level_sizes, loss=loss, **options)

    @property
    def max_history(self) -> int:
        return self.transformer.max_history

    def _check_history(self, history: Tensor) -> Tensor:
        if not isinstance(history, Tensor) or history.dim() != 2:
            raise ValueError(f"history must be a [B, T] tensor, got {getattr(history, 'shape', type(history))}")
        if history.dtype.is_floating_point or history.dtype == torch.bool:
            raise ValueError(f"history must hold integer item indices, got dtype {history.dtype}")
        return history.to(torch.int64)

    def _check_items(self, items: Tensor, name: str) -> Tensor:
        items = items.to(torch.int64)
        if items.numel() and (int(items.min()) < 1 or int(items.max()) > self.num_items):
            lo, hi = int(items.min()), int(items.max())
            raise ValueError(f"{name} must be item indices in 1..{self.num_items}, got values in [{lo}, {hi}]")
        return items

    def training_loss(self, history: Tensor, target: Tensor) -> tuple[Tensor, dict[str, float]]:
        """Loss of generating ``target`` ``[B]``'s codes from ``history`` ``[B, T]``.

        Logs ``loss``, teacher-forced accuracy per level ``acc_l{l}`` and ``acc_item`` (all ``L`` codes right).
        """
        history = self._check_history(history)
        target = self._check_items(target.reshape(-1), "target")
        labels = self.codes[target]  # [B, L]
        logits = self.transformer(history, labels)
        loss = self.loss_fn(logits, labels)
        with torch.no_grad():
            hit = logits.argmax(-1) == labels  # [B, L]
            logs = {"loss": float(loss.detach())}
            for level, acc in enumerate(hit.float().mean(0).tolist()):
                logs[f"acc_l{level}"] = acc
            logs["acc_item"] = float(hit.all(1).float().mean())
        return loss, logs

    def beam_search(self) -> ConstrainedBeamSearch:
        """The decoding module over this model's transformer and trie (eager; script it to serve)."""
        return ConstrainedBeamSearch(self.transformer, self.trie)

    def resolve_k(self, k: int, beam_size: int | None) -> tuple[int, int]:
        """``(k, beam)`` after checking ``1 <= k <= N`` (``ValueError`` naming the catalogue size
        otherwise); ``beam`` is ``beam_size`` (default the constructor's), raised to ``k``."""
        if int(k) < 1:
            raise ValueError(f"k={k} must be >= 1")
        if int(k) > self.num_items:
            raise ValueError(f"k={k} is larger than the catalogue ({self.num_items} items)")
        beam = self.beam_size if beam_size is None else int(beam_size)
        if beam < 1:
            raise ValueError(f"beam_size={beam_size} must be >= 1")
        return int(k), max(beam, int(k))

    @torch.no_grad()
    def recommend(self, history: Tensor, k: int, beam_size: int | None = None) -> tuple[Tensor, Tensor]:
        """Top-``k`` catalogue items ``[B, k]`` and their log-likelihoods ``[B, k]`` by trie-constrained beam search.

        Runs in the current mode (call ``eval()`` first, or use :meth:`recommend_batched`).

        Args:
            history: ``[B, T]`` item indices, left-padded; ids outside ``1..N`` read as padding.
            k: items per row, ``1 <= k <= N`` (``ValueError`` otherwise).
            beam_size: beams per row (default the constructor's); at least ``k`` is used.
        """
        k, beam = self.resolve_k(k, beam_size)
        return self.beam_search()(self._check_history(history), k, beam)

    @torch.no_grad()
    def log_likelihood(self, history: Tensor, items: Tensor) -> Tensor:
        """``log p(items | history)`` ``[B, M]`` for candidate ``items [B, M]`` (sum of the codes' log-probs;
        the quantity beam search ranks by)."""
        history = self._check_history(history)
        items = self._check_items(items, "items")
        labels = self.codes[items]  # [B, M, L]
        memory_kv, pad = self.transformer.encode(history)
        logits = self.transformer.teacher_forced_logits(memory_kv, pad, labels)  # [B, M, L, V]
        return torch.log_softmax(logits, dim=-1).gather(3, labels.unsqueeze(-1)).squeeze(-1).sum(2)
