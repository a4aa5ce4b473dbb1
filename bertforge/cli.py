"""The project's command lines: one parser class and one generator of flags from dataclasses.

Every entry point builds its parser with :class:`ArgumentParser`: prefixes of a flag are refused
(``--micro_batch`` is not ``--micro_batch_size``), and an error is two lines that name the
offending flag, the fix or the closest flag, and the ``--help`` to read, instead of the usage
first; a subcommand's error names the subcommand.

Configuration dataclasses document each field for its flag with :func:`opt`::

    max_seq_len: int = opt(128, "tokens per sequence including [CLS]/[SEP]")

and :func:`add_fields` turns the fields into flags (help from that metadata, type from the
annotation, default from the field), :func:`from_args` turns the parsed values back into the
dataclass.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import re
import sys
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NoReturn

from bertforge.errors import USER_ERROR_EXIT


class ArgumentParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` without prefix matching and with short errors (see module)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self._is_subcommand = False
        # Other tools' names of our flags ({"--learning_rate": "--lr"}): "did you mean" by meaning.
        self.aliases: dict[str, str] = {}

    def add_subparsers(self, **kwargs: Any) -> argparse._SubParsersAction:
        """As argparse's; each subcommand's parser reports its own unknown flags."""
        action = super().add_subparsers(**kwargs)
        make = action.add_parser

        def add_parser(name: str, **kw: Any) -> argparse.ArgumentParser:
            sub = make(name, **kw)
            sub._is_subcommand = True
            return sub

        action.add_parser = add_parser
        return action

    def parse_known_args(self, args=None, namespace=None):
        self._argv = list(sys.argv[1:] if args is None else args)
        ns, extras = super().parse_known_args(args, namespace)
        if extras and self._is_subcommand:  # else the top-level parser would blame itself
            self.error("unrecognized arguments: " + " ".join(extras))
        return ns, extras

    def option_strings(self) -> list[str]:
        """Every flag this parser accepts (for "did you mean")."""
        return [s for a in self._actions for s in a.option_strings if s.startswith("--")]

    def unknown_flags(self) -> list[str]:
        """The ``--flags`` of the command line being parsed that this parser does not know."""
        if any(isinstance(a, argparse._SubParsersAction) for a in self._actions):
            return []  # the flags belong to a subcommand, not to this parser
        known = set(self.option_strings())
        argv = getattr(self, "_argv", [])
        argv = argv[: argv.index("--")] if "--" in argv else argv
        return [a for a in argv if a.startswith("--") and a.split("=", 1)[0] not in known]

    def error(self, message: str) -> NoReturn:
        """Print ``PROG: error: MESSAGE`` and where to read more; exit with status 2."""
        unknown = self.unknown_flags()
        if message.startswith("the following arguments are required") and unknown:
            message = "unrecognized arguments: " + " ".join(unknown)  # the likely cause
        self.exit(
            USER_ERROR_EXIT,
            f"{self.prog}: error: {explain(message, self.option_strings(), self.aliases)}\n"
            f"see `{help_command(self.prog)}`\n",
        )


def command_parser(prog: str, doc: str | None) -> ArgumentParser:
    """A command's parser: ``doc`` (its module's docstring) as the description, printed as
    written, above the flags."""
    return ArgumentParser(
        prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )


def help_command(prog: str) -> str:
    """The command that prints ``prog``'s help (``python pretrain/main.py --help``)."""
    if prog.endswith(".py") and not prog.startswith(("python", "deepspeed")):
        prog = f"python {prog}"
    return f"{prog} --help"


def suggest(word: str, choices: Iterable[str]) -> str | None:
    """The choice ``word`` was probably meant to be: one it abbreviates, else the closest."""
    choices = list(choices)
    longer = [c for c in choices if c.startswith(word) and c != word]
    if len(longer) == 1:
        return longer[0]
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return close[0] if close else None


def explain(message: str, options: Iterable[str], aliases: Mapping[str, str] | None = None) -> str:
    """argparse's message, reduced to the one offending flag with a "did you mean" (``aliases``:
    a flag's known other names first, then the closest spelling)."""
    if message.startswith("unrecognized arguments: "):
        extras = message.removeprefix("unrecognized arguments: ").split()
        bad = next((x for x in extras if x.startswith("-") and x != "--"), extras[0])
        if not bad.startswith("-"):
            return f"unexpected argument {bad!r} (a value without its flag, or one value too many)"
        flag = bad.split("=", 1)[0]
        guess = (aliases or {}).get(flag) or suggest(flag, options)
        if guess is None:
            return f"unrecognized argument {flag}"
        if guess.startswith(flag):
            return (
                f"unrecognized argument {flag}; did you mean {guess}? (flags are not abbreviated)"
            )
        return f"unrecognized argument {flag}; did you mean {guess}?"
    m = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)$", message)
    if m:
        guess = suggest(m.group(1), re.findall(r"'([^']*)'", m.group(2)))
        if guess is not None:
            return f"{message}; did you mean {guess!r}?"
    return message


