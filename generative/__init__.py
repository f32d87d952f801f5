"""Generative recommendation with semantic IDs and information-gain token weighting.

* data: :func:`load_sequences` (Amazon 5-core Beauty/Sports/Toys, MovieLens-100K, synthetic),
  :func:`leave_one_out`, :func:`tail_items`;
* item content: :class:`ItemContent` (``attributes``, ``collaborative``, ``concat``, ``text``);
* semantic IDs: :class:`Codebook` built by :class:`CodebookBuilder` (``rq-kmeans``, ``rq-vae``);
* models (:class:`NextItemModel`): :class:`SIDRecommender` (encoder-decoder over SID tokens,
  trie-constrained beam search) and the :class:`SASRec` baseline;
* token weighting: :class:`TokenWeighting` (``plain``, ``front``, ``frequency``, ``multi``);
* metrics: :func:`ranking_metrics` (Recall/NDCG@k, head vs tail items);
* serving: :func:`export_recommender` / :func:`load_recommender` (TorchScript, beam search inside);
* training: :class:`SequenceDataModule` + :class:`GenerativeTask` behind ``salience gen``.
"""

from generative.base import NextItemModel
from generative.codebook import RQVAE, Codebook, CodebookBuilder, RQKMeans
from generative.content import ItemContent
from generative.data import LeaveOneOut, SequenceData, leave_one_out, load_sequences, synthetic_sequences, tail_items
from generative.model import SIDRecommender
from generative.ranking_metrics import ranking_metrics
from generative.sasrec import SASRec
from generative.serving import export_recommender, load_recommender
from generative.weighting import TokenWeighting

__all__ = [
    "Codebook",
    "CodebookBuilder",
    "ItemContent",
    "LeaveOneOut",
    "NextItemModel",
    "RQKMeans",
    "RQVAE",
    "SASRec",
    "SIDRecommender",
    "SequenceData",
    "TokenWeighting",
    "export_recommender",
    "leave_one_out",
    "load_recommender",
    "load_sequences",
    "ranking_metrics",
    "synthetic_sequences",
    "tail_items",
]
