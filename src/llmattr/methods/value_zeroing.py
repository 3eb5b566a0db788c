"""Value Zeroing (Mohebbi et al., 2023), as paper 000 ran it through Inseq.

For a layer l and a content token j, token j's value vector is zeroed in layer l's attention (through
the internals probe's ``value_scale``) and the importance of j for step t is the cosine distance
1 - cos(h_t^l, h_t^l(-j)) between the clean and the zeroed output of block l at step t's predicting
position. Each layer is zeroed independently: with ``layers="all"`` every block's input is patched back
to the clean state, so one forward per zeroed token gives every layer (Inseq's hooks do the same).

Layer aggregation follows Inseq: each layer's distances are normalised to sum to 1 over the zeroed
tokens, then the chosen layers are averaged. Inseq's default, and so paper 000's, is the last layer
only (``layers="last"``); ``layers="all"`` is Inseq's ``aggregate_layers_fn="average"``. Unlike Inseq,
only the content span is zeroed (the template stays intact, as in every llmattr perturbation), so the
normalisation runs over the content span; for one layer that only rescales each step. Distances
below 1e-6 (float32 noise of identical states) count as 0.

Batched: the zeroed tokens are batch rows (``batch_size`` per forward), all steps share each forward.
Only the explained positions' block outputs are read, so a zeroed row runs from the first explained
position on (the clean keys and values before it are cached; the zeroing reaches the cached values), and
the blocks before the first zeroed layer (whose input is the same in every row) and after the last (whose
output is not read) are replayed rather than run: with the default ``layers="last"`` and one explained
token, a zeroed row costs one block at one position.
"""

from __future__ import annotations

from functools import partial

from ..errors import LlmattrError
from ..lazy import torch
from ..models.anatomy import decoder_blocks
from ..models.forward import logits_and_prefix
from ..models.intercept import Patched
from ..models.loading import LoadedModel
from ..models.probe import Probe
from ..scores import pos_norm
from ..targets import Target
from .base import COUNT, AttributionMethod, register

NOISE_FLOOR = 1e-6  # float32 cosine distances of identical states reach ~6e-8: below this they are 0


class BlockTap(Patched):
    """Chosen blocks' forwards wrapped to keep their output at ``positions``; optionally patch it.

    ``patch`` maps a block index to the clean output ``(1, S, d)`` that replaces the block's output
    (so the next block sees clean inputs); without it the outputs pass unchanged. ``keep_from``: keep the
    outputs from that position on instead (and the blocks' own output objects, sliced the same way, in ``raw``).
    """

    def __init__(self, blocks: torch.nn.ModuleList, layers: list[int], positions: torch.Tensor,
                 patch: dict[int, torch.Tensor] | None = None, keep_from: int | None = None):
        super().__init__([blocks[k] for k in layers], lambda k, forward: partial(self._tap, layers[k], forward))
        self.positions, self.patch, self.keep_from = positions, patch, keep_from
        self.outputs: dict[int, torch.Tensor] = {}
        self.raw: dict[int, object] = {}  # the blocks' own output objects (keep_from only)

    def _tap(self, layer: int, forward, *args, **kwargs):
        output = forward(*args, **kwargs)
        hidden = output[0] if isinstance(output, tuple) else output
        if self.keep_from is None:
            self.outputs[layer] = hidden[:, self.positions]
        else:  # a slice copied out, so the full sequence's output is not kept alive
            self.raw[layer] = map_hidden(output, lambda h: h[:, self.keep_from:].clone())
            self.outputs[layer] = self.raw[layer][0] if isinstance(output, tuple) else self.raw[layer]
        if self.patch is None or layer not in self.patch:
            return output
        clean = self.patch[layer].expand_as(hidden)
        return (clean, *output[1:]) if isinstance(output, tuple) else clean


def map_hidden(output, fn):
    """A block's output object (a tensor, or a tuple led by one) with ``fn`` applied to its hidden states."""
    if isinstance(output, tuple):
        return (fn(output[0]), *output[1:])
    return fn(output)


def _clean_replay(output, forward, hidden_states: torch.Tensor, *args, **kwargs):
    """A block whose input is the same in every batch row: its clean ``output``, expanded to the batch, without
    computing anything."""
    return map_hidden(output, lambda h: h.expand(hidden_states.shape[0], -1, -1))


def replayed(blocks: torch.nn.ModuleList, outputs: dict[int, object]) -> Patched:
    """Blocks ``k in outputs`` replay ``outputs[k]`` (:func:`_clean_replay`) for the duration."""
    chosen = list(outputs)
    return Patched([blocks[k] for k in chosen], lambda i, forward: partial(_clean_replay, outputs[chosen[i]], forward))


