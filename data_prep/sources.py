"""The trainer's ``--data`` values, which name shard folders this package builds: a plain ``DIR``
(one source) or ``name=DIR:weight[:mask_prob]`` per source of a mixture (:func:`parse_mixture`).
A ``DIR`` may be a URL in object storage (``s3://bucket/shards``, any fsspec URL): its
:attr:`Source.path` is then the URL as a string (a ``Path`` would fold its ``//``).

Here, below the trainer's packages, because reading a run folder needs them too (a run's
tokenizer is its first source's, :func:`pretrain.run_folder.run_checkpoints.run_tokenizer_dir`). The
mixture itself (one reader and one sample order over the sources) is
:mod:`pretrain.data.mixture`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from bertforge.data_prep.object_store import check_url, is_url
from bertforge.errors import UserError


class MixtureError(UserError, ValueError):
    """A mixture that cannot be used; the message names the source and what to change."""


@dataclass(frozen=True)
class Source:
    """One shard folder of a mixture."""

    name: str
    path: Path | str  # a local folder, or a URL (str) in object storage
    weight: float  # relative share of the training stream
    mask_prob: float | None = None  # this source's masking rate (None: the --mask_prob setting)


def location(text: str) -> Path | str:
    """A ``--data`` folder: a Path, or for a URL the URL itself (credentials in it refused)."""
    return check_url(text) if is_url(text) else Path(text)


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def parse_source(value: str) -> Source:
    """One `name=DIR:weight[:mask_prob]` value (see the module doc)."""
    name, eq, rest = value.partition("=")
    usage = "give name=DIR:weight or name=DIR:weight:mask_prob, e.g. wiki=/data/wiki:0.5"
    if not eq or not name or not rest:
        raise MixtureError(f"--data {value!r}: {usage}")
    parts = rest.rsplit(":", 2)
    if len(parts) == 3 and None not in (_number(parts[1]), _number(parts[2])):
        path, weight, mask_prob = parts[0], float(parts[1]), float(parts[2])
    elif _number(rest.rsplit(":", 1)[-1]) is not None and ":" in rest:
        (path, w), mask_prob = rest.rsplit(":", 1), None
        weight = float(w)
    else:
        raise MixtureError(f"--data {value!r}: no weight; {usage}")
    if not math.isfinite(weight) or weight <= 0:
        raise MixtureError(f"--data {value!r}: the weight must be a positive number")
    if mask_prob is not None and not 0.0 < mask_prob <= 1.0:
        raise MixtureError(f"--data {value!r}: mask_prob must be in (0, 1], got {mask_prob}")
    return Source(name, location(path), weight, mask_prob)


def parse_mixture(values: str | list[str]) -> list[Source]:
    """The sources of `--data` values; a single plain DIR is one source of weight 1."""
    values = [values] if isinstance(values, str) else list(values)
    if len(values) == 1 and "=" not in values[0]:
        path = location(values[0])
        name = str(path).rstrip("/").rsplit("/", 1)[-1] if is_url(path) else path.name
        return [Source(name or "data", path, 1.0)]
    plain = [v for v in values if "=" not in v]
    if plain:
        raise MixtureError(
            f"--data {plain[0]!r}: in a mixture every source needs a name and a "
            "weight (name=DIR:weight)"
        )
    sources = [parse_source(v) for v in values]
    names = [s.name for s in sources]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise MixtureError(f"--data: source name(s) {dup} given twice; names must be unique")
    return sources
