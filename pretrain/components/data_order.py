"""The run's training order and its shard cache, settled before the rendezvous.

:func:`configure_cache` hands the data flags (``--cache_dir``, ``--cache_limit``,
``--fetch_threads``, ``--fetch_retries``) to :mod:`data_prep.shard_cache` before a shard folder
in object storage is opened. :func:`resolve_order` settles the order the checkpoints record
(``data.data_order``, ``data.window_shards`` in their config): a resume keeps its checkpoint's
order unless the flags name another one, which is refused (the data position is a count of
samples of one stream: under another order it points elsewhere); ``--window_shards 0`` becomes
the number that fits the cache (pretrain.data.window_order.auto_window), once, at the first
launch. It also says when the cache cannot serve the order well: the global order over remote
data larger than the cache fetches each shard many times an epoch.
"""

from __future__ import annotations

import dataclasses

from bertforge.data_prep import shard_cache
from bertforge.data_prep.object_store import Retry
from bertforge.data_prep.remote_folder import human, parse_size
from bertforge.logs import get_logger
from bertforge.pretrain.config.ds_config import ConfigError
from bertforge.pretrain.config.train_config import TrainConfig
from bertforge.pretrain.data.window_order import auto_window

log = get_logger(__name__)

_KEYS = ("data_order", "window_shards")


def configure_cache(cfg: TrainConfig) -> None:
    """This process's shard cache, as the flags say (made when a URL is first opened)."""
    d = cfg.data_cfg
    shard_cache.configure(
        d.cache_dir or None,
        d.cache_limit,
        d.fetch_threads,
        Retry(tries=d.fetch_retries),
        output_dir=cfg.run.output_dir,
    )


def _shards(reader) -> list[dict]:
    joined = getattr(reader, "_joined", reader)
    return joined._shards


def _shard_bytes(reader) -> list[int]:
    return [sum(int(f["bytes"]) for f in s["files"].values()) for s in _shards(reader)]


def resolve_order(cfg: TrainConfig, reader, point) -> TrainConfig:
    """``cfg`` with the run's order settled (see the module doc); ``point``: the resume point
    or None."""
    d = cfg.data_cfg
    if point is not None:
        saved = point.state.get("config", {}).get("data_cfg")
        # a checkpoint from before the window order was trained in the global one
        saved = {"data_order": "global", "window_shards": 0, **saved} if saved else {}
        given = {k: f"data.{k}" in cfg.sources for k in _KEYS}
        for key in _KEYS:
            if key not in saved or saved[key] == getattr(d, key):
                continue
            if given[key] and not (key == "window_shards" and getattr(d, key) == 0):
                raise ConfigError(
                    f"--{key} {getattr(d, key)}: {point.path} was trained with --{key} "
                    f"{saved[key]}; its data position counts samples of that order. Resume "
                    f"without --{key} (the checkpoint's is kept) or start a new run."
                )
            d = dataclasses.replace(d, **{key: saved[key]})
    sources = getattr(reader, "sources", None) or [None]
    limit = parse_size(d.cache_limit)
    sizes = _shard_bytes(reader)
    if d.data_order == "window" and d.window_shards == 0:
        d = dataclasses.replace(d, window_shards=auto_window(sizes, len(sources), limit))
        log.info(
            f"--data_order window: {d.window_shards} shards per window (a third of "
            f"--cache_limit {human(limit)}); kept in the checkpoints"
        )
    if getattr(reader, "remote", False):
        _say_how_the_cache_serves(d, sizes, len(sources), limit)
    return dataclasses.replace(cfg, data_cfg=d)


def _say_how_the_cache_serves(d, sizes: list[int], sources: int, limit: int) -> None:
    total = sum(sizes)
    if d.data_order == "global" and total > limit:
        log.warning(
            f"--cache_limit {human(limit)} is below the training data's {human(total)} and "
            "--data_order global reads every shard in every few batches: each shard will be "
            "fetched many times an epoch. --data_order window keeps reads within a window of "
            "shards that fits the cache."
        )
    if d.data_order == "window":
        window = d.window_shards * max(sizes, default=0) * sources
        if window * 2 > limit:
            log.warning(
                f"--window_shards {d.window_shards}: a window of every source takes up to "
                f"{human(window)}, so --cache_limit {human(limit)} cannot hold the next window "
                "while this one is read; expect waits at each window's start (fewer shards "
                "per window, or a larger cache)"
            )