# -- flags from dataclass fields ----------------------------------------------------------------


def opt(
    default: Any = dataclasses.MISSING,
    help: str = "",
    *,
    factory: Callable[[], Any] | Any = dataclasses.MISSING,
    **flag: Any,
) -> Any:
    """A dataclass field documented for its flag: ``x: int = opt(3, "what x does")``.

    ``help`` is the flag's --help text (``%(default)s`` works as in argparse). Other keywords
    shape the flag: ``flags=("--input",)`` (its spellings), ``exclusive="name"`` (a mutually
    exclusive group), ``negatable=True`` or a help text (a ``--no_<name>`` flag too),
    ``default_text="..."`` (where an unset default comes from, shown once in --help),
    ``cli_default=callable`` (the command line's default, when it differs from the field's),
    ``help_choices=callable`` (the names a registry holds when the parser is built, listed in
    --help: the registry stays the one list),
    and anything ``add_argument`` takes (``choices``, ``metavar``, ``nargs``, ``const``, ``type``).
    """
    metadata = {"help": help, "flag": flag}
    if factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def field_help(cls: type) -> dict[str, str]:
    """Field name -> its documented help (from :func:`opt`'s metadata; "" when undocumented)."""
    return {f.name: f.metadata.get("help", "") for f in dataclasses.fields(cls)}


def base_type(tp: Any) -> tuple[Any, bool]:
    """(scalar type, optional?) for ``int | None``, ``str``, ``float``, ``bool`` annotations."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return base_type(args[0])[0], True
        return str, True
    return tp, False


def field_default(f: dataclasses.Field) -> Any:
    """The field's default value (its factory called), or None for a required field."""
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def str2bool(v: str) -> bool:
    """``--flag true|false`` (1/0, yes/no, on/off too)."""
    if v.lower() in ("1", "true", "yes", "on"):
        return True
    if v.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false, got {v!r}")


