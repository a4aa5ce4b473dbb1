"""Progress display that reads well anywhere: a tqdm bar on a terminal, plain lines in a log.

Modes (``--progress``): ``auto`` (a bar when stderr is a terminal, lines otherwise), ``bar``,
``lines`` and ``off``. ``true``/``false`` are accepted as the older boolean spelling (``true`` =
``auto``). A bar in a file is one endless line of carriage returns; lines mode writes one plain
line (no ``\\r``) every ``every_steps`` updates, or, when ``every_s`` > 0, at most one line per
``every_s`` seconds, and always one for the last update. Lines go to stderr, where the bar goes.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

MODES = ("auto", "bar", "lines", "off")
_BOOL = {
    "true": "auto",
    "1": "auto",
    "yes": "auto",
    "on": "auto",
    "false": "off",
    "0": "off",
    "no": "off",
}


def normalize_mode(value: str | bool | None, flag: str = "--progress") -> str:
    """One of :data:`MODES` for a flag value; raises ValueError naming ``flag`` otherwise."""
    if value is None or value is True:
        return "auto"
    if value is False:
        return "off"
    v = str(value).strip().lower()
    v = _BOOL.get(v, v)
    if v not in MODES:
        raise ValueError(f"{flag} must be one of {', '.join(MODES)} (or true/false), got {value!r}")
    return v


def resolve_mode(value: str | bool | None, stream: TextIO | None = None) -> str:
    """``bar``, ``lines`` or ``off``: ``auto`` becomes a bar only when ``stream`` is a terminal."""
    mode = normalize_mode(value)
    if mode != "auto":
        return mode
    stream = stream or sys.stderr
    try:
        return "bar" if stream.isatty() else "lines"
    except (AttributeError, ValueError):  # a closed or odd stream: never a bar
        return "lines"


def _clock(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def short(v: Any) -> str:
    """A value in a short form: floats keep four significant digits, tiny/huge ones go e-form."""
    if isinstance(v, float):
        return f"{v:.2e}" if v != 0 and (abs(v) < 1e-3 or abs(v) >= 1e6) else f"{v:.4g}"
    return str(v)


def format_fields(fields: dict[str, Any]) -> str:
    """``key value`` pairs of the fields that are set."""
    return " ".join(f"{k} {short(v)}" for k, v in fields.items() if v is not None)


class Progress:
    """A bar or plain lines for ``total`` units; :meth:`update` after each unit."""

    def __init__(
        self,
        total: int | None,
        *,
        desc: str,
        unit: str,
        mode: str | bool = "auto",
        initial: int = 0,
        every_steps: int = 1,
        every_s: float = 0.0,
        stream: TextIO | None = None,
    ) -> None:
        self.stream = stream or sys.stderr
        self.mode = resolve_mode(mode, self.stream)
        self.total, self.desc, self.unit = total, desc, unit
        self.n, self.initial = initial, initial
        self.every_steps, self.every_s = max(1, every_steps), every_s
        self.fields: dict[str, Any] = {}
        self._start = self._last_line = time.monotonic()
        self._last_n = initial
        self.bar = None
        if self.mode == "bar":
            # Lazy: tqdm only in bar mode; the trainer's metrics import this module.
            from tqdm import tqdm

            self.bar = tqdm(
                total=total,
                initial=initial,
                desc=desc,
                unit=unit,
                dynamic_ncols=True,
                mininterval=1.0,
                file=self.stream,
            )

    def update(self, n: int = 1, **fields: Any) -> None:
        """Advance by ``n`` units; ``fields`` (loss=..., lr=...) are shown from now on."""
        self.n += n
        if fields:
            self.fields.update(fields)
        if self.bar is not None:
            self.bar.update(n)
            if fields:
                self.bar.set_postfix(
                    {k: short(v) for k, v in self.fields.items() if v is not None}, refresh=False
                )
        elif self.mode == "lines" and self._line_due():
            self._line()

    def _line_due(self) -> bool:
        if self.total is not None and self.n >= self.total:
            return True
        if self.every_s > 0:
            return time.monotonic() - self._last_line >= self.every_s
        return self.n % self.every_steps == 0

    def _line(self) -> None:
        now = time.monotonic()
        done = self.n - self.initial
        rate = done / max(now - self._start, 1e-9)
        of = f"/{self.total}" if self.total else ""
        parts = [f"{self.desc} {self.n}{of} {self.unit}"]
        if self.fields:
            parts.append(format_fields(self.fields))
        parts.append(f"{rate:.3g} {self.unit}/s elapsed {_clock(now - self._start)}")
        if self.total and done > 0:
            parts.append(f"ETA {_clock((self.total - self.n) / rate)}")
        self.stream.write(" | ".join(parts) + "\n")
        self.stream.flush()
        self._last_line, self._last_n = now, self.n

    def write(self, msg: str, file: TextIO | None = None) -> None:
        """A message line that does not break the bar (stdout unless ``file``)."""
        if self.bar is not None:
            self.bar.write(msg, file=file)
        else:
            print(msg, file=file or sys.stdout, flush=True)

    def close(self) -> None:
        """End the bar; in lines mode, a last line when units passed since the previous one."""
        if self.bar is not None:
            self.bar.close()
        elif self.mode == "lines" and self.n != self._last_n:
            self._line()
