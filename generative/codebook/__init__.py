"""Semantic IDs: item vectors in, a table of per-level codes out (docs/methods.md §5.1, §5.6).

A :class:`CodebookBuilder` quantises item content vectors ``[num_items + 1, d]`` (row 0, the
padding item, is ignored) into ``levels`` residual codes per item, then (TIGER) appends one more
level that tells apart the items whose codes collide. The result is a :class:`Codebook`::

    builder = CodebookBuilder.create("rq-kmeans", levels=3, codebook_size=256)
    codebook = builder.fit(vectors, seed=0)      # codes [num_items + 1, 4], row 0 = -1
    codebook.tokens_of(17)                       # (12, 201, 5, 0)
    codebook.item_of((12, 201, 5, 0))            # 17
    codebook.save("sid.json"); Codebook.load("sid.json")

Builders (registered names):

* ``"rq-kmeans"`` (:class:`RQKMeans`, the default): level 1 is k-means on the item vectors,
  level ``l`` is k-means on the residual ``x - Σ_{j<l} c_j``. Deterministic for a seed.
* ``"rq-vae"`` (:class:`RQVAE`): an MLP autoencoder with a residual vector quantiser between
  encoder and decoder, codebooks initialised by residual k-means on the untrained encoder's
  latents (§5.1), trained with MSE reconstruction + codebook + β·commitment, straight-through.
  Code usage and perplexity per level are tracked every epoch so codebook collapse is visible.

Adding a builder is one :class:`CodebookBuilder` subclass with a ``name`` (one module of this
package, imported below so that it registers); nothing else names it.

Collisions (several items with the same code tuple) are resolved as in TIGER: with
``disambiguate=True`` (default) a last level holds each item's index within its collision
group (0 for unique items, in item-index order), and ``level_sizes[-1]`` is the largest group
size (at least 1). With ``disambiguate=False`` the colliding codes are kept: the codebook is
returned (its :attr:`Codebook.stats` report the collisions and :attr:`Codebook.is_unique` is
False), but the tuple -> item lookups (:meth:`Codebook.item_of`, :meth:`Codebook.items_of`)
refuse with a :class:`CodebookError`, since a colliding tuple has no single item.

Capacity rule (checked before fitting): the catalogue must fit
``Π_l codebook_size_l × slots`` distinct IDs, where ``slots`` is ``max_group_size`` with
disambiguation (default: the largest level size, so the collision token's vocabulary is no
larger than a level's) and 1 without. The error names the smallest ``codebook_size`` (same size
at every level) that would fit. Because k-means does not spread items evenly, a codebook that
passes this check can still produce a collision group larger than ``max_group_size``; the fit
then fails with the size of that group.
"""

from generative.codebook.artifact import (
    FORMAT,
    FORMAT_VERSION,
    Codebook,
    CodebookError,
    code_perplexity,
    collision_groups,
    min_codebook_size,
)
from generative.codebook.builder import CodebookBuilder, builder_names
from generative.codebook.rqkmeans import RQKMeans, kmeans, residual_kmeans
from generative.codebook.rqvae import RQVAE

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "RQVAE",
    "Codebook",
    "CodebookBuilder",
    "CodebookError",
    "RQKMeans",
    "builder_names",
    "code_perplexity",
    "collision_groups",
    "kmeans",
    "min_codebook_size",
    "residual_kmeans",
]