def value_zeroing_distances(lm: LoadedModel, input_ids: torch.Tensor, positions: torch.Tensor,
                            span: tuple[int, int], layers: list[int], batch_size: int) -> torch.Tensor:
    """1 - cos(clean, zeroed) block outputs: ``(n_layers_chosen, T, n_span)``.

    Only the block outputs at the explained ``positions`` are read, and every block's input is clean, so
    the zeroed rows run from the first explained position on: the clean keys and values before it come
    from the clean pass (:class:`SharedPrefix`), and the probe's ``value_scale`` zeroes token j's value in
    that cache too. The blocks before the first zeroed layer and after the last are replayed, not run.
    """
    blocks = decoder_blocks(lm.model)
    positions = positions.to(lm.device)
    embeds = lm.embed(input_ids)
    seq_len = embeds.shape[1]
    suffix = int(positions.min())  # rows start here; everything before is served from the clean cache
    # blocks before the first zeroed layer see the same input in every row, blocks after the last feed nothing read
    replay_at = [k for k in range(len(blocks)) if k < min(layers) or k > max(layers)]
    with torch.no_grad():
        with BlockTap(blocks, sorted(set(layers) | set(replay_at)), positions, keep_from=suffix) as clean_tap:
            _, prefix = logits_and_prefix(lm, embeds, positions[-1:], suffix)
        clean = clean_tap.outputs  # (1, S - suffix, d): from the first explained position on
        patch = {k: clean[k] for k in layers[:-1]}  # the last chosen block's output feeds nothing read
        skip = {k: clean_tap.raw[k] for k in replay_at}
        a, b = span
        parts = []
        for start in range(a, b, batch_size):
            tokens = torch.arange(start, min(start + batch_size, b), device=lm.device)
            scale = torch.ones(len(tokens), seq_len, device=lm.device)
            scale[torch.arange(len(tokens), device=lm.device), tokens] = 0.0
            with replayed(blocks, skip), BlockTap(blocks, layers, positions - suffix, patch) as tap, \
                    Probe(value_scale=scale, value_layers=set(layers)):
                prefix.logits_at(lm, embeds[:, suffix:].expand(len(tokens), -1, -1), positions[-1:])
            cos = torch.stack([
                torch.nn.functional.cosine_similarity(tap.outputs[k].float(),
                                                      clean[k][:, positions - suffix].float(), dim=-1)
                for k in layers
            ])  # (L, rows, T)
            dist = 1.0 - cos
            parts.append(torch.where(dist > NOISE_FLOOR, dist, torch.zeros_like(dist)))
    return torch.cat(parts, dim=1).transpose(1, 2)


@register
class ValueZeroing(AttributionMethod):
    """Cosine distance of a block's output when one token's value vector is zeroed (Mohebbi et al.)."""

    name = "value-zeroing"
    family = "perturbation (internal)"
    summary = "Value Zeroing: 1 - cos of a block's output with one token's value zeroed (last layer or mean)"
    needs_gradients = False
    signed = False
    cost = "1 forward + ceil(n/batch_size) batched passes of the explained positions (all steps share them)"
    defaults = {"layers": "last", "batch_size": 16}
    rules = {"layers": ("layer-or", ("last", "all"), "value-zeroing layers must be 'last', 'all' or a layer index"),
             "batch_size": COUNT}
    layer_param = "layers"  # an index: that layer alone (paper 003 sec. 5's layer-wise value zeroing)


    @staticmethod
    def chosen_layers(layers: str | int, n_layers: int) -> list[int]:
        """The block indices of the ``layers`` parameter."""
        if layers == "all":
            return list(range(n_layers))
        if layers == "last":
            return [n_layers - 1]
        if not -n_layers <= layers < n_layers:
            raise LlmattrError(f"value-zeroing layer must be in [0, {n_layers - 1}]; got {layers}")
        return [layers % n_layers]

    def attribute(self, lm: LoadedModel, target: Target) -> torch.Tensor:
        return self.layer_scores(lm, target, [self.params["layers"]]).mean(0)

    def layer_scores(self, lm: LoadedModel, target: Target, layers: list[str | int]) -> torch.Tensor:
        """``(L, n_steps, n_span)``, a row per block that ``layers`` name (``"all"`` and ``"last"`` as the
        parameter reads them): each layer's distances over their sum (they are >= 0), every layer zeroed in
        the same batched passes."""
        n_layers = lm.model.config.get_text_config().num_hidden_layers
        rows = [k for layer in layers for k in self.chosen_layers(layer, n_layers)]
        chosen = sorted(set(rows))
        dist = value_zeroing_distances(lm, target.input_ids, target.positions, target.span, chosen,
                                       self.params["batch_size"])  # (L, T, n)
        return pos_norm(dist)[[chosen.index(k) for k in rows]].cpu()