def checked(normalize: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argparse ``type`` from a function that raises ValueError with a good message."""

    def convert(value: str) -> Any:
        try:
            return normalize(value)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from e

    convert.__name__ = getattr(normalize, "__name__", "value")
    return convert


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def add_fields(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    cls: type,
    *,
    exclude: Iterable[str] = (),
    dests: Mapping[str, str] | None = None,
    spellings: Mapping[str, list[str]] | None = None,
    track_given: bool = False,
) -> None:
    """One flag per field of dataclass ``cls`` (fields holding a dataclass: one per its fields).

    ``dests`` renames a field's destination (and so its flag, ``--<dest>``), ``spellings`` gives
    a destination other flag strings. With ``track_given`` every argparse default is None, so
    that "given" and "not given" stay apart, the field's default is written into the help once,
    and a bool is ``--flag [true|false]``; without it flags default to the field's value and a
    bool is ``--flag`` (``store_true``).
    """
    exclude, hints, groups = set(exclude), _hints(cls), {}
    for f in dataclasses.fields(cls):
        if f.name in exclude:
            continue
        tp, _optional = base_type(hints[f.name])
        if dataclasses.is_dataclass(tp):
            add_fields(
                parser,
                tp,
                exclude=exclude,
                dests=dests,
                spellings=spellings,
                track_given=track_given,
            )
            continue
        meta = dict(f.metadata.get("flag", {}))
        dest = (dests or {}).get(f.name, f.name)
        flags = list(meta.pop("flags", None) or (spellings or {}).get(dest) or [f"--{dest}"])
        target = parser
        if "exclusive" in meta:
            name = meta.pop("exclusive")
            if name not in groups:
                groups[name] = parser.add_mutually_exclusive_group()
            target = groups[name]
        text = f.metadata.get("help", "")
        if "help_choices" in meta:
            text = f"{text} (one of: {', '.join(meta.pop('help_choices')())})".strip()
        spec = _FlagSpec(f, tp, dest, flags, meta, text)
        (_add_given if track_given else _add_valued)(target, spec)


@dataclasses.dataclass
class _FlagSpec:
    field: dataclasses.Field
    type: Any
    dest: str
    flags: list[str]
    meta: dict[str, Any]
    help: str


def _add_valued(parser, s: _FlagSpec) -> None:
    """A flag whose default is the field's (data_prep's style)."""
    meta, f = s.meta, s.field
    negation = meta.pop("negatable", None)
    cli_default = meta.pop("cli_default", None)
    default_text = meta.pop("default_text", None)
    default = cli_default() if cli_default is not None else field_default(f)
    required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    shown = _shown_default(s.help, default, default_text, required, s.type is bool)
    kw: dict[str, Any] = {"dest": s.dest, "help": f"{s.help} {shown}".strip(), **meta}
    if s.type is bool:
        if negation is not None:  # --x / --no_x, exclusive, unset = the field's default
            group = parser.add_mutually_exclusive_group()
            group.add_argument(*s.flags, action="store_true", default=default, **kw)
            neg_help = negation if isinstance(negation, str) else None
            group.add_argument(f"--no_{s.dest}", dest=s.dest, action="store_false", help=neg_help)
        else:
            parser.add_argument(*s.flags, action="store_true", **kw)
        return
    origin = typing.get_origin(s.type)
    if origin in (list, tuple):
        kw.setdefault("nargs", "+")
        elem = typing.get_args(s.type)[0]
        if elem is not str:
            kw.setdefault("type", elem)
    elif s.type is not str:
        kw.setdefault("type", s.type)
    if required:
        kw["required"] = True
    else:
        kw["default"] = default
    parser.add_argument(*s.flags, **kw)


def _shown_default(
    help: str, value: Any, default_text: str | None, required: bool, flag: bool
) -> str:
    """What --help adds after a flag's text: its default (or "(required)"); nothing when the
    text already says it (``%(default)s``, or "(default..." in its own words)."""
    if "%(default)" in help or "(default" in help:
        return ""
    if required:
        return "(required)"
    if default_text is not None:
        return f"(default: {default_text})"
    if flag:
        return "(default: on)" if value else "(default: off)"
    if isinstance(value, (list, tuple)):
        value = " ".join(map(str, value)) or "none"
    return "(default: none)" if value is None else f"(default: {value})"


def _add_given(parser, s: _FlagSpec) -> None:
    """A flag whose argparse default is None ("not given"); its real default shown in --help."""
    meta, f = s.meta, s.field
    negation = meta.pop("negatable", None)
    default_text = meta.pop("default_text", None)
    if meta.pop("required", False):  # shown, not enforced: the caller checks it (or reports it)
        shown = "(required)"
    elif default_text is not None:
        shown = f"(default: {default_text})"
    else:
        value = field_default(f)
        shown = f"(default: {value!r})" if value == "" else f"(default: {value})"
        if value is None:  # Python's None means nothing to a user of the command line
            shown = "(default: unset)"
    kw: dict[str, Any] = {"dest": s.dest, "default": None, "help": f"{s.help} {shown}"}
    if typing.get_origin(s.type) is list:  # one or more values after the flag
        kw.update(nargs="+", type=typing.get_args(s.type)[0])
        kw["metavar"] = s.flags[0].lstrip("-").upper()
    elif s.type is bool:
        kw.update(nargs="?", const=True, type=str2bool)
    elif s.type in (int, float, str):
        kw["type"] = s.type
    else:  # tuples / dicts: JSON on the command line
        kw.update(type=json.loads, help=kw["help"] + " [JSON]")
    parser.add_argument(*s.flags, **{**kw, **meta})
    if s.type is bool and negation is not None:
        neg_help = negation if isinstance(negation, str) else f"turn --{s.dest} off"
        parser.add_argument(
            f"--no_{s.dest}", dest=s.dest, action="store_const", const=False, help=neg_help
        )


def from_args(cls: type, ns: argparse.Namespace, **given: Any) -> Any:
    """An instance of dataclass ``cls`` from parsed flags (as :func:`add_fields` made them):
    each field takes its flag's value, a nested dataclass is built the same way, a field without
    a flag keeps its default; ``given`` values win."""
    hints, values = _hints(cls), {}
    for f in dataclasses.fields(cls):
        tp, _ = base_type(hints[f.name])
        if f.name in given:
            values[f.name] = given[f.name]
        elif dataclasses.is_dataclass(tp):
            values[f.name] = from_args(tp, ns)
        elif hasattr(ns, f.name):
            v = getattr(ns, f.name)
            values[f.name] = tuple(v) if typing.get_origin(tp) is tuple and v is not None else v
    return cls(**values)
