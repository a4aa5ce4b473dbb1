"""Cross-layer parameter sharing (``--share_layers``, ALBERT-style) for both arches.

Every encoder layer keeps its own module (so hooks, activation checkpointing, the layer's own
attention type and the state-dict names stay per layer), but the layers of one group hold the
*same* ``nn.Parameter`` objects. Autograd sums a shared weight's gradient over the layers that
use it; ``parameters()`` (hence the optimizer, ZeRO partitioning and parameter counts) sees it
once; ``torch.save`` and DeepSpeed's ``shared_params`` store it once while ``state_dict()`` still
lists every layer's name (so an export writes every layer's weights).

Members of a group need not hold the same parameters: ModernBERT's layer 0 has no pre-attention
norm (its input is the embeddings' norm already). A parameter is held by the first member of
the group that has it and shared by the later ones, so a group [0, 1, 2] of ModernBERT shares
every weight of layer 0 and one ``attn_norm`` between layers 1 and 2. Parameters at one path
must agree in shape across the group, or the model cannot be built (an error naming
--share_layers).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

SHARE_LAYERS_HELP = "none, all, or groups:G with G dividing num_hidden_layers"


def layer_groups(share_layers: str, num_layers: int) -> list[int]:
    """Index of the first layer of layer i's sharing group, for each of `num_layers` layers.

    "none" -> [0, 1, ..., L-1]; "all" -> [0] * L; "groups:G" -> G runs of L/G consecutive layers,
    each pointing at its run's first layer. Anything else is a ValueError naming the flag.
    """
    spec = share_layers.strip().lower()
    if spec == "none":
        return list(range(num_layers))
    if spec == "all":
        return [0] * num_layers
    groups = None
    if spec.startswith("groups:"):
        try:
            groups = int(spec.split(":", 1)[1])
        except ValueError:
            groups = None
    if groups is None or groups < 1:
        raise ValueError(f"--share_layers {share_layers!r}: choose {SHARE_LAYERS_HELP}")
    if num_layers % groups:
        raise ValueError(
            f"--share_layers {share_layers!r}: {num_layers} layers do not split into "
            f"{groups} equal groups; choose {SHARE_LAYERS_HELP}"
        )
    size = num_layers // groups
    return [(i // size) * size for i in range(num_layers)]


@dataclass(frozen=True)
class SharedKey:
    """One shared state-dict entry: ``key`` (layer ``layer``) holds the Parameter of ``owner``
    (layer ``owner_layer``), the group's first layer that has it."""

    key: str
    owner: str
    layer: int
    owner_layer: int


def share_layer_parameters(
    layers: torch.nn.ModuleList, groups: list[int], prefix: str
) -> list[SharedKey]:
    """Make the layers of each group (``groups``: :func:`layer_groups`) hold one set of
    Parameters, each that of the first member having it; ``prefix`` is the layers' state-dict
    path ("bert.encoder.layer."). Returns the shared entries (empty without sharing)."""
    shared: list[SharedKey] = []
    owners: dict[tuple[int, str], tuple[int, torch.nn.Parameter]] = {}  # (group, path) -> owner
    for i, layer in enumerate(layers):
        for mod_path, sub in layer.named_modules():
            for name, param in list(sub.named_parameters(recurse=False)):
                path = f"{mod_path}.{name}" if mod_path else name
                held = owners.setdefault((groups[i], path), (i, param))
                if held[0] == i:
                    continue
                if held[1].shape != param.shape:
                    raise ValueError(
                        f"--share_layers: layer {i}'s {path} {tuple(param.shape)} cannot share "
                        f"layer {held[0]}'s {tuple(held[1].shape)}; choose --share_layers none"
                    )
                setattr(sub, name, held[1])
                owner = f"{prefix}{held[0]}.{path}"
                shared.append(SharedKey(f"{prefix}{i}.{path}", owner, i, held[0]))
    return shared


def shared_copies_disagree(
    shared: list[SharedKey],
    state_dict: dict[str, torch.Tensor],
    share_layers: str,
    prefix: str = "",
) -> str | None:
    """Why `state_dict` cannot load into a model whose layers share Parameters as ``shared``
    says (the first key whose value differs from its owner's), or None when every copy agrees.
    Loading it would silently keep the last copy's value (a checkpoint of an unshared model)."""
    for s in shared:
        val, ref = state_dict.get(prefix + s.key), state_dict.get(prefix + s.owner)
        if val is None or ref is None or ref.shape != val.shape or not val.numel():
            continue  # absent or an empty ZeRO-3 placeholder: nothing to compare
        if not torch.equal(ref.to(val.device, val.dtype), val):
            return (
                f"state dict key {prefix}{s.key} differs from {prefix}{s.owner}, but this model "
                f"shares layer {s.layer}'s weights with layer {s.owner_layer} (share_layers="
                f"{share_layers!r}); load a checkpoint trained with the same --share_layers, "
                "or build the model with --share_layers none"
            )
    return None


class LayerSharingMixin:
    """What both arches' models have for --share_layers: call :meth:`share_layers_of` at the
    end of ``__init__`` (after the weights are initialised)."""

    share_layers: str = "none"
    shared_keys: tuple[SharedKey, ...] = ()

    def share_layers_of(self, layers: torch.nn.ModuleList, share_layers: str, prefix: str) -> None:
        """Share the Parameters of ``layers`` (state-dict path ``prefix``) as ``share_layers``
        says, and refuse (on load) a state dict whose shared copies disagree."""
        self.share_layers = share_layers
        self.layer_groups = layer_groups(share_layers, len(layers))
        self.shared_keys = tuple(share_layer_parameters(layers, self.layer_groups, prefix))
        if self.shared_keys:
            self.register_load_state_dict_pre_hook(self._check_shared_copies_agree)

    @property
    def shares_layers(self) -> bool:
        """True when some encoder layers use another layer's weights (--share_layers)."""
        return bool(self.shared_keys)

    def _check_shared_copies_agree(self, module, state_dict, prefix, *args) -> None:
        problem = self.shared_copies_disagree(state_dict, prefix)
        if problem:
            raise ValueError(problem)

    def shared_copies_disagree(
        self, state_dict: dict[str, torch.Tensor], prefix: str = ""
    ) -> str | None:
        """See :func:`shared_copies_disagree`."""
        return shared_copies_disagree(list(self.shared_keys), state_dict, self.share_layers, prefix)
